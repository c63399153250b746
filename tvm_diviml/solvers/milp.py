"""Exact latency placement: the MILP of DESIGN.md ("Latency"), with python-mip.

Variables, named as in the math: x[v,d] (kernel v on device d), s[v] (start), y[u,w,d,e] (edge u->w
crosses from d to e; per edge, so that consumers on the producer's device pay nothing), o[v,w]
(v before w, only for pairs that no path orders), C (makespan).

The model charges exactly what the simulator's ``latency`` mode charges: model inputs start on the
host and are sent once to each device that reads them; a tensor crosses to a device once, with the
largest bytes any consumer there reads (pairwise constraints where edge bytes differ); outputs made
off the host travel back before the makespan ends. So a proven optimum's value equals the
simulator's value of the plan, which the solver checks.

The same builder solves a *window* of kernels with the rest of the graph fixed (release times and
device-ready times): the splitting heuristic (``split.py``) is made of such windows.
"""
from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import mip

from ..errors import DivimlInputError
from ..plan import Plan
from ..simulator import simulate
from .base import NoPlanError, Problem, Solver, no_plan_exists
from .constraints import activation_overflow, default_reserve

log = logging.getLogger(__name__)

BACKENDS = ("highs", "cbc")        # HiGHS first: 1.4-9x faster than CBC on our 16-20 kernel DAGs


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise DivimlInputError(f"unknown MILP backend '{backend}'", field="backend",
                               hint=f"use one of {', '.join(BACKENDS)}")
    return backend


def new_model(name: str, backend: str) -> mip.Model:
    """A quiet python-mip model. HiGHS comes from highsbox: python-mip would first try highspy, whose
    library lacks the C API on some builds and says so on every run."""
    check_backend(backend)
    if backend == "highs" and "PMIP_HIGHS_LIBRARY" not in os.environ:
        try:
            import highsbox
            library = os.path.join(highsbox.highs_dist_dir(), "lib", "libhighs.so")
            if os.path.exists(library):
                os.environ["PMIP_HIGHS_LIBRARY"] = library
        except ImportError:
            pass
    model = mip.Model(name, sense=mip.MINIMIZE, solver_name=backend.upper())
    model.verbose = 0
    return model


@dataclass
class Context:
    """What is already decided around a window: placed kernels, their finish times, busy devices."""

    assignment: dict[str, str] = field(default_factory=dict)
    finish_s: dict[str, float] = field(default_factory=dict)
    device_ready_s: dict[str, float] = field(default_factory=dict)


@dataclass
class WindowSolution:
    assignment: dict[str, str]
    start_s: dict[str, float]
    finish_s: dict[str, float]
    objective_s: float
    bound_s: float
    optimal: bool


def trivial_horizon_s(problem: Problem, window: list[str] | None = None, context: Context | None = None,
                      tail_s: dict[str, float | dict[str, float]] | None = None) -> float:
    """After every fixed kernel, each window kernel on its slowest feasible device and every tensor
    sent at its dearest, one after another, then the longest tail: a schedule that long always
    exists, so no variable needs a larger domain."""
    graph, costs, platform = problem.graph, problem.costs, problem.platform
    pairs = [(a, b) for a in platform.device_names for b in platform.device_names if a != b]
    context = context or Context()
    kernels = list(window) if window is not None else list(graph.kernels)

    def dearest(nbytes: float) -> float:
        return max((costs.transfer_s(nbytes, a, b) for a, b in pairs), default=0.0)

    def largest_tensor(kernel: str) -> float:
        return max([graph.kernels[kernel].output_bytes, *(e.bytes for e in graph.succ[kernel])])

    inside = set(kernels)
    total = max([0.0, *context.finish_s.values(), *context.device_ready_s.values()])
    total += sum(dearest(graph_input.bytes) for graph_input in graph.inputs
                 if any(c in inside for c in graph_input.consumers))
    total += sum(dearest(largest_tensor(u)) for u in {e.src for k in kernels for e in graph.pred[k]} - inside)
    for kernel in kernels:
        total += max(costs.compute_s(kernel, d) for d in problem.feasible_devices(kernel))
        total += dearest(largest_tensor(kernel))
    longest = [max(t.values(), default=0.0) if isinstance(t, dict) else t for k, t in (tail_s or {}).items()
               if k in inside]
    return total + max([0.0, *longest])


