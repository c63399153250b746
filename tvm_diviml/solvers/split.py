"""DiviML's splitting heuristic: Louvain communities cut into modules of at most ``module_size`` kernels
in topological order, each solved exactly with the modules before it fixed (latency: CP-SAT windows, or
the latency MILP; throughput: the period MILP), then sweeps of overlapping windows re-solved while the
simulator says the whole plan improves. It never returns worse than the best heuristic it started
from (docs/solvers.md#split).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import time

from ..errors import DivimlInputError
from ..plan import Plan, better_of
from ..problem import Problem
from ..simulator import simulate
from ..tolerances import improves
from ..toolkit.communities import communities, improvement_windows, modules
from ..toolkit.constraints import default_reserve
from ..toolkit.cpsat_session import CpsatSession
from ..toolkit.deadline import Deadline
from ..toolkit.heuristics import best_heuristic
from ..toolkit.latency_model import LatencyModel
from ..toolkit.list_scheduling import greedy_throughput
from ..toolkit.mip_backend import BACKENDS as MILP_BACKENDS
from ..toolkit.series import devices_short_of_the_model, series_plan
from ..toolkit.throughput_model import ThroughputModel, score, throughput_plan
from ..toolkit.windows import Context, WindowSolution, list_schedule, order_by_start, reachability
from .base import Solver
from .cpsat import Cpsat
from .milp import Milp, exact_throughput

log = logging.getLogger(__name__)

BACKENDS = ("cpsat", *MILP_BACKENDS)
IMPROVEMENT_SHARE = 0.5  # of the window time limit, for a window of the improvement sweeps
# Split's windows stop after this many branch-and-bound nodes. On inception_v3 (paper-node, roofline)
# windows cut by the clock alone made plans that differed from run to run (periods within 0.03%);
# with 200 nodes (or 1,000) every run made the same plan, within 0.03% of the best clock-cut run, in
# 17-26 s against 26-30 s (a shared two-core machine).
WINDOW_NODES = 200


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
    return {k: max((bottom[e.dst] for e in problem.graph.succ[k] if e.dst not in inside), default=0.0) for k in window}


def by_start(graph, kernels: list[str], start_s: dict[str, float]) -> list[str]:
    """``kernels`` in the order a schedule ran them (ties by position): a topological order, and the
    order in which a list schedule of that schedule's devices comes closest to it."""
    return sorted(kernels, key=lambda k: (start_s[k], graph.position[k]))


def fixed_context(
    problem: Problem, assignment: dict[str, str], start_s: dict[str, float], finish_s: dict[str, float], kernels
) -> tuple[Context, dict[str, float]]:
    """``kernels`` fixed where and when they run: a Context (each device ready after its last one)
    and their start times (their busy intervals, for the cpsat backend)."""
    context = Context({k: assignment[k] for k in kernels}, {k: finish_s[k] for k in kernels})
    for kernel in kernels:
        device = assignment[kernel]
        context.device_ready_s[device] = max(context.device_ready_s.get(device, 0.0), finish_s[kernel])
    return context, {k: start_s[k] for k in kernels}


