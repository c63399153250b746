"""Throughput placement in the simulator's ``period_overlap`` mode (DESIGN.md "Throughput").

A stream of inputs flows through the plan; transfers overlap compute, so the period is the largest
load of any resource: a device (the seconds of its kernels) or a directed link (the seconds of the
tensors it carries). Everything here is priced as ``simulator._period_overlap`` prices it:

- a tensor crosses to a device once, carrying the largest edge any consumer there reads; a maximum
  of edge prices is a sum of indicator *layers* (the producer's distinct edge sizes b_1 < ... < b_r:
  price = sum_l (c(b_l) - c(b_{l-1})) [a consumer reading >= b_l bytes is there]), which makes the
  MILP exact with one indicator z >= x[v,d] + x[w,e] - 1 per (layer, link, consumer);
- model inputs cross from the host once to each device that reads them; outputs made off the host
  return to it (on top of any copy a consumer on the host receives, as the simulator charges);
- replica groups split the stream by shares (priced by the simulator; ``Replicas`` makes them).

Solvers (every claim is the simulator's value of the plan):

- ``solve_throughput_milp`` (``--solver milp``): ``ThroughputModel`` over the whole graph, warm-started
  from the best heuristic. Proven optimal only when HiGHS proves it and the simulator agrees; the
  bound is ``objective_bound`` (never above the value). Memory is weights once per device plus an
  activation reserve (``milp.solve_within_memory``: the default reserve, none where that leaves
  no plan, then each kernel set that overflowed a device excluded there): where
  memory can bind the model is a restriction, so the plan carries neither bound nor proof.
- ``balance_greedy`` (``--solver greedy``): kernels in topological order, each to the device that
  gives the least period so far (transfers included), ties to the least added load.
- ``split_throughput`` (``--solver split``): split.py's Louvain modules, each solved by a window
  ``ThroughputModel`` with the modules before it fixed (later kernels not yet counted), then sweeps
  of windows with everything else fixed, each kept only when the simulator says the period fell.
- ``Replicas`` (``--solver replicas``): the best of the plain plan, the whole model replicated over
  every device that can hold it (shares proportional to speed, so throughputs add) and the plain
  plan's per-device stages replicated by an LP for shares (links ignored there, then simulated).

Platforms whose transfers go through host memory (``host_staged``) are another problem (msr-fiddle
max-load): these solvers refuse them and point to ``downsets``.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass

import mip

from ..errors import DivimlInputError
from ..plan import Plan, ReplicaGroup
from ..simulator import Simulation, simulate
from .base import Problem, Solver, no_plan_exists
from .constraints import DeviceBudget, default_reserve, place_within_memory
from .milp import (
    PeakCut,
    add_peak_cuts,
    best_heuristic,
    check_backend,
    colocation_leaders,
    new_model,
    solve_within_memory,
)
from .single_device import single_device_plan
from .split import communities, improvement_windows, modules

log = logging.getLogger(__name__)

MODE = "period_overlap"
# Split's windows stop after this many branch-and-bound nodes. On inception_v3 (paper-node, roofline)
# windows cut by the clock alone made plans that differed from run to run (periods within 0.03%);
# with 200 nodes (or 1,000) every run made the same plan, within 0.03% of the best clock-cut run, in
# 17-26 s against 26-30 s (a shared two-core machine).
WINDOW_NODES = 200


def require_period_overlap(problem: Problem, solver: str) -> None:
    """Refuse anything but throughput in ``period_overlap`` mode, naming the solver that does it."""
    if problem.mode == "host_staged":
        raise DivimlInputError(f"solver {solver} places throughput with transfers that overlap compute "
                               f"(period_overlap), but platform '{problem.platform.name}' stages transfers "
                               "through host memory (host_staged)", field="solver",
                               hint="use --solver downsets for host_staged platforms")
    if problem.mode != MODE:
        raise DivimlInputError(f"throughput placement needs objective throughput, not '{problem.objective}'",
                               field="objective", hint="use --objective throughput")


def throughput_plan(assignment: dict[str, str], solver: str, replicas: list[ReplicaGroup] | None = None) -> Plan:
    return Plan(dict(assignment), objective="throughput", mode=MODE, replicas=list(replicas or []), solver=solver)


def score(problem: Problem, plan: Plan) -> Simulation:
    """Simulate ``plan`` and make its claim the simulator's value."""
    sim = simulate(problem.graph, problem.platform, problem.costs, plan)
    plan.value_s = sim.value_s
    return sim


