"""The throughput MILP in the simulator's ``period_overlap`` mode: min T, every device's and directed
link's load per inference at most T, priced as the simulator prices it (a tensor crosses to a device
once with the largest edge read there, as price layers over its edge sizes; inputs from the host once
per device; outputs back to it). ``fixed`` kernels are constants; others uncounted
(docs/solvers.md#throughput).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass

import mip

from ..plan import Plan, ReplicaGroup
from ..problem import Problem
from ..simulator import Simulation, simulate
from ..tolerances import TIE_BREAK
from .deadline import Deadline
from .mip_backend import check_backend, new_model, optimized, prove_exactly, proven_bound
from .windows import PeakCut, WindowVariables, add_peak_cuts, window_devices

log = logging.getLogger(__name__)


MODE = "period_overlap"


def throughput_plan(assignment: dict[str, str], solver: str, replicas: list[ReplicaGroup] | None = None) -> Plan:
    """A plain throughput plan (period_overlap) of ``assignment``, with replica groups if any."""
    return Plan(dict(assignment), objective="throughput", mode=MODE, replicas=list(replicas or []), solver=solver)


def score(problem: Problem, plan: Plan) -> Simulation:
    """Simulate ``plan`` and make its claim the simulator's value."""
    sim = simulate(problem, plan)
    plan.value_s = sim.value_s
    return sim


def mean_fastest_s(problem: Problem) -> float:
    """The mean kernel time at its fastest device: the MILPs' time unit (solver tolerances are absolute)."""
    times = [
        min((problem.costs.compute_s(k, d) for d in problem.feasible_devices(k)), default=0.0)
        for k in problem.graph.kernels
    ]
    unit = sum(t for t in times if math.isfinite(t)) / max(len(times), 1)
    return unit if unit > 0 else 1.0


# ---------------------------------------------------------------------- the exact model
@dataclass
class ThroughputSolution:
    assignment: dict[str, str]  # window kernels only
    period_s: float  # the model's period (T)
    bound_s: float | None  # a certified lower bound on T (None with tie-break or none found)
    optimal: bool


class ThroughputModel(WindowVariables):
    """min T s.t. every device's and link's load <= T, over ``window`` (default: every kernel).

    ``fixed`` places other kernels for good: their loads are constants. Kernels in neither are not
    counted at all (a forward pass that has not reached them yet). ``tie_break`` also minimises,
    slightly, the sum of all loads, so that a window whose period is set elsewhere still leaves room
    (its objective then bounds nothing). ``build_by``: building stops there (``OutOfTime``: on 140
    devices the link loads of 139 kernels took 2 minutes to state).
    """

    def __init__(
        self,
        problem: Problem,
        window: list[str] | None = None,
        fixed: dict[str, str] | None = None,
        *,
        backend: str = "highs",
        reserve: dict[str, float] | None = None,
        cuts: tuple[PeakCut, ...] = (),
        tie_break: bool = False,
        build_by: Deadline | None = None,
    ):
        self.problem, self.build_by = problem, build_by
        graph = problem.graph
        self.window = list(window) if window is not None else list(graph.topo_order)
        self.inside = set(self.window)
        self.fixed = {k: d for k, d in (fixed or {}).items() if k not in self.inside}
        self.fixed_devices = self.fixed
        self.covered = self.inside | set(self.fixed)
        self.unit = mean_fastest_s(problem)
        self.tie_break = tie_break
        self.m = m = new_model("throughput", check_backend(backend))
        self.devices = {v: window_devices(problem, v, self.fixed) for v in self.window}
        self.x = {(v, d): m.add_var(var_type=mip.BINARY) for v in self.window for d in self.devices[v]}
        self._defined: list[tuple[mip.Var, list]] = []  # indicator -> the expressions it must cover
        self.load: dict[tuple, list] = defaultdict(list)  # ("device", d) or ("link", d, e) -> terms
        for v in self.window:
            m += mip.xsum(self.x[v, d] for d in self.devices[v]) == 1
        self.tie_colocated()
        self._compute()
        self._tensors()
        self._inputs_and_outputs()
        self._memory(reserve or {}, cuts)
        self.T = m.add_var(lb=0.0)
        for terms in self.load.values():
            m += self.T >= mip.xsum(terms)
        total = mip.xsum(t for terms in self.load.values() for t in terms)
        m.objective = mip.minimize(self.T + (TIE_BREAK / max(len(self.load), 1)) * total if tie_break else self.T)

    # ------------------------------------------------------------------ pieces
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
            if self.build_by is not None:
                self.build_by.check("building the throughput MILP")
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
                        there = self._indicator([self.x_of(v, d) + self.x_of(w, e) - 1 for w in readers])
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
                needed = [self.x_of(c, e) for c in readers if e in self._where(c)]
                if needed:
                    there = self._indicator(needed)
                    if not isinstance(there, (int, float)) or there:
                        self.load["link", host, e].append(seconds * there)
        for v in self.covered & graph.output_set:
            out = graph.kernels[v].output_bytes
            for d in self._where(v):
                if d != host and out > 0:
                    self.load["link", d, host].append(self._seconds(out, d, host) * self.x_of(v, d))

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
            terms = [
                graph.weights[w] * self._indicator([self.x[v, name] for v in kernels]) for w, kernels in users.items()
            ]
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

        for var, covers in self._defined:  # defined in dependency order
            value[var] = max([0.0, *(evaluate(c) for c in covers)])
        value[self.T] = max([0.0, *(sum(evaluate(t) for t in terms) for terms in self.load.values())])
        self.m.start = list(value.items())

    def solve(
        self, deadline: Deadline, seed: int = 0, threads: int = 1, max_nodes: int | None = None
    ) -> ThroughputSolution | None:
        """The best placement the MILP finds by ``deadline`` (None: none). ``max_nodes``: a
        branch-and-bound node limit, which (unlike the clock) ends a solve in the same place on every run."""
        m = self.m
        prove_exactly(m, seed, threads)
        self.status = status = optimized(m, max_seconds=max(deadline.left(), 0.01), max_nodes=max_nodes or mip.INT_MAX)
        if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
            log.debug("throughput window of %d kernels: status %s", len(self.window), status)
            return None
        assignment = {v: max(self.devices[v], key=lambda d: self.x[v, d].x) for v in self.window}
        bound_s = None if self.tie_break else proven_bound(m, self.unit)
        return ThroughputSolution(assignment, self.T.x * self.unit, bound_s, status == mip.OptimizationStatus.OPTIMAL)