def reachability(problem: Problem) -> dict[str, int]:
    """Bitset of every kernel's descendants (bit = topological position)."""
    graph = problem.graph
    below: dict[str, int] = {}
    for kernel in reversed(graph.topo_order):
        bits = 0
        for edge in graph.succ[kernel]:
            bits |= below[edge.dst] | (1 << graph.position[edge.dst])
        below[kernel] = bits
    return below


def colocation_leaders(graph, window) -> list[tuple[str, str]]:
    """(kernel, the first member of its co-location group in ``window``) for every later member: the
    pairs a model ties together, device by device."""
    first: dict[str, str] = {}
    pairs = []
    for v in window:
        group = graph.kernels[v].colocate
        if group is not None and first.setdefault(group, v) != v:
            pairs.append((v, first[group]))
    return pairs


@dataclass(frozen=True)
class PeakCut:
    """The simulator saw ``peak_bytes`` of activations on ``device`` while it held ``kernels``. Every
    plan that puts all of them there again needs their weights plus at least that peak (on a device,
    activations only grow as kernels join it), so an exact model may exclude those plans."""

    device: str
    kernels: frozenset[str]
    peak_bytes: float


def add_peak_cuts(model: mip.Model, x: dict, device: str, weight_terms: list, room: float,
                  cuts: tuple[PeakCut, ...], fixed: dict[str, str]) -> None:
    """For each cut of ``device``: weights + the cut's peak <= ``room`` (the capacity left by fixed
    weights) whenever every kernel of the cut is there, each either free (``x[kernel, device]``) or
    ``fixed`` there; a cut with a kernel that cannot be there in this model cannot bind, and is skipped."""
    for cut in cuts:
        if cut.device != device or any((k, device) not in x and fixed.get(k) != device for k in cut.kernels):
            continue
        free = [x[k, device] for k in cut.kernels if (k, device) in x]
        model += mip.xsum(weight_terms) + cut.peak_bytes * (mip.xsum(free) - len(free) + 1) <= room