def mean_fastest_s(problem: Problem) -> float:
    """The mean kernel time at its fastest device: the MILPs' time unit (solver tolerances are absolute)."""
    times = [min((problem.costs.compute_s(k, d) for d in problem.feasible_devices(k)), default=0.0)
             for k in problem.graph.kernels]
    unit = sum(t for t in times if math.isfinite(t)) / max(len(times), 1)
    return unit if unit > 0 else 1.0


# ---------------------------------------------------------------------- the exact model
@dataclass
class ThroughputSolution:
    assignment: dict[str, str]       # window kernels only
    period_s: float                  # the model's period (T)
    bound_s: float | None            # a certified lower bound on T (None with tie-break or none found)
    optimal: bool


class ThroughputModel:
    """min T s.t. every device's and link's load <= T, over ``window`` (default: every kernel).

    ``fixed`` places other kernels for good: their loads are constants. Kernels in neither are not
    counted at all (a forward pass that has not reached them yet). ``tie_break`` also minimises,
    slightly, the sum of all loads, so that a window whose period is set elsewhere still leaves room
    (its objective then bounds nothing).
    """

    def __init__(self, problem: Problem, window: list[str] | None = None, fixed: dict[str, str] | None = None, *,
                 backend: str = "highs", reserve: dict[str, float] | None = None, cuts: tuple[PeakCut, ...] = (),
                 tie_break: bool = False):
        self.problem = problem
        graph = problem.graph
        self.window = list(window) if window is not None else list(graph.topo_order)
        self.inside = set(self.window)
        self.fixed = {k: d for k, d in (fixed or {}).items() if k not in self.inside}
        self.covered = self.inside | set(self.fixed)
        self.unit = mean_fastest_s(problem)
        self.tie_break = tie_break
        self.m = m = new_model("throughput", check_backend(backend))
        self.devices = {v: self._devices_for(v) for v in self.window}
        self.x = {(v, d): m.add_var(var_type=mip.BINARY) for v in self.window for d in self.devices[v]}
        self._defined: list[tuple[mip.Var, list]] = []     # indicator -> the expressions it must cover
        self.load: dict[tuple, list] = defaultdict(list)    # ("device", d) or ("link", d, e) -> terms
        for v in self.window:
            m += mip.xsum(self.x[v, d] for d in self.devices[v]) == 1
        self._colocation()
        self._compute()
        self._tensors()
        self._inputs_and_outputs()
        self._memory(reserve or {}, cuts)
        self.T = m.add_var(lb=0.0)
        for terms in self.load.values():
            m += self.T >= mip.xsum(terms)
        total = mip.xsum(t for terms in self.load.values() for t in terms)
        m.objective = mip.minimize(self.T + (1e-3 / max(len(self.load), 1)) * total if tie_break else self.T)

    # ------------------------------------------------------------------ pieces
    def _devices_for(self, kernel: str) -> list[str]:
        devices = self.problem.feasible_devices(kernel)
        group = self.problem.graph.kernels[kernel].colocate
        if group is not None:
            placed = {d for k, d in self.fixed.items() if self.problem.graph.kernels[k].colocate == group}
            devices = [d for d in devices if not placed or d in placed]
        if not devices:
            raise DivimlInputError(f"kernel '{kernel}' has no device left that satisfies its constraints",
                                   field="allowed_devices", hint="allow another device or split its co-location group")
        return devices

    def _x(self, kernel: str, device: str):
        """x[v,d] in the window; a constant 0/1 for a fixed kernel."""
        if kernel in self.inside:
            return self.x.get((kernel, device), 0)
        return 1 if self.fixed[kernel] == device else 0

    def _where(self, kernel: str) -> list[str]:
        return self.devices[kernel] if kernel in self.inside else [self.fixed[kernel]]

    def _seconds(self, nbytes: float, src: str, dst: str) -> float:
        return self.problem.costs.transfer_s(nbytes, src, dst) / self.unit

    def _indicator(self, covers: list) -> object:
        """A quantity >= each expression of ``covers`` and >= 0 (each x-sum minus a constant): a
        constant when they all are, else a [0, 1] variable that the minimisation pushes down."""
        constants = [c for c in covers if isinstance(c, (int, float))]
        if len(constants) == len(covers):
            return max([0, *constants])
        if max(constants, default=0) >= 1:
            return 1
        var = self.m.add_var(lb=0.0, ub=1.0)
        for expression in covers:
            if not isinstance(expression, (int, float)):
                self.m += var >= expression
        self._defined.append((var, covers))
        return var

    def _colocation(self) -> None:
        for v, leader in colocation_leaders(self.problem.graph, self.window):
            for d in set(self.devices[v]) | set(self.devices[leader]):
                self.m += self._x(v, d) == self._x(leader, d)

    def _compute(self) -> None:
        costs = self.problem.costs
        for v in self.window:
            for d in self.devices[v]:
                self.load["device", d].append(costs.compute_s(v, d) / self.unit * self.x[v, d])
        for v, d in self.fixed.items():
            self.load["device", d].append(costs.compute_s(v, d) / self.unit)

    def _tensors(self) -> None:
        """Each producer's tensor on each link, as price layers over its edge sizes."""
        graph, devices = self.problem.graph, self.problem.platform.device_names
        for v in sorted(self.covered, key=graph.position.__getitem__):
            reads = [e for e in graph.succ[v] if e.dst in self.covered]
            if not reads:
                continue
            levels = sorted({e.bytes for e in reads if e.bytes > 0})
            for d in self._where(v):
                for e in devices:
                    if e == d:
                        continue
                    below = 0.0
                    for level in levels:
                        weight = self._seconds(level, d, e) - self._seconds(below, d, e)
                        below = level
                        readers = [r.dst for r in reads if r.bytes >= level and e in self._where(r.dst)]
                        if not readers or weight <= 0:
                            continue
                        there = self._indicator([self._x(v, d) + self._x(w, e) - 1 for w in readers])
                        if not isinstance(there, (int, float)) or there:
                            self.load["link", d, e].append(weight * there)

    def _inputs_and_outputs(self) -> None:
        graph, host = self.problem.graph, self.problem.platform.host
        for graph_input in graph.inputs:
            readers = [c for c in dict.fromkeys(graph_input.consumers) if c in self.covered]
            for e in self.problem.platform.device_names:
                seconds = self._seconds(graph_input.bytes, host, e)
                if e == host or seconds <= 0:
                    continue
                needed = [self._x(c, e) for c in readers if e in self._where(c)]
                if needed:
                    there = self._indicator(needed)
                    if not isinstance(there, (int, float)) or there:
                        self.load["link", host, e].append(seconds * there)
        for v in self.covered & graph.output_set:
            out = graph.kernels[v].output_bytes
            for d in self._where(v):
                if d != host and out > 0:
                    self.load["link", d, host].append(self._seconds(out, d, host) * self._x(v, d))

    def _memory(self, reserve: dict[str, float], cuts: tuple[PeakCut, ...]) -> None:
        """Weights once per device (shared ids once) + an activation reserve <= capacity, and the peak
        cuts, on each device that could be given more than it holds (elsewhere memory cannot bind)."""
        graph = self.problem.graph
        activations = sum(k.output_bytes for k in graph.kernels.values()) + sum(i.bytes for i in graph.inputs)
        self.memory_binds = False
        for device in self.problem.platform.devices:
            name, capacity = device.name, device.memory_bytes
            could_run = [k for k in self.covered if name in self._where(k)]
            if capacity is None or graph.weight_bytes(could_run) + activations <= capacity:
                continue
            self.memory_binds = True
            resident = {w for k, d in self.fixed.items() if d == name for w in graph.kernels[k].weights}
            users: dict[str, list[str]] = defaultdict(list)
            for v in self.window:
                for weight in graph.kernels[v].weights:
                    if weight not in resident and (v, name) in self.x:
                        users[weight].append(v)
            terms = [graph.weights[w] * self._indicator([self.x[v, name] for v in kernels])
                     for w, kernels in users.items()]
            room = capacity - sum(graph.weights[w] for w in resident)
            if terms:
                self.m += mip.xsum(terms) <= room - reserve.get(name, 0.0)
            add_peak_cuts(self.m, self.x, name, terms, room, cuts, self.fixed)

    # ------------------------------------------------------------------ solving
    def warm_start(self, assignment: dict[str, str]) -> None:
        """Offer a known placement of the window (every variable set: HiGHS reads unset ones as 0)."""
        value = {var: 1.0 if assignment[v] == d else 0.0 for (v, d), var in self.x.items()}

        def evaluate(expression) -> float:
            if isinstance(expression, (int, float)):
                return float(expression)
            if isinstance(expression, mip.Var):
                return value[expression]
            return expression.const + sum(c * value[var] for var, c in expression.expr.items())

        for var, covers in self._defined:                  # defined in dependency order
            value[var] = max([0.0, *(evaluate(c) for c in covers)])
        value[self.T] = max([0.0, *(sum(evaluate(t) for t in terms) for terms in self.load.values())])
        self.m.start = list(value.items())

    def solve(self, time_limit_s: float, seed: int = 0, threads: int = 1,
              max_nodes: int | None = None) -> ThroughputSolution | None:
        """``max_nodes``: a branch-and-bound node limit, which (unlike the clock) ends a solve in the same
        place on every run."""
        m = self.m
        m.seed, m.threads = seed, threads
        m.max_mip_gap, m.max_mip_gap_abs = 1e-9, 1e-12
        self.status = status = m.optimize(max_seconds=max(time_limit_s, 0.01), max_nodes=max_nodes or mip.INT_MAX)
        if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
            log.debug("throughput window of %d kernels: status %s", len(self.window), status)
            return None
        assignment = {v: max(self.devices[v], key=lambda d: self.x[v, d].x) for v in self.window}
        bound = m.objective_bound
        bound_s = None if self.tie_break or bound is None or not math.isfinite(bound) else max(bound, 0.0) * self.unit
        return ThroughputSolution(assignment, self.T.x * self.unit, bound_s, status == mip.OptimizationStatus.OPTIMAL)


