"""DiviML's splitting heuristic: exact solves of small windows of the graph, the rest held fixed.

1. Communities by modularity (Louvain, seeded, with exact gains: ``louvain.py``) on the undirected
   graph weighted by transfer time: kernels that exchange big tensors end up together, so the cuts
   between modules are cheap.
2. Modules: a topological order that keeps each community's kernels together (Kahn's algorithm that
   stays in the current community while it can), cut where the community changes or a module reaches
   ``module_size``. Contiguous pieces of a topological order always form an acyclic quotient.
3. Forward pass: each module is solved with the modules before it fixed (finish times of placed
   producers are release times) and ``tails`` (the least work that must follow a kernel outside
   the module: bottom levels at fastest-device times) keeping it from ending critical kernels late.
   A module's solution is kept only when it beats the list schedule of the best heuristic's devices
   for it, and the whole plan only when it beats the best heuristic's plan.
4. Improvement sweeps (an LNS): windows of ``module_size`` kernels along the plan's start order, each
   overlapping the next by half, are re-solved with the kernels before the window fixed and those
   after it keeping their devices and run order. Their part of the makespan is a per-device tail of
   each window kernel (``plan_tails``: the longest path from a successor, or from the next kernel on
   the device, to the plan's end). A change is kept only when the simulator says the whole plan got
   faster; sweeps repeat until one improves nothing or time runs out.

Backends for the windows:
- ``cpsat`` (default): ``cpsat.tick_model`` over the window, in one OR-Tools process for the whole
  run (``CpsatSession``). Every fixed kernel's run is a fixed interval on its device, so window
  kernels may fill idle gaps between fixed ones; the plan's run order is then by start time.
  Without OR-Tools installed, split says so in the log and uses HiGHS.
- ``highs``/``cbc``: the MILP of ``milp.LatencyModel``. A device is busy until its last fixed kernel
  ends (big-M disjunctions cannot see gaps), so each window runs after the kernels before it, and
  each kernel gets its least tail over devices.

Choices, measured on paper-node with roofline costs (random DAGs of 12-32 kernels, randwire graphs
of 141-150 kernels, inception_v3, a 2,000-kernel random DAG; numbers in the task report):
- CP-SAT windows: with HiGHS nearly every 16-kernel window ran into its time limit and the plan
  often equalled HEFT's; CP-SAT proves most windows in a fraction of a second.
- ``module_size=32``: a graph of at most 32 kernels is one window, the exact model, which CP-SAT
  solves to the optimum in 1-3.5 s (all 15 random DAGs tried); 24 missed one of them by 0.3%, 16 by
  up to 4%. On the 120-150-kernel graphs 32 was best or equal, and 2-4x slower than 16.
- ``module_time_limit_s=2`` for a module, half of it for an improvement window (which starts from
  the plan itself and either improves quickly or not at all): 2 s for both gave no better plans.
- ``workers=2``: one CP-SAT worker got stuck 1-10% above the best on some windows whatever its seed
  or restarts; two workers never did (``cpsat_worker`` runs one alone first, for reproducibility).
- The forward pass before the sweeps, rather than sweeps from the best heuristic's plan: equal on
  three graphs of four, 0.6% better on randwire_ba, 0.03% worse on randwire_er.
- Tails from the plan, per device, in the sweeps: windows with bottom-level tails improved randwire
  plans only now and then. A second solve that ended kernels off the critical path early (keeping
  the makespan) cost time and gained nothing, so there is none.

The plan's value is the simulator's. Window bounds are not bounds of the whole problem, so the plan
carries none (the report adds the problem's own bounds). Determinism: a run whose windows are all
proven by CP-SAT's single-worker phase (always, with ``workers=1``) is reproducible for its seed; a
window cut by the clock, or proven only by the parallel phase, may make another plan.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import time
from collections import defaultdict

from ..errors import DivimlInputError
from ..plan import Plan
from ..simulator import simulate
from .base import Problem, Solver
from .cpsat import CpsatSession
from .louvain import louvain
from .milp import BACKENDS as MILP_BACKENDS
from .milp import (
    Context,
    LatencyModel,
    Milp,
    WindowSolution,
    best_heuristic,
    list_schedule,
    order_by_start,
    reachability,
)

log = logging.getLogger(__name__)

BACKENDS = ("cpsat", *MILP_BACKENDS)
LOUVAIN_SCALE = 10**6            # edge weights in millionths of the largest: integers for exact gains
IMPROVEMENT_SHARE = 0.5          # of the window time limit, for a window of the improvement sweeps


def communities(problem: Problem, seed: int) -> dict[str, int]:
    """Kernel -> community id, by Louvain modularity on edges weighted by mean transfer time (in
    integer millionths of the largest, each edge at least 1: ``louvain`` compares gains exactly)."""
    graph, costs, devices = problem.graph, problem.costs, problem.platform.device_names
    pairs = [(a, b) for a in devices for b in devices if a != b] or [(devices[0], devices[0])]
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    for edge in graph.edges:
        seconds[min(edge.src, edge.dst), max(edge.src, edge.dst)] += \
            sum(costs.transfer_s(edge.bytes, a, b) for a, b in pairs) / len(pairs)
    largest = max(seconds.values(), default=0.0) or 1.0
    weights = {pair: max(1, round(s / largest * LOUVAIN_SCALE)) for pair, s in seconds.items()}
    found = louvain(graph.topo_order, weights, seed)
    return {kernel: index for index, members in enumerate(found) for kernel in members}


def modules(problem: Problem, community: dict[str, int], module_size: int) -> list[list[str]]:
    """Contiguous pieces of a community-keeping topological order, at most ``module_size`` each."""
    graph = problem.graph
    indegree = {k: len(graph.pred[k]) for k in graph.kernels}
    ready: dict[int, list[str]] = defaultdict(list)
    for kernel in graph.topo_order:
        if indegree[kernel] == 0:
            ready[community[kernel]].append(kernel)
    pieces: list[list[str]] = []
    current: list[str] = []
    here = None
    while any(ready.values()):
        if here is None or not ready[here]:
            here = min((c for c, members in ready.items() if members),
                       key=lambda c: graph.position[ready[c][0]])
        kernel = ready[here].pop(0)
        if current and (community[current[-1]] != here or len(current) >= module_size):
            pieces.append(current)
            current = []
        current.append(kernel)
        for edge in graph.succ[kernel]:
            indegree[edge.dst] -= 1
            if indegree[edge.dst] == 0:
                bucket = ready[community[edge.dst]]
                bucket.append(edge.dst)
                bucket.sort(key=graph.position.__getitem__)
    if current:
        pieces.append(current)
    return _merge_small(pieces, module_size)


def _merge_small(pieces: list[list[str]], module_size: int) -> list[list[str]]:
    """Neighbouring pieces merge while they fit: fewer, fuller windows see more of the trade-offs."""
    merged: list[list[str]] = []
    for piece in pieces:
        if merged and len(merged[-1]) + len(piece) <= module_size:
            merged[-1].extend(piece)
        else:
            merged.append(list(piece))
    return merged


def bottom_levels(problem: Problem) -> dict[str, float]:
    """Per kernel: the longest path from it to the end, at fastest-device times, communication free."""
    graph, level = problem.graph, {}
    for kernel in reversed(graph.topo_order):
        fastest = min(problem.costs.compute_s(kernel, d) for d in problem.feasible_devices(kernel))
        level[kernel] = fastest + max((level[e.dst] for e in graph.succ[kernel]), default=0.0)
    return level


def tails(problem: Problem, window: list[str], bottom: dict[str, float]) -> dict[str, float]:
    """Per window kernel: the least work that must follow it outside the window."""
    inside = set(window)
    return {k: max((bottom[e.dst] for e in problem.graph.succ[k] if e.dst not in inside), default=0.0)
            for k in window}


def by_start(graph, kernels: list[str], start_s: dict[str, float]) -> list[str]:
    """``kernels`` in the order a schedule ran them (ties by position): a topological order, and the
    order in which a list schedule of that schedule's devices comes closest to it."""
    return sorted(kernels, key=lambda k: (start_s[k], graph.position[k]))