class LatencyModel:
    """The latency MILP over ``window`` (default: every kernel), the rest fixed by ``context``."""

    def __init__(self, problem: Problem, window: list[str] | None = None, context: Context | None = None, *,
                 backend: str = "highs", upper_bound_s: float | None = None, reserve: dict[str, float] | None = None,
                 cuts: tuple[PeakCut, ...] = (), descendants: dict[str, int] | None = None, tie_break: bool = False,
                 tail_s: dict[str, float] | None = None):
        """``tie_break``: also minimise (slightly) the mean start time, so that kernels off the critical
        path still finish early. ``tail_s``: per kernel, work that must still follow it outside the window
        (C >= finish + tail), so that a window's makespan stands for the whole graph's. Both serve the
        splitting heuristic; the exact solver of the whole graph uses neither."""
        self.problem = problem
        graph, costs = problem.graph, problem.costs
        self.window = list(window) if window is not None else list(graph.topo_order)
        self.inside = set(self.window)
        self.context = context or Context()
        host = problem.platform.host
        self.m = m = new_model("latency", backend)
        self.devices = {v: self._devices_for(v) for v in self.window}
        self.x = {(v, d): m.add_var(var_type=mip.BINARY) for v in self.window for d in self.devices[v]}
        self.o: dict[tuple[str, str], mip.Var] = {}
        horizon_s = upper_bound_s if upper_bound_s is not None else trivial_horizon_s(problem, self.window, self.context, tail_s)
        # Solver tolerances are absolute (about 1e-7): seconds of kernels (1e-5) would drown in them, so the
        # model counts time in units of a thousandth of the horizon.
        self.unit = horizon_s / 1000.0 if horizon_s > 0 else 1.0
        self.horizon = horizon = horizon_s / self.unit
        self.s = {v: m.add_var(lb=0.0, ub=horizon) for v in self.window}
        self.C = m.add_var(lb=0.0, ub=horizon)
        p = {(v, d): costs.compute_s(v, d) / self.unit for v in self.window for d in self.devices[v]}
        self.p = p
        finish = {v: self.s[v] + mip.xsum(p[v, d] * self.x[v, d] for d in self.devices[v]) for v in self.window}
        self.finish = finish
        for v in self.window:
            m += mip.xsum(self.x[v, d] for d in self.devices[v]) == 1
            m += self.C >= finish[v] + (tail_s or {}).get(v, 0.0) / self.unit
            for d in self.devices[v]:                    # a busy device takes new work after it is free
                ready = self.context.device_ready_s.get(d, 0.0) / self.unit
                if ready > 0:
                    m += self.s[v] >= ready * self.x[v, d]
        self._colocation()
        self._edges(host)
        self._inputs_and_outputs(host)
        self._disjunctions(descendants if descendants is not None else reachability(problem))
        self._memory(reserve or {}, cuts)
        spread = mip.xsum(self.s.values()) * (1e-3 / len(self.window)) if tie_break and self.window else 0
        m.objective = mip.minimize(self.C + spread)

    # ------------------------------------------------------------------ pieces
    def _devices_for(self, kernel: str) -> list[str]:
        devices = self.problem.feasible_devices(kernel)
        group = self.problem.graph.kernels[kernel].colocate
        if group is not None:
            placed = {d for k, d in self.context.assignment.items() if self.problem.graph.kernels[k].colocate == group}
            devices = [d for d in devices if not placed or d in placed]
        if not devices:
            raise DivimlInputError(f"kernel '{kernel}' has no device left that satisfies its constraints",
                                   field="allowed_devices", hint="allow another device or split its co-location group")
        return devices

    def transfer(self, nbytes: float, src: str, dst: str) -> float:
        return self.problem.costs.transfer_s(nbytes, src, dst) / self.unit

    def bound_s(self) -> float | None:
        """The solver's certified lower bound on the window's makespan, in seconds (None before any)."""
        bound = self.m.objective_bound
        return None if bound is None or not math.isfinite(bound) else max(bound, 0.0) * self.unit

    def _colocation(self) -> None:
        for v, leader in colocation_leaders(self.problem.graph, self.window):
            for d in set(self.devices[v]) | set(self.devices[leader]):
                self.m += self._x(v, d) == self._x(leader, d)

    def _x(self, kernel: str, device: str):
        """x[v,d] inside the window; a constant 0/1 for a fixed kernel (0 where v cannot go)."""
        if kernel in self.inside:
            return self.x.get((kernel, device), 0)
        return 1 if self.context.assignment.get(kernel) == device else 0

    def _edges(self, host: str) -> None:
        graph = self.problem.graph
        m, x, s = self.m, self.x, self.s
        for w in self.window:
            for edge in graph.pred[w]:
                u = edge.src
                if u in self.inside:
                    crossing = []
                    for d in self.devices[u]:
                        for e in self.devices[w]:
                            if d != e:
                                y = m.add_var(lb=0.0, ub=1.0)
                                m += y >= x[u, d] + x[w, e] - 1
                                crossing.append(self.transfer(edge.bytes, d, e) * y)
                    m += s[w] >= self.finish[u] + mip.xsum(crossing)
                else:
                    d = self.context.assignment[u]
                    m += s[w] >= self.context.finish_s[u] / self.unit + mip.xsum(
                        self.transfer(edge.bytes, d, e) * x[w, e] for e in self.devices[w] if e != d)
                # The tensor crosses once per device with the largest bytes read there: a sibling consumer
                # on the same device that reads more bytes delays this one too.
                for sibling in graph.succ[u]:
                    if sibling.dst == w or sibling.bytes <= edge.bytes or sibling.dst not in self.inside:
                        continue
                    self._larger_tensor(u, w, sibling.dst, sibling.bytes)
                if u in graph.output_set and graph.kernels[u].output_bytes > edge.bytes and host in self.devices[w]:
                    self._larger_tensor(u, w, None, graph.kernels[u].output_bytes)

    def _larger_tensor(self, u: str, w: str, sibling: str | None, nbytes: float) -> None:
        """s[w] >= finish(u) + c(nbytes, d, e) when u is on d, w on e and (sibling on e, or e is the host)."""
        host = self.problem.platform.host
        devices_u = self.devices[u] if u in self.inside else [self.context.assignment[u]]
        finish_u = self.finish[u] if u in self.inside else self.context.finish_s[u] / self.unit
        targets = [host] if sibling is None else [e for e in self.devices[w] if e in self.devices[sibling]]
        for d in devices_u:
            for e in targets:
                if d == e or (w, e) not in self.x:
                    continue
                together = self._x(u, d) + self.x[w, e] + (self.x[sibling, e] if sibling is not None else 1) - 2
                self.m += self.s[w] >= finish_u + self.transfer(nbytes, d, e) * together

    def _inputs_and_outputs(self, host: str) -> None:
        graph = self.problem.graph
        for graph_input in graph.inputs:
            for w in dict.fromkeys(graph_input.consumers):
                if w in self.inside:
                    self.m += self.s[w] >= mip.xsum(self.transfer(graph_input.bytes, host, e) * self.x[w, e]
                                                    for e in self.devices[w] if e != host)
        for v in self.window:
            out = graph.kernels[v].output_bytes
            if v in graph.output_set and out > 0:
                self.m += self.C >= self.finish[v] + mip.xsum(self.transfer(out, d, host) * self.x[v, d]
                                                              for d in self.devices[v] if d != host)

    def _disjunctions(self, descendants: dict[str, int]) -> None:
        """One order variable per pair not ordered by a path; big-M = the horizon (C <= horizon)."""
        graph, M = self.problem.graph, self.horizon
        ordered = sorted(self.window, key=graph.position.__getitem__)
        for i, v in enumerate(ordered):
            for w in ordered[i + 1:]:
                if descendants[v] >> graph.position[w] & 1:
                    continue
                common = [d for d in self.devices[v] if d in self.devices[w]]
                if not common:
                    continue
                o = self.o[v, w] = self.m.add_var(var_type=mip.BINARY)
                for d in common:           # the pair's own times on d join M: neither may be on d
                    apart = 2 - self.x[v, d] - self.x[w, d]
                    self.m += self.s[w] >= self.s[v] + self.p[v, d] - M * (1 - o) - (M + self.p[v, d]) * apart
                    self.m += self.s[v] >= self.s[w] + self.p[w, d] - M * o - (M + self.p[w, d]) * apart

    def _memory(self, reserve: dict[str, float], cuts: tuple[PeakCut, ...]) -> None:
        """Weights once per device (shared ids once) + an activation reserve <= capacity, and the peak
        cuts, on each device that cannot hold everything it might be given (elsewhere memory cannot bind)."""
        graph, platform = self.problem.graph, self.problem.platform
        users: dict[str, list[str]] = {}
        for v in self.window:
            for weight in graph.kernels[v].weights:
                users.setdefault(weight, []).append(v)
        self.memory_binds = False
        for device in platform.devices:
            if device.memory_bytes is None or self._everything_fits(device.name, device.memory_bytes):
                continue
            self.memory_binds = True
            fixed = {w for k, d in self.context.assignment.items() if d == device.name for w in graph.kernels[k].weights}
            terms = []
            for weight, kernels in users.items():
                if weight in fixed:
                    continue
                on = [self.x[v, device.name] for v in kernels if (v, device.name) in self.x]
                if not on:
                    continue
                holds = self.m.add_var(lb=0.0, ub=1.0)
                for var in on:
                    self.m += holds >= var
                terms.append(graph.weights.get(weight, 0.0) * holds)
            room = device.memory_bytes - sum(graph.weights.get(w, 0.0) for w in fixed)
            if terms:
                self.m += mip.xsum(terms) <= room - reserve.get(device.name, 0.0)
            add_peak_cuts(self.m, self.x, device.name, terms, room, cuts, self.context.assignment)

    def _everything_fits(self, device: str, capacity: float) -> bool:
        graph = self.problem.graph
        activations = sum(k.output_bytes for k in graph.kernels.values()) + sum(i.bytes for i in graph.inputs)
        if sum(graph.weights.values()) + activations <= capacity:       # the whole model fits: done
            return True
        could_run = [k for k in graph.kernels if device in self.problem.feasible_devices(k)]
        return graph.weight_bytes(could_run) + activations <= capacity

    # ------------------------------------------------------------------ solving
    def warm_start(self, assignment: dict[str, str], start_s: dict[str, float], makespan_s: float) -> None:
        """Offer a known schedule (a heuristic's) as the incumbent."""
        start = []
        for v in self.window:
            for d in self.devices[v]:
                start.append((self.x[v, d], 1.0 if assignment[v] == d else 0.0))
            start.append((self.s[v], min(start_s[v] / self.unit, self.horizon)))
        for (first, second), var in self.o.items():
            start.append((var, 1.0 if start_s[first] <= start_s[second] else 0.0))
        start.append((self.C, min(makespan_s / self.unit, self.horizon)))
        self.m.start = start

    def solve(self, time_limit_s: float, seed: int = 0, threads: int = 1) -> WindowSolution | None:
        m = self.m
        m.seed = seed
        m.threads = threads
        m.max_mip_gap = 1e-9
        m.max_mip_gap_abs = 1e-12
        self.status = status = m.optimize(max_seconds=max(time_limit_s, 0.01))
        if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
            log.debug("window of %d kernels: status %s", len(self.window), status)
            return None
        assignment = {v: next(d for d in self.devices[v] if self.x[v, d].x >= 0.5) for v in self.window}
        start = {v: self.s[v].x * self.unit for v in self.window}
        finish = {v: start[v] + self.problem.costs.compute_s(v, assignment[v]) for v in self.window}
        return WindowSolution(assignment, start, finish, self.C.x * self.unit, self.bound_s(),
                              status == mip.OptimizationStatus.OPTIMAL)