# ---------------------------------------------------------------------- heuristics
def balance_greedy(budget: DeviceBudget) -> Plan:
    """Kernels in topological order, each to the device with the least resulting period (its compute
    and every transfer it adds: its producers' tensors, model inputs, its output's return), ties to
    the least added load, then platform order. A co-location group's first member weighs the whole
    group's compute on each device."""
    problem = budget.problem
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    inputs_of: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for graph_input in graph.inputs:
        for consumer in dict.fromkeys(graph_input.consumers):
            inputs_of[consumer].append((graph_input.name, graph_input.bytes))
    load: dict[tuple, float] = defaultdict(float)
    crossed: dict[tuple[str, str], float] = {}          # (tensor, device) -> bytes sent there so far
    period = 0.0
    for kernel in graph.topo_order:
        best = None
        for rank, device in enumerate(budget.allowed(kernel)):
            added: dict[tuple, float] = defaultdict(float)
            added["device", device] = sum(costs.compute_s(m, device) for m in budget.moving_with(kernel))
            for edge in graph.pred[kernel]:
                src = budget.device_of[edge.src]
                sent = crossed.get((edge.src, device), 0.0)
                if src != device and edge.bytes > sent:
                    grown = costs.transfer_s(edge.bytes, src, device) - costs.transfer_s(sent, src, device)
                    added["link", src, device] += grown
            for name, nbytes in inputs_of[kernel]:
                if device != host and (name, device) not in crossed:
                    added["link", host, device] += costs.transfer_s(nbytes, host, device)
            out = graph.kernels[kernel].output_bytes
            if kernel in graph.output_set and out > 0 and device != host:
                added["link", device, host] += costs.transfer_s(out, device, host)
            key = (max([period, *(load[r] + s for r, s in added.items())]), sum(added.values()), rank)
            if best is None or key < best[0]:
                best = (key, device, added)
        _, device, added = best
        added["device", device] = costs.compute_s(kernel, device)    # the rest of a group pays when placed
        for resource, seconds in added.items():
            load[resource] += seconds
            period = max(period, load[resource])
        for edge in graph.pred[kernel]:
            key = (edge.src, device)
            crossed[key] = max(crossed.get(key, 0.0), edge.bytes)
        for name, _ in inputs_of[kernel]:
            crossed[name, device] = 0.0
        budget.place(kernel, device)
    return throughput_plan(budget.device_of, "greedy")


