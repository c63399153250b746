"""Windows: a set of kernels solved with the rest of the graph fixed (placed, timed, or both).

The exact latency and throughput models, CP-SAT's tick model and the splitting heuristic all speak
in these terms: a ``Context`` of what is decided, the devices a window kernel may still use, and the
schedules that come back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mip

from ..errors import DivimlInputError
from ..problem import Problem


@dataclass
class Context:
    """What is already decided around a window: placed kernels, their finish times, busy devices."""

    assignment: dict[str, str] = field(default_factory=dict)
    finish_s: dict[str, float] = field(default_factory=dict)
    device_ready_s: dict[str, float] = field(default_factory=dict)


@dataclass
class WindowSolution:
    """A window's schedule: where and when each kernel runs, its makespan, bound and proof."""

    assignment: dict[str, str]
    start_s: dict[str, float]
    finish_s: dict[str, float]
    objective_s: float
    bound_s: float
    optimal: bool


def window_devices(problem: Problem, kernel: str, fixed: dict[str, str]) -> list[str]:
    """Where ``kernel`` may run: its feasible devices, and the device of a ``fixed`` member of its
    co-location group."""
    devices = problem.feasible_devices(kernel)
    group = problem.graph.kernels[kernel].colocate
    if group is not None:
        placed = {d for k, d in fixed.items() if problem.graph.kernels[k].colocate == group}
        devices = [d for d in devices if not placed or d in placed]
    if not devices:
        raise DivimlInputError(
            f"kernel '{kernel}' has no device left that satisfies its constraints",
            field="allowed_devices",
            hint="allow another device or split its co-location group",
        )
    return devices


def trivial_horizon_s(
    problem: Problem,
    window: list[str] | None = None,
    context: Context | None = None,
    tail_s: dict[str, float | dict[str, float]] | None = None,
) -> float:
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
    total += sum(
        dearest(graph_input.bytes) for graph_input in graph.inputs if any(c in inside for c in graph_input.consumers)
    )
    total += sum(dearest(largest_tensor(u)) for u in {e.src for k in kernels for e in graph.pred[k]} - inside)
    for kernel in kernels:
        total += max(costs.compute_s(kernel, d) for d in problem.feasible_devices(kernel))
        total += dearest(largest_tensor(kernel))
    longest = [
        max(t.values(), default=0.0) if isinstance(t, dict) else t for k, t in (tail_s or {}).items() if k in inside
    ]
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


def add_peak_cuts(
    model: mip.Model,
    x: dict,
    device: str,
    weight_terms: list,
    room: float,
    cuts: tuple[PeakCut, ...],
    fixed: dict[str, str],
) -> None:
    """For each cut of ``device``: weights + the cut's peak <= ``room`` (the capacity left by fixed
    weights) whenever every kernel of the cut is there, each either free (``x[kernel, device]``) or
    ``fixed`` there; a cut with a kernel that cannot be there in this model cannot bind, and is skipped."""
    for cut in cuts:
        if cut.device != device or any((k, device) not in x and fixed.get(k) != device for k in cut.kernels):
            continue
        free = [x[k, device] for k in cut.kernels if (k, device) in x]
        model += mip.xsum(weight_terms) + cut.peak_bytes * (mip.xsum(free) - len(free) + 1) <= room


def order_by_start(
    graph, assignment: dict[str, str], start_s: dict[str, float], phase: dict[str, int] | None = None
) -> dict[str, list[str]]:
    """Per-device run order: by ``phase`` (kernels solved in later windows run later), then start time,
    ties by topological position (zero-time kernels)."""
    order: dict[str, list[str]] = {}
    key = (
        (lambda k: (phase[k], start_s[k], graph.position[k])) if phase else (lambda k: (start_s[k], graph.position[k]))
    )
    for kernel in sorted(assignment, key=key):
        order.setdefault(assignment[kernel], []).append(kernel)
    return order


def list_schedule(
    problem: Problem,
    window: list[str],
    context: Context,
    assignment: dict[str, str],
    tail_s: dict[str, float] | None = None,
) -> WindowSolution:
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
            tensor = max(
                [e.bytes for e in graph.succ[edge.src]]
                + [graph.kernels[edge.src].output_bytes] * (edge.src in graph.output_set)
            )
            arrival = max(arrival, finish[edge.src] + (costs.transfer_s(tensor, src, device) if src != device else 0.0))
        start[kernel] = max(arrival, ready.get(device, 0.0))
        finish[kernel] = ready[device] = start[kernel] + costs.compute_s(kernel, device)
        back = graph.kernels[kernel].output_bytes
        home = costs.transfer_s(back, device, host) if kernel in graph.output_set and back > 0 and device != host else 0
        makespan = max(makespan, finish[kernel] + home, finish[kernel] + (tail_s or {}).get(kernel, 0.0))
    return WindowSolution({k: where[k] for k in window}, start, {k: finish[k] for k in window}, makespan, 0.0, False)


class WindowVariables:
    """What the exact window models share: x[v,d] inside the window and 0/1 constants for the kernels
    ``fixed_devices`` places, and co-location tied device by device. Subclasses set ``problem``,
    ``window``, ``inside``, ``devices``, ``x``, ``m`` and ``fixed_devices``."""

    problem: Problem
    window: list[str]
    inside: set[str]
    devices: dict[str, list[str]]
    x: dict[tuple[str, str], mip.Var]
    m: mip.Model
    fixed_devices: dict[str, str]

    def x_of(self, kernel: str, device: str):
        """x[v,d] in the window; a constant 0/1 for a fixed kernel (0 where v cannot go)."""
        if kernel in self.inside:
            return self.x.get((kernel, device), 0)
        return 1 if self.fixed_devices.get(kernel) == device else 0

    def tie_colocated(self) -> None:
        for v, leader in colocation_leaders(self.problem.graph, self.window):
            for d in set(self.devices[v]) | set(self.devices[leader]):
                self.m += self.x_of(v, d) == self.x_of(leader, d)