def order_by_start(graph, assignment: dict[str, str], start_s: dict[str, float],
                   phase: dict[str, int] | None = None) -> dict[str, list[str]]:
    """Per-device run order: by ``phase`` (kernels solved in later windows run later), then start time,
    ties by topological position (zero-time kernels)."""
    order: dict[str, list[str]] = {}
    key = (lambda k: (phase[k], start_s[k], graph.position[k])) if phase else \
        (lambda k: (start_s[k], graph.position[k]))
    for kernel in sorted(assignment, key=key):
        order.setdefault(assignment[kernel], []).append(kernel)
    return order


def list_schedule(problem: Problem, window: list[str], context: Context, assignment: dict[str, str],
                  tail_s: dict[str, float] | None = None) -> WindowSolution:
    """Time ``window`` (in topological order) on the devices ``assignment`` gives it, after ``context``:
    each kernel as early as its device and inputs allow. Every tensor is priced at its producer's
    largest bytes, so the schedule is feasible in the window's MILP (a valid warm start)."""
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    ready = dict(context.device_ready_s)
    finish = dict(context.finish_s)
    where = {**context.assignment, **{k: assignment[k] for k in window}}
    reads = {k: [i.bytes for i in graph.inputs if k in i.consumers] for k in window}
    start: dict[str, float] = {}
    makespan = 0.0
    for kernel in window:
        device = where[kernel]
        arrival = max([0.0] + [costs.transfer_s(b, host, device) for b in reads[kernel] if device != host])
        for edge in graph.pred[kernel]:
            src = where[edge.src]
            tensor = max([e.bytes for e in graph.succ[edge.src]]
                         + [graph.kernels[edge.src].output_bytes] * (edge.src in graph.output_set))
            arrival = max(arrival, finish[edge.src] + (costs.transfer_s(tensor, src, device) if src != device else 0.0))
        start[kernel] = max(arrival, ready.get(device, 0.0))
        finish[kernel] = ready[device] = start[kernel] + costs.compute_s(kernel, device)
        back = graph.kernels[kernel].output_bytes
        home = costs.transfer_s(back, device, host) if kernel in graph.output_set and back > 0 and device != host else 0
        makespan = max(makespan, finish[kernel] + home, finish[kernel] + (tail_s or {}).get(kernel, 0.0))
    return WindowSolution({k: where[k] for k in window}, start, {k: finish[k] for k in window}, makespan, 0.0, False)