def greedy_throughput(problem: Problem, reserve: dict[str, float] | None = None, solver: str = "greedy") -> Plan:
    """``balance_greedy`` under the memory budget (placed again where activations outgrew the reserve)."""
    require_period_overlap(problem, solver)
    began = time.perf_counter()
    problem.validate()
    plan, sim = place_within_memory(problem, balance_greedy, reserve)
    plan.solver, plan.value_s, plan.optimal = solver, sim.value_s, False
    plan.solve_s = time.perf_counter() - began
    log.info("%s (throughput): period %.6g s%s", solver, sim.value_s, "" if sim.feasible else f"; {sim.problems}")
    return plan


# ---------------------------------------------------------------------- exact solver
def solve_throughput_milp(problem: Problem, *, time_limit_s: float, backend: str = "highs", seed: int = 0,
                          threads: int = 1, warm_start: bool = True, solver: str = "milp") -> Plan:
    """The exact model over the whole graph (module docstring), repaired where the simulator saw
    activations overflow a device (``milp.solve_within_memory``)."""
    require_period_overlap(problem, solver)
    began = time.perf_counter()
    problem.validate()
    incumbent = best_heuristic(problem) if warm_start else None
    plan = solve_within_memory(problem, lambda reserve, cuts: _solve_once(
        problem, incumbent, reserve, cuts, time_limit_s - (time.perf_counter() - began), backend, seed, threads,
        solver))
    plan.solve_s = time.perf_counter() - began
    return plan