def fixed_context(problem: Problem, assignment: dict[str, str], start_s: dict[str, float],
                  finish_s: dict[str, float], kernels) -> tuple[Context, dict[str, float]]:
    """``kernels`` fixed where and when they run: a Context (each device ready after its last one)
    and their start times (their busy intervals, for the cpsat backend)."""
    context = Context({k: assignment[k] for k in kernels}, {k: finish_s[k] for k in kernels})
    for kernel in kernels:
        device = assignment[kernel]
        context.device_ready_s[device] = max(context.device_ready_s.get(device, 0.0), finish_s[kernel])
    return context, {k: start_s[k] for k in kernels}


class WindowSolver:
    """Solves the windows of one split run with one backend, sharing the time left among them."""

    def __init__(self, problem: Problem, backend: str, session: CpsatSession | None, *, deadline: float,
                 window_time_limit_s: float, seed: int):
        self.problem, self.backend, self.session = problem, backend, session
        self.deadline, self.window_time_limit_s, self.seed = deadline, window_time_limit_s, seed
        self.descendants = reachability(problem) if backend != "cpsat" else None
        self.solved = self.proven = 0

    def solve(self, window: list[str], context: Context, fixed_start_s: dict[str, float],
              tail: dict[str, float | dict[str, float]], hint: WindowSolution, windows_left: int,
              share: float = 1.0) -> WindowSolution | None:
        """The window's best schedule found, or None (no time left, or the backend found none), in at
        most ``share`` of the window time limit and an even share of the time left."""
        remaining = self.deadline - time.perf_counter()
        if remaining <= 0:
            return None
        limit = min(share * self.window_time_limit_s, remaining / max(windows_left, 1))
        try:
            if self.session is not None:
                solution = self.session.solve_window(self.problem, window, context, fixed_start_s=fixed_start_s,
                                                     tail_s=tail, hint=hint, time_limit_s=limit)
            else:
                model = LatencyModel(self.problem, window, context, backend=self.backend,
                                     descendants=self.descendants, upper_bound_s=hint.objective_s, tie_break=True,
                                     tail_s=tail)
                model.warm_start(hint.assignment, hint.start_s, hint.objective_s)
                solution = model.solve(limit, seed=self.seed)
        except DivimlInputError as error:          # e.g. a co-location group left without a device
            log.debug("split: window of %d kernels skipped: %s", len(window), error)
            return None
        self.solved += 1
        self.proven += bool(solution is not None and solution.optimal)
        return solution

    @property
    def sees_gaps(self) -> bool:
        """Whether window kernels may run in gaps between fixed ones (then order by start alone)."""
        return self.session is not None


