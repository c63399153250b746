"""The latency MILP: one inference's makespan, exactly as the simulator's ``latency`` mode charges it.

Variables: x[v,d] (kernel v on device d), s[v] (start), y[u,w,d,e] (edge u->w crosses from d to e),
o[v,w] (v before w, for pairs no path orders), C (makespan). Model inputs start on the host and cross
once to each device that reads them; a tensor crosses to a device once, with the largest bytes read
there; outputs made off the host return before C. Over a window, the rest is fixed by a ``Context``
(docs/solvers.md#milp).
"""

from __future__ import annotations

import logging

import mip

from ..problem import Problem
from ..tolerances import TIE_BREAK
from .deadline import Deadline
from .mip_backend import new_model, optimized, prove_exactly, proven_bound
from .windows import (
    Context,
    PeakCut,
    WindowSolution,
    WindowVariables,
    add_peak_cuts,
    reachability,
    trivial_horizon_s,
    window_devices,
)

log = logging.getLogger(__name__)


class LatencyModel(WindowVariables):
    """The latency MILP over ``window`` (default: every kernel), the rest fixed by ``context``."""

    def __init__(
        self,
        problem: Problem,
        window: list[str] | None = None,
        context: Context | None = None,
        *,
        backend: str = "highs",
        upper_bound_s: float | None = None,
        reserve: dict[str, float] | None = None,
        cuts: tuple[PeakCut, ...] = (),
        descendants: dict[str, int] | None = None,
        tie_break: bool = False,
        tail_s: dict[str, float] | None = None,
        build_by: Deadline | None = None,
    ):
        """``tie_break``: also minimise (slightly) the mean start time, so that kernels off the critical
        path still finish early. ``tail_s``: per kernel, work that must still follow it outside the window
        (C >= finish + tail), so that a window's makespan stands for the whole graph's. Both serve the
        splitting heuristic; the exact solver of the whole graph uses neither. ``build_by``: building
        stops there (``OutOfTime``)."""
        self.problem, self.build_by = problem, build_by
        graph, costs = problem.graph, problem.costs
        self.window = list(window) if window is not None else list(graph.topo_order)
        self.inside = set(self.window)
        self.context = context or Context()
        self.fixed_devices = self.context.assignment
        host = problem.platform.host
        self.m = m = new_model("latency", backend)
        self.devices = {v: window_devices(problem, v, self.context.assignment) for v in self.window}
        self.x = {(v, d): m.add_var(var_type=mip.BINARY) for v in self.window for d in self.devices[v]}
        self.o: dict[tuple[str, str], mip.Var] = {}
        horizon_s = (
            upper_bound_s
            if upper_bound_s is not None
            else trivial_horizon_s(problem, self.window, self.context, tail_s)
        )
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
            for d in self.devices[v]:  # a busy device takes new work after it is free
                ready = self.context.device_ready_s.get(d, 0.0) / self.unit
                if ready > 0:
                    m += self.s[v] >= ready * self.x[v, d]
        self.tie_colocated()
        self._edges(host)
        self._inputs_and_outputs(host)
        self._disjunctions(descendants if descendants is not None else reachability(problem))
        self._memory(reserve or {}, cuts)
        spread = mip.xsum(self.s.values()) * (TIE_BREAK / len(self.window)) if tie_break and self.window else 0
        m.objective = mip.minimize(self.C + spread)

    # ------------------------------------------------------------------ pieces
    def transfer(self, nbytes: float, src: str, dst: str) -> float:
        return self.problem.costs.transfer_s(nbytes, src, dst) / self.unit

    def bound_s(self) -> float | None:
        """The solver's certified lower bound on the window's makespan, in seconds (None before any)."""
        return proven_bound(self.m, self.unit)

    def _edges(self, host: str) -> None:
        graph = self.problem.graph
        m, x, s = self.m, self.x, self.s
        for w in self.window:
            if self.build_by is not None:
                self.build_by.check("building the latency MILP")
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
                        self.transfer(edge.bytes, d, e) * x[w, e] for e in self.devices[w] if e != d
                    )
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
                together = self.x_of(u, d) + self.x[w, e] + (self.x[sibling, e] if sibling is not None else 1) - 2
                self.m += self.s[w] >= finish_u + self.transfer(nbytes, d, e) * together

    def _inputs_and_outputs(self, host: str) -> None:
        graph = self.problem.graph
        for graph_input in graph.inputs:
            for w in dict.fromkeys(graph_input.consumers):
                if w in self.inside:
                    self.m += self.s[w] >= mip.xsum(
                        self.transfer(graph_input.bytes, host, e) * self.x[w, e] for e in self.devices[w] if e != host
                    )
        for v in self.window:
            out = graph.kernels[v].output_bytes
            if v in graph.output_set and out > 0:
                self.m += self.C >= self.finish[v] + mip.xsum(
                    self.transfer(out, d, host) * self.x[v, d] for d in self.devices[v] if d != host
                )

    def _disjunctions(self, descendants: dict[str, int]) -> None:
        """One order variable per pair not ordered by a path; big-M = the horizon (C <= horizon)."""
        graph, M = self.problem.graph, self.horizon
        ordered = sorted(self.window, key=graph.position.__getitem__)
        for i, v in enumerate(ordered):
            if self.build_by is not None:
                self.build_by.check("building the latency MILP")
            for w in ordered[i + 1 :]:
                if descendants[v] >> graph.position[w] & 1:
                    continue
                common = [d for d in self.devices[v] if d in self.devices[w]]
                if not common:
                    continue
                o = self.o[v, w] = self.m.add_var(var_type=mip.BINARY)
                for d in common:  # the pair's own times on d join M: neither may be on d
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
            fixed = {
                w for k, d in self.context.assignment.items() if d == device.name for w in graph.kernels[k].weights
            }
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
        if sum(graph.weights.values()) + activations <= capacity:  # the whole model fits: done
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

    def solve(self, deadline: Deadline, seed: int = 0, threads: int = 1) -> WindowSolution | None:
        """The best schedule the MILP finds by ``deadline`` (None: none)."""
        m = self.m
        prove_exactly(m, seed, threads)
        self.status = status = optimized(m, max_seconds=max(deadline.left(), 0.01))
        if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
            log.debug("window of %d kernels: status %s", len(self.window), status)
            return None
        assignment = {v: next(d for d in self.devices[v] if self.x[v, d].x >= 0.5) for v in self.window}
        start = {v: self.s[v].x * self.unit for v in self.window}
        finish = {v: start[v] + self.problem.costs.compute_s(v, assignment[v]) for v in self.window}
        return WindowSolution(
            assignment, start, finish, self.C.x * self.unit, self.bound_s(), status == mip.OptimizationStatus.OPTIMAL
        )