def _solve_once(problem: Problem, incumbent: Plan | None, reserve: dict[str, float], cuts: tuple[PeakCut, ...],
                time_limit_s: float, backend: str, seed: int, threads: int, solver: str) -> Plan:
    model = ThroughputModel(problem, backend=backend, reserve=reserve, cuts=cuts)
    if incumbent is not None:
        model.warm_start(incumbent.assignment)
    found = model.solve(time_limit_s, seed=seed, threads=threads)
    if found is None:
        if incumbent is None:
            if model.status == mip.OptimizationStatus.INFEASIBLE:
                raise no_plan_exists("throughput MILP")
            raise DivimlInputError("the throughput MILP found no plan within its time limit", field="time_limit",
                                   hint="raise --time-limit or use --solver greedy")
        plan = throughput_plan(incumbent.assignment, solver)
        score(problem, plan)
        plan.attrs["milp_status"] = "no incumbent of its own; the heuristic's plan"
        bound_s = model.m.objective_bound
        plan.lower_bound_s = None if bound_s is None or not math.isfinite(bound_s) else min(
            max(bound_s, 0.0) * model.unit, plan.value_s)
    else:
        plan = throughput_plan(found.assignment, solver)
        sim = score(problem, plan)
        if incumbent is not None and incumbent.value_s < sim.value_s:
            plan = throughput_plan(incumbent.assignment, solver)
            score(problem, plan)
        # No bound may exceed a value reached; the solver's may, by its tolerance.
        plan.lower_bound_s = None if found.bound_s is None else min(found.bound_s, plan.value_s)
        plan.optimal = found.optimal and plan.value_s <= found.period_s * (1 + 1e-6) + 1e-12
        plan.attrs.update({"milp_objective_s": found.period_s, "milp_backend": backend})
    if model.memory_binds:                   # weights + a reserve: a restriction, so neither bound nor proof
        plan.lower_bound_s, plan.optimal = None, False
        plan.attrs["memory_restricts_bound"] = True
    return plan