class Split(Solver):
    """The splitting heuristic (module docstring). ``module_size``: kernels per module and window;
    ``module_time_limit_s``: solver seconds per module (half that per improvement window), never
    more than an even share of the time left; ``improve``: run the improvement sweeps; ``backend``:
    cpsat, highs or cbc; ``workers``: CP-SAT's threads; ``session``: an open CP-SAT session to solve
    in (a caller that solves many small problems saves OR-Tools' start-up for each)."""

    name = "split"
    objectives = ("latency", "throughput")

    def __init__(self, *, time_limit_s: float = 60.0, seed: int = 0, module_size: int = 32,
                 module_time_limit_s: float = 2.0, improve: bool = True, backend: str = "cpsat",
                 workers: int = 2, session: CpsatSession | None = None):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        self.session = session
        if module_size < 2:
            raise DivimlInputError("module_size must be at least 2", field="module_size")
        if backend not in BACKENDS:
            raise DivimlInputError(f"unknown split backend '{backend}'", field="backend",
                                   hint=f"use one of {', '.join(BACKENDS)}")
        if workers < 1:
            raise DivimlInputError("workers must be at least 1", field="workers")
        self.module_size, self.module_time_limit_s = module_size, module_time_limit_s
        self.improve, self.backend, self.workers = improve, backend, workers

    def solve(self, problem: Problem) -> Plan:
        self.check_objective(problem)
        if problem.objective == "throughput":             # windows of the throughput MILP (HiGHS unless cbc)
            from .throughput import split_throughput

            return split_throughput(problem, time_limit_s=self.time_limit_s, seed=self.seed,
                                    module_size=self.module_size, module_time_limit_s=self.module_time_limit_s,
                                    backend="cbc" if self.backend == "cbc" else "highs")
        began = time.perf_counter()
        problem.validate()
        backend = self.backend
        weaker = None
        if backend == "cpsat" and importlib.util.find_spec("ortools") is None:
            weaker = ("OR-Tools is not installed: split solved its windows with the MILP, not CP-SAT (plans up "
                      "to 13% worse on 32-kernel DAGs); pip install ortools")
            log.warning("split: %s", weaker)
            backend = "highs"
        if backend != "cpsat":
            opened = contextlib.nullcontext()
        elif self.session is not None:
            opened = contextlib.nullcontext(self.session)
        else:
            opened = CpsatSession(workers=self.workers, seed=self.seed)
        with opened as session:
            windows = WindowSolver(problem, backend, session, deadline=began + self.time_limit_s,
                                   window_time_limit_s=self.module_time_limit_s, seed=self.seed)
            plan = self._solve(problem, windows)
        plan.solve_s = time.perf_counter() - began
        plan.attrs.update({"module_size": self.module_size, "split_backend": backend,
                           "windows_solved": windows.solved, "windows_proven": windows.proven})
        if weaker:
            plan.attrs["weaker_method"] = weaker
        return plan

    def _solve(self, problem: Problem, windows: WindowSolver) -> Plan:
        graph = problem.graph
        pieces = modules(problem, communities(problem, self.seed), self.module_size)
        log.info("split: %d kernels in %d modules of at most %d", len(graph), len(pieces), self.module_size)
        fallback = best_heuristic(problem)
        if fallback is None:        # the list schedules found no room: the exact model (or its proof) starts it
            log.info("split: no heuristic plan fits memory; the MILP gives the starting plan")
            fallback = Milp(time_limit_s=max(windows.deadline - time.perf_counter(), 1.0), seed=self.seed).solve(problem)
        improving = self.improve and len(graph) > self.module_size
        sweep = len(improvement_windows(len(graph), self.module_size)) if improving else 0
        plan, value = self._forward(problem, pieces, fallback, windows, sweep)
        if fallback.value_s < value:
            plan, value = Plan(dict(fallback.assignment), objective="latency", mode="latency",
                               order={d: list(v) for d, v in fallback.order.items()}, solver=self.name), fallback.value_s
            plan.attrs["started_from"] = fallback.solver
        improved = 0
        if improving:
            plan, value, improved = self._improve(problem, plan, value, windows)
        plan.value_s = value
        plan.attrs.update({"modules": len(pieces), "improvements": improved})
        return plan

    def _forward(self, problem: Problem, pieces: list[list[str]], fallback: Plan, windows: WindowSolver,
                 later_windows: int) -> tuple[Plan, float]:
        """Each module in turn, with those before it fixed; the plan and its simulated latency."""
        graph = problem.graph
        bottom = bottom_levels(problem)
        fallback_start = simulate(graph, problem.platform, problem.costs, fallback).start_s
        assignment: dict[str, str] = {}
        finish: dict[str, float] = {}
        start: dict[str, float] = {}
        for index, piece in enumerate(pieces):
            context, fixed_start = fixed_context(problem, assignment, start, finish, list(assignment))
            tail = tails(problem, piece, bottom)
            piece = by_start(graph, piece, fallback_start)
            heuristic = list_schedule(problem, piece, context, fallback.assignment, tail)
            solution = windows.solve(piece, context, fixed_start, tail, heuristic,
                                     windows_left=len(pieces) - index + later_windows)
            if solution is None or solution.objective_s > heuristic.objective_s:
                solution = heuristic              # no time left, or the solver did no better: the heuristic's choice
            assignment.update(solution.assignment)
            start.update(solution.start_s)
            finish.update(solution.finish_s)
        phase = None if windows.sees_gaps else {k: index for index, piece in enumerate(pieces) for k in piece}
        plan = Plan(assignment, objective="latency", mode="latency",
                    order=order_by_start(graph, assignment, start, phase), solver=self.name)
        sim = simulate(graph, problem.platform, problem.costs, plan)
        return plan, sim.value_s if sim.feasible else float("inf")

    def _improve(self, problem: Problem, plan: Plan, value: float, windows: WindowSolver) -> tuple[Plan, float, int]:
        """Sweeps of overlapping windows along the plan's start order until a sweep improves nothing:
        each window re-solved with the kernels before it fixed and those after it keeping their devices
        and order (their tails), kept when the simulator says the whole plan got faster."""
        graph = problem.graph
        spans = improvement_windows(len(graph), self.module_size)
        improved = 0
        sim = simulate(graph, problem.platform, problem.costs, plan)
        while True:
            before_sweep = improved
            for index, (first, last) in enumerate(spans):
                if time.perf_counter() >= windows.deadline:
                    return plan, value, improved
                order = by_start(graph, list(graph.kernels), sim.start_s)
                before, window, after = order[:first], order[first:last], order[last:]
                context, fixed_start = fixed_context(problem, plan.assignment, sim.start_s, sim.finish_s, before)
                tail = plan_tails(problem, plan, sim, window, after)
                hint = WindowSolution({k: plan.assignment[k] for k in window}, {k: sim.start_s[k] for k in window},
                                      {k: sim.finish_s[k] for k in window}, sim.value_s, 0.0, False)
                if not windows.sees_gaps:        # the MILP takes one tail per kernel: the least is valid
                    tail = {k: min(by_device.values(), default=0.0) for k, by_device in tail.items()}
                solution = windows.solve(window, context, fixed_start, tail, hint, windows_left=len(spans) - index,
                                         share=IMPROVEMENT_SHARE)
                if solution is None:
                    continue
                assignment = {**plan.assignment, **solution.assignment}
                start = {**sim.start_s, **solution.start_s}
                # Kernels after the window run after it on each device; before it, by start when windows see gaps.
                inner = 0 if windows.sees_gaps else 1
                phase = {kernel: 0 if i < first else inner if i < last else 2 for i, kernel in enumerate(order)}
                candidate = Plan(assignment, objective="latency", mode="latency",
                                 order=order_by_start(graph, assignment, start, phase), solver=self.name)
                candidate_sim = simulate(graph, problem.platform, problem.costs, candidate)
                if candidate_sim.feasible and candidate_sim.value_s < value * (1 - 1e-9):
                    plan, sim, value, improved = candidate, candidate_sim, candidate_sim.value_s, improved + 1
            if improved == before_sweep:
                return plan, value, improved