class WindowSolver:
    """Solves the windows of one split run with one backend, sharing the time left among them."""

    def __init__(
        self,
        problem: Problem,
        backend: str,
        session: CpsatSession | None,
        *,
        deadline: float,
        window_time_limit_s: float,
        seed: int,
    ):
        self.problem, self.backend, self.session = problem, backend, session
        self.deadline, self.window_time_limit_s, self.seed = deadline, window_time_limit_s, seed
        self.descendants = reachability(problem) if backend != "cpsat" else None
        self.solved = self.proven = 0

    def solve(
        self,
        window: list[str],
        context: Context,
        fixed_start_s: dict[str, float],
        tail: dict[str, float | dict[str, float]],
        hint: WindowSolution,
        windows_left: int,
        share: float = 1.0,
    ) -> WindowSolution | None:
        """The window's best schedule found, or None (no time left, or the backend found none), in at
        most ``share`` of the window time limit and an even share of the time left."""
        remaining = self.deadline - time.perf_counter()
        if remaining <= 0:
            return None
        limit = min(share * self.window_time_limit_s, remaining / max(windows_left, 1))
        try:
            if self.session is not None:
                solution = self.session.solve_window(
                    self.problem,
                    window,
                    context,
                    fixed_start_s=fixed_start_s,
                    tail_s=tail,
                    hint=hint,
                    time_limit_s=limit,
                )
            else:
                model = LatencyModel(
                    self.problem,
                    window,
                    context,
                    backend=self.backend,
                    descendants=self.descendants,
                    upper_bound_s=hint.objective_s,
                    tie_break=True,
                    tail_s=tail,
                )
                model.warm_start(hint.assignment, hint.start_s, hint.objective_s)
                solution = model.solve(limit, seed=self.seed)
        except DivimlInputError as error:  # e.g. a co-location group left without a device
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
    in (a caller that solves many small problems saves OR-Tools' start-up for each); ``series``: with
    CP-SAT, first solve latency by the series decomposition where it is exact (cut kernels), keeping
    modules and windows for graphs without cuts or where a segment stays unproven; ``whole_up_to``:
    graphs of at most this many kernels are then solved whole by CP-SAT from split's plan, in the time
    left (its proof or bound, and any better plan it finds), where its model is exact (memory cannot
    bind, costs without the executor's overheads)."""

    name = "split"
    objectives = ("latency", "throughput")
    modes = ("latency", "period_overlap")

    def __init__(
        self,
        *,
        time_limit_s: float = 60.0,
        seed: int = 0,
        module_size: int = 32,
        module_time_limit_s: float = 2.0,
        improve: bool = True,
        backend: str = "cpsat",
        workers: int = 2,
        session: CpsatSession | None = None,
        series: bool = True,
        whole_up_to: int = 64,
    ):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        self.session, self.series, self.whole_up_to = session, series, whole_up_to
        if module_size < 2:
            raise DivimlInputError("module_size must be at least 2", field="module_size")
        if backend not in BACKENDS:
            raise DivimlInputError(
                f"unknown split backend '{backend}'", field="backend", hint=f"use one of {', '.join(BACKENDS)}"
            )
        if workers < 1:
            raise DivimlInputError("workers must be at least 1", field="workers")
        self.module_size, self.module_time_limit_s = module_size, module_time_limit_s
        self.improve, self.backend, self.workers = improve, backend, workers

    def place(self, problem: Problem, deadline: Deadline) -> Plan:
        if problem.objective == "throughput":  # windows of the throughput MILP (HiGHS unless cbc)
            return split_throughput(
                problem,
                deadline,
                seed=self.seed,
                module_size=self.module_size,
                module_time_limit_s=self.module_time_limit_s,
                backend="cbc" if self.backend == "cbc" else "highs",
            )
        backend = self.backend
        weaker = None
        if backend == "cpsat" and importlib.util.find_spec("ortools") is None:
            weaker = (
                "OR-Tools is not installed: split solved its windows with the MILP, not CP-SAT (plans up "
                "to 13% worse on 32-kernel DAGs); pip install ortools"
            )
            log.warning("split: %s", weaker)
            backend = "highs"
        if backend != "cpsat":
            opened = contextlib.nullcontext()
        elif self.session is not None:
            opened = contextlib.nullcontext(self.session)
        else:
            opened = CpsatSession(workers=self.workers, seed=self.seed)
        with opened as session:
            plan, solved, proven = self._latency(problem, deadline, backend, session)
        plan.attrs.update(
            {
                "module_size": self.module_size,
                "split_backend": backend,
                "windows_solved": solved,
                "windows_proven": proven,
            }
        )
        if weaker:
            plan.attrs["weaker_method"] = weaker
        return plan

    def _latency(
        self, problem: Problem, deadline: Deadline, backend: str, session: CpsatSession | None
    ) -> tuple[Plan, int, int]:
        """The series decomposition where it is exact and proves the optimum, else modules and windows
        (the better of both where a segment stayed unproven); a graph of at most ``whole_up_to`` kernels
        is then solved whole by CP-SAT from that plan. Also the windows solved and proven (a series
        segment is a window too: its kernels solved with the cut before it fixed)."""
        in_series = None
        if session is not None and self.series:
            in_series = series_plan(problem, session, deadline, segment_time_limit_s=self.module_time_limit_s)
        windows = WindowSolver(
            problem,
            backend,
            session,
            deadline=deadline.at,
            window_time_limit_s=self.module_time_limit_s,
            seed=self.seed,
        )
        plan = in_series if in_series is not None and in_series.optimal else self._solve(problem, windows)
        if in_series is not None and plan is not in_series:
            plan = better_of(plan, in_series)
        exact_model = not problem.costs.executor_segments and not devices_short_of_the_model(problem)
        if session is not None and exact_model and not plan.optimal and len(problem.graph) <= self.whole_up_to:
            whole = Cpsat(
                time_limit_s=deadline.left(), seed=self.seed, workers=self.workers, hint=plan, session=session
            ).solve(problem, deadline=deadline)
            plan = better_of(plan, whole)
            plan.attrs["whole_graph"] = whole.attrs.get("cpsat_status")
        segments = in_series.attrs["series"] if in_series is not None else {}
        solved = windows.solved + segments.get("segment_solves", 0)
        return plan, solved, windows.proven + segments.get("segment_solves_proven", 0)

    def _solve(self, problem: Problem, windows: WindowSolver) -> Plan:
        graph = problem.graph
        pieces = modules(problem, communities(problem, self.seed), self.module_size)
        log.info("split: %d kernels in %d modules of at most %d", len(graph), len(pieces), self.module_size)
        fallback = best_heuristic(problem)
        if fallback is None:  # the list schedules found no room: the exact model (or its proof) starts it
            log.info("split: no heuristic plan fits memory; the MILP gives the starting plan")
            fallback = Milp(time_limit_s=max(windows.deadline - time.perf_counter(), 1.0), seed=self.seed).solve(
                problem
            )
        improving = self.improve and len(graph) > self.module_size
        sweep = len(improvement_windows(len(graph), self.module_size)) if improving else 0
        plan, value = self._forward(problem, pieces, fallback, windows, sweep)
        if fallback.value_s < value:
            plan, value = (
                Plan(
                    dict(fallback.assignment),
                    objective="latency",
                    mode="latency",
                    order={d: list(v) for d, v in fallback.order.items()},
                    solver=self.name,
                ),
                fallback.value_s,
            )
            plan.attrs["started_from"] = fallback.solver
        improved = 0
        if improving:
            plan, value, improved = self._improve(problem, plan, value, windows)
        plan.value_s = value
        plan.attrs.update({"modules": len(pieces), "improvements": improved})
        return plan

    def _forward(
        self, problem: Problem, pieces: list[list[str]], fallback: Plan, windows: WindowSolver, later_windows: int
    ) -> tuple[Plan, float]:
        """Each module in turn, with those before it fixed; the plan and its simulated latency."""
        graph = problem.graph
        bottom = bottom_levels(problem)
        fallback_start = simulate(problem, fallback).start_s
        assignment: dict[str, str] = {}
        finish: dict[str, float] = {}
        start: dict[str, float] = {}
        for index, piece in enumerate(pieces):
            context, fixed_start = fixed_context(problem, assignment, start, finish, list(assignment))
            tail = tails(problem, piece, bottom)
            piece = by_start(graph, piece, fallback_start)
            heuristic = list_schedule(problem, piece, context, fallback.assignment, tail)
            solution = windows.solve(
                piece, context, fixed_start, tail, heuristic, windows_left=len(pieces) - index + later_windows
            )
            if solution is None or solution.objective_s > heuristic.objective_s:
                solution = heuristic  # no time left, or the solver did no better: the heuristic's choice
            assignment.update(solution.assignment)
            start.update(solution.start_s)
            finish.update(solution.finish_s)
        phase = None if windows.sees_gaps else {k: index for index, piece in enumerate(pieces) for k in piece}
        plan = Plan(
            assignment,
            objective="latency",
            mode="latency",
            order=order_by_start(graph, assignment, start, phase),
            solver=self.name,
        )
        sim = simulate(problem, plan)
        return plan, sim.value_s if sim.feasible else float("inf")

    def _improve(self, problem: Problem, plan: Plan, value: float, windows: WindowSolver) -> tuple[Plan, float, int]:
        """Sweeps of overlapping windows along the plan's start order until a sweep improves nothing:
        each window re-solved with the kernels before it fixed and those after it keeping their devices
        and order (their tails), kept when the simulator says the whole plan got faster."""
        graph = problem.graph
        spans = improvement_windows(len(graph), self.module_size)
        improved = 0
        sim = simulate(problem, plan)
        while True:
            before_sweep = improved
            for index, (first, last) in enumerate(spans):
                if time.perf_counter() >= windows.deadline:
                    return plan, value, improved
                order = by_start(graph, list(graph.kernels), sim.start_s)
                before, window, after = order[:first], order[first:last], order[last:]
                context, fixed_start = fixed_context(problem, plan.assignment, sim.start_s, sim.finish_s, before)
                tail = plan_tails(problem, plan, sim, window, after)
                hint = WindowSolution(
                    {k: plan.assignment[k] for k in window},
                    {k: sim.start_s[k] for k in window},
                    {k: sim.finish_s[k] for k in window},
                    sim.value_s,
                    0.0,
                    False,
                )
                if not windows.sees_gaps:  # the MILP takes one tail per kernel: the least is valid
                    tail = {k: min(by_device.values(), default=0.0) for k, by_device in tail.items()}
                solution = windows.solve(
                    window, context, fixed_start, tail, hint, windows_left=len(spans) - index, share=IMPROVEMENT_SHARE
                )
                if solution is None:
                    continue
                assignment = {**plan.assignment, **solution.assignment}
                start = {**sim.start_s, **solution.start_s}
                # Kernels after the window run after it on each device; before it, by start when windows see gaps.
                inner = 0 if windows.sees_gaps else 1
                phase = {kernel: 0 if i < first else inner if i < last else 2 for i, kernel in enumerate(order)}
                candidate = Plan(
                    assignment,
                    objective="latency",
                    mode="latency",
                    order=order_by_start(graph, assignment, start, phase),
                    solver=self.name,
                )
                candidate_sim = simulate(problem, candidate)
                if candidate_sim.feasible and improves(candidate_sim.value_s, value):
                    plan, sim, value, improved = candidate, candidate_sim, candidate_sim.value_s, improved + 1
            if improved == before_sweep:
                return plan, value, improved


# ---------------------------------------------------------------------- splitting heuristic
def throughput_start(problem: Problem, deadline: Deadline, *, seed: int, backend: str, solver: str) -> Plan:
    """The greedy throughput plan, or the throughput MILP's where greedy's does not fit memory."""
    greedy = None
    with contextlib.suppress(DivimlInputError):
        greedy = greedy_throughput(problem)
    if greedy is None or not simulate(problem, greedy).feasible:
        log.info("split: the greedy plan does not fit memory; the throughput MILP gives the starting plan")
        greedy = exact_throughput(
            problem, Deadline.after(max(deadline.left(), 1.0)), seed=seed, backend=backend, solver=solver
        )
    return greedy


def split_throughput(
    problem: Problem,
    deadline: Deadline,
    *,
    seed: int = 0,
    module_size: int = 32,
    module_time_limit_s: float = 2.0,
    window_nodes: int | None = WINDOW_NODES,
    backend: str = "highs",
    solver: str = "split",
) -> Plan:
    """Modules forward, then improvement sweeps (module docstring). Each window stops at
    ``window_nodes`` branch-and-bound nodes or its share of the clock, whichever comes first; the
    node limit keeps the run deterministic for a seed wherever the clock does not cut in first."""
    graph = problem.graph
    greedy = throughput_start(problem, deadline, seed=seed, backend=backend, solver=solver)
    reserve = default_reserve(problem)
    pieces = modules(problem, communities(problem, seed), module_size)
    spans = improvement_windows(len(graph), module_size) if len(graph) > module_size else []
    solved = proven = 0

    def solve_window(window: list[str], fixed: dict[str, str], hint: dict[str, str], windows_left: int):
        nonlocal solved, proven
        remaining = deadline.left()
        if remaining <= 0:
            return None
        try:
            model = ThroughputModel(problem, window, fixed, backend=backend, reserve=reserve, tie_break=True)
        except DivimlInputError as error:  # e.g. a co-location group left without a device
            log.debug("split: window of %d kernels skipped: %s", len(window), error)
            return None
        model.warm_start(hint)
        found = model.solve(
            min(module_time_limit_s, remaining / max(windows_left, 1)), seed=seed, max_nodes=window_nodes
        )
        solved += 1
        proven += bool(found is not None and found.optimal)
        return None if found is None else found.assignment

    assignment: dict[str, str] = {}
    for index, piece in enumerate(pieces):
        found = solve_window(piece, assignment, greedy.assignment, len(pieces) - index + len(spans))
        assignment.update(found or {k: greedy.assignment[k] for k in piece})
    plan = throughput_plan(assignment, solver)
    sim = score(problem, plan)
    started_from = "modules"
    if not sim.feasible or greedy.value_s < plan.value_s:
        plan, started_from = throughput_plan(greedy.assignment, solver), "greedy"
        score(problem, plan)
    improvements = 0
    while spans and not deadline.passed():
        before = improvements
        for index, (first, last) in enumerate(spans):
            window = graph.topo_order[first:last]
            fixed = {k: d for k, d in plan.assignment.items() if k not in set(window)}
            found = solve_window(window, fixed, plan.assignment, len(spans) - index)
            if found is None:
                continue
            candidate = throughput_plan({**plan.assignment, **found}, solver)
            candidate_sim = score(problem, candidate)
            if candidate_sim.feasible and improves(candidate.value_s, plan.value_s):
                plan, improvements = candidate, improvements + 1
        if improvements == before:
            break
    plan.attrs.update(
        {
            "modules": len(pieces),
            "module_size": module_size,
            "windows_solved": solved,
            "windows_proven": proven,
            "improvements": improvements,
            "started_from": started_from,
            "greedy_value_s": greedy.value_s,
        }
    )
    return plan


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
    for kernel in reversed(ordered):  # successors and device successors start later
        device = where[kernel]
        out = graph.kernels[kernel].output_bytes
        home = costs.transfer_s(out, device, host) if kernel in graph.output_set and out > 0 and device != host else 0.0
        q[kernel] = costs.compute_s(kernel, device) + max(
            [
                home,
                q.get(next_on.get(kernel), 0.0),
                *(
                    q[e.dst] + (costs.transfer_s(e.bytes, device, where[e.dst]) if where[e.dst] != device else 0.0)
                    for e in graph.succ[kernel]
                    if e.dst in later
                ),
            ]
        )
    out: dict[str, dict[str, float]] = {}
    for kernel in window:
        out[kernel] = {}
        for device in problem.feasible_devices(kernel):
            out[kernel][device] = max(
                [
                    q[first_on[device]] if device in first_on else 0.0,
                    *(
                        q[e.dst] + (costs.transfer_s(e.bytes, device, where[e.dst]) if where[e.dst] != device else 0.0)
                        for e in graph.succ[kernel]
                        if e.dst in later
                    ),
                ]
            )
    return out