# ---------------------------------------------------------------------- splitting heuristic
def split_throughput(problem: Problem, *, time_limit_s: float, seed: int = 0, module_size: int = 32,
                     module_time_limit_s: float = 2.0, window_nodes: int | None = WINDOW_NODES,
                     backend: str = "highs", solver: str = "split") -> Plan:
    """Modules forward, then improvement sweeps (module docstring). Each window stops at
    ``window_nodes`` branch-and-bound nodes or its share of the clock, whichever comes first; the
    node limit keeps the run deterministic for a seed wherever the clock does not cut in first."""
    require_period_overlap(problem, solver)
    began = time.perf_counter()
    deadline = began + time_limit_s
    problem.validate()
    graph = problem.graph
    greedy = None
    with contextlib.suppress(DivimlInputError):
        greedy = greedy_throughput(problem)
    if greedy is None or not simulate(graph, problem.platform, problem.costs, greedy).feasible:
        log.info("split: the greedy plan does not fit memory; the throughput MILP gives the starting plan")
        greedy = solve_throughput_milp(problem, time_limit_s=max(deadline - time.perf_counter(), 1.0), seed=seed,
                                       backend=backend, solver=solver)
    reserve = default_reserve(problem)
    pieces = modules(problem, communities(problem, seed), module_size)
    spans = improvement_windows(len(graph), module_size) if len(graph) > module_size else []
    solved = proven = 0

    def solve_window(window: list[str], fixed: dict[str, str], hint: dict[str, str], windows_left: int):
        nonlocal solved, proven
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return None
        try:
            model = ThroughputModel(problem, window, fixed, backend=backend, reserve=reserve, tie_break=True)
        except DivimlInputError as error:         # e.g. a co-location group left without a device
            log.debug("split: window of %d kernels skipped: %s", len(window), error)
            return None
        model.warm_start(hint)
        found = model.solve(min(module_time_limit_s, remaining / max(windows_left, 1)), seed=seed,
                            max_nodes=window_nodes)
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
    while spans and time.perf_counter() < deadline:
        before = improvements
        for index, (first, last) in enumerate(spans):
            window = graph.topo_order[first:last]
            fixed = {k: d for k, d in plan.assignment.items() if k not in set(window)}
            found = solve_window(window, fixed, plan.assignment, len(spans) - index)
            if found is None:
                continue
            candidate = throughput_plan({**plan.assignment, **found}, solver)
            candidate_sim = score(problem, candidate)
            if candidate_sim.feasible and candidate.value_s < plan.value_s * (1 - 1e-9):
                plan, improvements = candidate, improvements + 1
        if improvements == before:
            break
    plan.solve_s = time.perf_counter() - began
    plan.attrs.update({"modules": len(pieces), "module_size": module_size, "windows_solved": solved,
                       "windows_proven": proven, "improvements": improvements, "started_from": started_from,
                       "greedy_value_s": greedy.value_s})
    return plan


# ---------------------------------------------------------------------- replicas
def whole_model_replicas(problem: Problem, solver: str = "replicas") -> Plan | None:
    """The whole model on every device that can run and hold it, each taking a share of the stream
    proportional to its speed (1 / its period alone): each device and its links to and from the host
    then carry share x its own period, so the period is 1 / sum(1 / t_d). None below two devices."""
    alone: dict[str, float] = {}
    for device in problem.platform.device_names:
        sim = simulate(problem.graph, problem.platform, problem.costs, single_device_plan(problem, device))
        if sim.feasible and sim.value_s > 0:
            alone[device] = sim.value_s
    if len(alone) < 2:
        return None
    speed = {d: 1.0 / t for d, t in alone.items()}
    shares = _normalised(speed)
    fastest = min(alone, key=alone.__getitem__)
    plan = throughput_plan({k: fastest for k in problem.graph.kernels}, solver,
                           [ReplicaGroup(list(problem.graph.topo_order), shares)])
    score(problem, plan)
    return plan


def _normalised(weights: dict[str, float]) -> dict[str, float]:
    """Shares that sum to exactly 1 (the last takes the rounding), tiny ones dropped."""
    total = sum(weights.values())
    kept = {d: w / total for d, w in weights.items() if w / total > 1e-6}
    last = list(kept)[-1]
    kept[last] = 1.0 - sum(s for d, s in kept.items() if d != last)
    return kept