def improvement_windows(kernels: int, size: int) -> list[tuple[int, int]]:
    """[first, last) spans of ``size`` along an order of ``kernels``, each overlapping the next by half."""
    step = max(size // 2, 1)
    firsts = list(range(0, max(kernels - size, 0) + 1, step))
    if firsts[-1] + size < kernels:
        firsts.append(kernels - size)
    return [(first, min(first + size, kernels)) for first in firsts]


def plan_tails(problem: Problem, plan: Plan, sim, window: list[str], after: list[str]) -> dict[str, dict[str, float]]:
    """Per window kernel and device it may run on: the least time from its end to the plan's end,
    when the kernels ``after`` the window keep their devices and run order. A successor s costs
    the transfer to it plus q(s), the longest path from s's start to the end through its graph
    successors, the next kernel on its device and its output's trip home; on a device, a window
    kernel also precedes the first kernel of ``after`` there."""
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    where = plan.assignment
    later = set(after)
    ordered = by_start(graph, after, sim.start_s)
    next_on: dict[str, str] = {}
    first_on: dict[str, str] = {}
    for kernel in reversed(ordered):
        device = where[kernel]
        if device in first_on:
            next_on[kernel] = first_on[device]
        first_on[device] = kernel
    q: dict[str, float] = {}
    for kernel in reversed(ordered):       # successors and device successors start later
        device = where[kernel]
        out = graph.kernels[kernel].output_bytes
        home = costs.transfer_s(out, device, host) if kernel in graph.output_set and out > 0 and device != host else 0.0
        q[kernel] = costs.compute_s(kernel, device) + max(
            [home, q.get(next_on.get(kernel), 0.0),
             *(q[e.dst] + (costs.transfer_s(e.bytes, device, where[e.dst]) if where[e.dst] != device else 0.0)
               for e in graph.succ[kernel] if e.dst in later)])
    out: dict[str, dict[str, float]] = {}
    for kernel in window:
        out[kernel] = {}
        for device in problem.feasible_devices(kernel):
            out[kernel][device] = max(
                [q[first_on[device]] if device in first_on else 0.0,
                 *(q[e.dst] + (costs.transfer_s(e.bytes, device, where[e.dst]) if where[e.dst] != device else 0.0)
                   for e in graph.succ[kernel] if e.dst in later)])
    return out