class Milp(Solver):
    """The exact MILP over the whole graph, warm-started from the best heuristic: latency here;
    throughput (``throughput.ThroughputModel``) and pipelines (``mtpp``) in their own modules."""

    name = "milp"
    objectives = ("latency", "throughput", "pipeline")

    def __init__(self, *, time_limit_s: float = 60.0, seed: int = 0, backend: str = "highs", threads: int = 1,
                 warm_start: bool = True):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        self.backend, self.threads, self.use_warm_start = check_backend(backend), threads, warm_start

    def solve(self, problem: Problem) -> Plan:
        self.check_objective(problem)
        if problem.objective == "throughput":
            from .throughput import solve_throughput_milp     # it builds on this module

            return solve_throughput_milp(problem, time_limit_s=self.time_limit_s, backend=self.backend,
                                         seed=self.seed, threads=self.threads, warm_start=self.use_warm_start)
        if problem.objective == "pipeline":
            from .mtpp import solve_pipeline_mip
            from .slicegraph import SliceGraph

            began = time.perf_counter()
            incumbent = SliceGraph(time_limit_s=self.time_limit_s / 4, seed=self.seed).solve(problem) \
                if self.use_warm_start else None
            plan = solve_pipeline_mip(problem, time_limit_s=self.time_limit_s - (time.perf_counter() - began),
                                      backend=self.backend, seed=self.seed, warm_start=incumbent)
            plan.solve_s = time.perf_counter() - began
            return plan
        began = time.perf_counter()
        problem.validate()
        incumbent = best_heuristic(problem) if self.use_warm_start else None
        plan = solve_within_memory(problem, lambda reserve, cuts: self._solve_once(
            problem, incumbent, reserve, cuts, self.time_limit_s - (time.perf_counter() - began)))
        plan.solve_s = time.perf_counter() - began
        return plan

    def _solve_once(self, problem: Problem, incumbent: Plan | None, reserve: dict[str, float],
                    cuts: tuple[PeakCut, ...], time_limit_s: float) -> Plan:
        graph = problem.graph
        upper = incumbent.value_s if incumbent is not None and math.isfinite(incumbent.value_s) else None
        model = LatencyModel(problem, backend=self.backend, upper_bound_s=upper, reserve=reserve, cuts=cuts)
        if incumbent is not None:
            sim = simulate(graph, problem.platform, problem.costs, incumbent)
            model.warm_start(incumbent.assignment, sim.start_s, sim.value_s)
        found = model.solve(time_limit_s, seed=self.seed, threads=self.threads)
        if found is None:
            if incumbent is None:
                if model.status == mip.OptimizationStatus.INFEASIBLE:
                    raise no_plan_exists("MILP")
                raise DivimlInputError("the MILP found no plan within its time limit", field="time_limit",
                                       hint="raise --time-limit or use --solver heft")
            plan = incumbent.copy(self.name)
            plan.lower_bound_s = model.bound_s()
            plan.attrs["milp_status"] = "no better incumbent"
            return plan
        plan = Plan(found.assignment, objective="latency", mode="latency",
                    order=order_by_start(graph, found.assignment, found.start_s), solver=self.name)
        sim = simulate(graph, problem.platform, problem.costs, plan)
        if incumbent is not None and incumbent.value_s < sim.value_s:
            plan = incumbent.copy(self.name)
            sim = simulate(graph, problem.platform, problem.costs, plan)
        plan.value_s = sim.value_s
        # No bound can exceed a value reached; the solver's may, by its tolerance.
        plan.lower_bound_s = None if found.bound_s is None else min(found.bound_s, sim.value_s)
        # Proven only if the simulator agrees with the model, up to the solver's feasibility tolerance.
        plan.optimal = found.optimal and sim.value_s <= found.objective_s * (1 + 1e-6) + 1e-12
        plan.attrs.update({"milp_objective_s": found.objective_s, "milp_backend": self.backend})
        if model.memory_binds:                # weights + a reserve: a restriction, so neither bound nor proof
            plan.lower_bound_s, plan.optimal = None, False
            plan.attrs["memory_restricts_bound"] = True
        return plan