def stage_replicas(problem: Problem, base: Plan, solver: str = "replicas") -> Plan | None:
    """``base``'s kernels grouped by device into stages; an LP shares each stage's stream over the
    devices that can run it (min the largest device load, links ignored; then, at that load, the
    least work moved off the stage's own device, so only bottlenecks spread). A device that then
    overflows its memory stops taking other stages' shares and the LP runs again. None when no stage
    spreads."""
    graph = problem.graph
    stages: dict[str, list[str]] = defaultdict(list)
    for kernel in graph.topo_order:
        stages[base.assignment[kernel]].append(kernel)
    movable = {home: [d for d in problem.platform.device_names
                      if all(d in problem.feasible_devices(k) for k in kernels)]
               for home, kernels in stages.items()
               if all(graph.kernels[k].colocate is None for k in kernels)}   # a shared group may not split
    barred: set[str] = set()
    for _ in range(len(problem.platform.devices)):
        options = {home: [d for d in movable.get(home, [home]) if d == home or d not in barred] for home in stages}
        shares = _stage_share_lp(problem, stages, options)
        groups = [ReplicaGroup(list(stages[home]), split) for home, split in shares.items() if len(split) > 1]
        if not groups:
            return None
        plan = throughput_plan(base.assignment, solver, groups)
        sim = score(problem, plan)
        over = {d for d in sim.memory_bytes if problem.platform.device(d).memory_bytes is not None
                and sim.memory_bytes[d] > problem.platform.device(d).memory_bytes}
        if not over:
            return plan
        barred |= over
    return None


def _stage_share_lp(problem: Problem, stages: dict[str, list[str]],
                    options: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """Home device -> {device: share} (see ``stage_replicas``)."""
    costs, unit = problem.costs, mean_fastest_s(problem)
    work = {(home, d): sum(costs.compute_s(k, d) for k in kernels) / unit
            for home, kernels in stages.items() for d in options[home]}
    shares: dict[str, dict[str, float]] = {}
    period = None
    for phase in ("period", "moved"):
        model = new_model("stage_shares", "highs")
        y = {key: model.add_var(lb=0.0, ub=1.0) for key in work}
        T = model.add_var(lb=0.0)
        for home in stages:
            model += mip.xsum(y[home, d] for d in options[home]) == 1
        for device in problem.platform.device_names:
            terms = [work[key] * var for key, var in y.items() if key[1] == device]
            if terms:
                model += mip.xsum(terms) <= (T if period is None else period * (1 + 1e-9) + 1e-9)
        moved = mip.xsum(work[key] * var for key, var in y.items() if key[0] != key[1])
        model.objective = mip.minimize(T if phase == "period" else moved)
        if model.optimize() != mip.OptimizationStatus.OPTIMAL:
            return {home: {home: 1.0} for home in stages}
        period = T.x
        for home in stages:
            shares[home] = _normalised({d: y[home, d].x for d in options[home] if y[home, d].x > 0})
    return shares


class Replicas(Solver):
    """Throughput with replicas (module docstring); ``base``: the solver of the plain plan that
    the stages come from (greedy, split or milp), given most of the time limit."""

    name = "replicas"
    objectives = ("throughput",)
    BASES = ("greedy", "split", "milp")

    def __init__(self, *, time_limit_s: float = 60.0, seed: int = 0, base: str = "milp"):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        if base not in self.BASES:
            raise DivimlInputError(f"unknown base solver '{base}' for replicas", field="base",
                                   hint=f"use one of {', '.join(self.BASES)}")
        self.base = base

    def solve(self, problem: Problem) -> Plan:
        self.check_objective(problem)
        require_period_overlap(problem, self.name)
        began = time.perf_counter()
        from . import get_solver

        base = get_solver(self.base, time_limit_s=self.time_limit_s * 0.9, seed=self.seed).solve(problem)
        options = {"none": throughput_plan(base.assignment, self.name),
                   "whole_model": whole_model_replicas(problem, self.name),
                   "stages": stage_replicas(problem, base, self.name)}
        values: dict[str, float | None] = {}
        best_name = None
        for name, plan in options.items():
            sim = None if plan is None else score(problem, plan)
            values[name] = sim.value_s if sim is not None and sim.feasible else None
            if values[name] is not None and (best_name is None or values[name] < values[best_name]):
                best_name = name
        if best_name is None:
            raise DivimlInputError("no replica option gave a plan that fits", field="memory_bytes",
                                   hint="check memory and allowed devices; try --solver greedy")
        plan = options[best_name]
        plan.solve_s = time.perf_counter() - began
        plan.attrs.update({"replicas_option": best_name, "option_values_s": values, "base_solver": self.base})
        return plan