def best_heuristic(problem: Problem) -> Plan | None:
    """The best of the list-scheduling heuristics and the single-device baseline that do the
    problem's objective (latency or throughput), as a warm start."""
    from . import SOLVERS                     # the registry imports this module

    best = None
    for name in ("heft", "greedy", "fastest_single_device"):
        if name not in SOLVERS:
            continue
        try:                                  # a list schedule that overflows stays one (no MILP in a MILP)
            plan = SOLVERS[name](**({} if name == "fastest_single_device" else {"exact_fallback": False})
                                 ).solve(problem)
        except DivimlInputError:
            continue
        sim = simulate(problem.graph, problem.platform, problem.costs, plan)
        if sim.feasible and (best is None or sim.value_s < best.value_s):
            plan.value_s = sim.value_s
            if plan.order is None and problem.objective == "latency":
                plan.order = order_by_start(problem.graph, plan.assignment, sim.start_s)
            best = plan
    return best


def solve_within_memory(problem: Problem, solve_once: Callable[[dict[str, float], tuple[PeakCut, ...]], Plan],
                        attempts: int = 8) -> Plan:
    """An exact model of weights plus a per-device activation reserve, solved by ``solve_once(reserve,
    cuts)``: first with ``default_reserve``; where that model has no plan, with no reserve (weights
    alone: a relaxation, so its proof of infeasibility holds for the problem); then, up to
    ``attempts`` solves in all, with a ``PeakCut`` for each device the simulator saw overflow. The
    last plan may still overflow (the simulator then says so)."""
    reserve = default_reserve(problem)
    cuts: tuple[PeakCut, ...] = ()
    try:
        plan = solve_once(reserve, cuts)
    except NoPlanError:
        log.info("no plan with the default activation reserve; solving with weights alone, then repairing")
        reserve = dict.fromkeys(reserve, 0.0)
        plan = solve_once(reserve, cuts)
    for _ in range(attempts - 1):
        overflow = activation_overflow(problem, plan, simulate(problem.graph, problem.platform, problem.costs, plan))
        new = {PeakCut(device, frozenset(k for k, d in plan.assignment.items() if d == device), peak)
               for device, peak in overflow.items()} - set(cuts)
        if not new:
            break
        cuts = (*cuts, *sorted(new, key=lambda cut: (cut.device, sorted(cut.kernels))))
        try:
            plan = solve_once(reserve, cuts)
        except NoPlanError:
            log.warning("activations overflow %s, and no plan avoids the sets that overflowed; keeping the plan "
                        "that overflows", ", ".join(sorted(overflow)))
            break
    return plan


def milp_instead(problem: Problem, solver: Solver, began: float, note: str) -> Plan:
    """``solver`` found no plan within memory by its own method: the MILP (its memory repaired by what
    the simulator sees) places the model, or proves that nothing fits; the plan says so in ``note``."""
    log.warning("%s: %s", solver.name, note)
    plan = Milp(time_limit_s=max(solver.time_limit_s - (time.perf_counter() - began), 1.0),
                seed=solver.seed).solve(problem)
    plan.solver, plan.solve_s = solver.name, time.perf_counter() - began
    plan.attrs["weaker_method"] = note
    return plan
