"""Lower bounds on one inference's makespan: the critical path at fastest devices, and the same path
with transfers priced (inputs from the host, outputs back to it), which sees a distant fastest device;
given time, the series decomposition's DP over CP-SAT's segment bounds (toolkit/series.py). The heads
and tails of that pricing (earliest start, least time to the end) are what ``window_load`` reads.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..problem import Problem
from ..tolerances import MEETS
from ..toolkit.cpsat_session import CpsatSession
from ..toolkit.deadline import Deadline
from ..toolkit.series import series_decomposition, series_obstacle, series_plan
from .common import fastest_times


def critical_path_bound(problem: Problem) -> float:
    """The longest path of fastest-device times, communication free."""
    graph, fastest = problem.graph, fastest_times(problem)
    finish: dict[str, float] = {}
    for kernel in graph.topo_order:
        ready = max((finish[e.src] for e in graph.pred[kernel]), default=0.0)
        finish[kernel] = ready + fastest[kernel]
    return max(finish.values(), default=0.0)


def transfer_path_bound(problem: Problem) -> float:
    """``transfer_path``: earliest finishes per (kernel, device), transfers priced
    and contention ignored, so every plan's makespan is at least the largest of them."""
    graph = problem.graph
    times = TransferTimes(problem)
    compute = compute_times(problem)
    head = heads(problem, times, compute)
    latest = 0.0
    for kernel in graph.kernels:
        done = head[kernel] + compute[kernel]
        if kernel in graph.output_set and graph.kernels[kernel].output_bytes > 0:
            done = done + times.back_to_host(graph.kernels[kernel].output_bytes)
        latest = max(latest, float(done.min()))
    return latest


class TransferTimes:
    """[src, dst] seconds to move a tensor between the platform's devices (zero on the diagonal), cached per
    size, or in closed form where each link costs latency + bytes x rate."""

    def __init__(self, problem: Problem):
        self.costs, self.devices = problem.costs, problem.platform.device_names
        self.host = self.devices.index(problem.platform.host)
        self.affine = affine_links(self.costs, self.devices)
        self.cache: dict[float, np.ndarray] = {}

    def __call__(self, nbytes: float) -> np.ndarray:
        size = len(self.devices)
        if nbytes <= 0:
            return np.zeros((size, size))
        if self.affine is not None:
            return self.affine[0] + nbytes * self.affine[1]
        if nbytes not in self.cache:
            self.cache[nbytes] = np.array(
                [[0.0 if a == b else self.costs.transfer_s(nbytes, a, b) for b in self.devices] for a in self.devices]
            )
        return self.cache[nbytes]

    def from_host(self, nbytes: float) -> np.ndarray:
        return self(nbytes)[self.host]

    def back_to_host(self, nbytes: float) -> np.ndarray:
        return self(nbytes)[:, self.host]


def compute_times(problem: Problem, pins: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
    """Each kernel's time on every device (inf where it may not run, or on every device but its
    own for a kernel of ``pins``, kernel -> device)."""
    devices = problem.platform.device_names
    pins = pins or {}
    out = {}
    for kernel in problem.graph.kernels:
        feasible = {pins[kernel]} if kernel in pins else set(problem.feasible_devices(kernel))
        out[kernel] = np.array([problem.costs.compute_s(kernel, d) if d in feasible else np.inf for d in devices])
    return out


def heads(problem: Problem, times: TransferTimes, compute: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Earliest start of each kernel on each device: its inputs moved from the host, each producer at
    its earliest finish on the device that delivers soonest, contention ignored."""
    graph = problem.graph
    start = {k: np.zeros(len(times.devices)) for k in graph.kernels}
    for graph_input in graph.inputs:
        for consumer in graph_input.consumers:
            start[consumer] = np.maximum(start[consumer], times.from_host(graph_input.bytes))
    for kernel in graph.topo_order:
        for edge in graph.pred[kernel]:
            ready = ((start[edge.src] + compute[edge.src])[:, None] + times(edge.bytes)).min(axis=0)
            start[kernel] = np.maximum(start[kernel], ready)
    return start


def tails(problem: Problem, times: TransferTimes, compute: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Least time from each kernel's end on each device to the makespan: its output's return to the
    host, and each consumer's transfer, work and tail at the device that finishes soonest."""
    graph = problem.graph
    after: dict[str, np.ndarray] = {}
    for kernel in reversed(graph.topo_order):
        least = np.zeros(len(times.devices))
        nbytes = graph.kernels[kernel].output_bytes
        if kernel in graph.output_set and nbytes > 0:
            least = np.maximum(least, times.back_to_host(nbytes))
        for edge in graph.succ[kernel]:
            onward = (times(edge.bytes) + (compute[edge.dst] + after[edge.dst])[None, :]).min(axis=1)
            least = np.maximum(least, onward)
        after[kernel] = least
    return after


def work_heads_tails(
    problem: Problem, pins: Mapping[str, str] | None = None, times: TransferTimes | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(work, head, tail) as (kernels, devices) arrays, kernels in ``graph.kernels`` order: compute
    time (inf where the kernel may not run, or is pinned elsewhere by ``pins``), earliest start and
    least time to the end on each device; what the window bounds read. ``times``: the problem's
    ``TransferTimes``, where a caller already made them."""
    times = times or TransferTimes(problem)
    compute = compute_times(problem, pins)
    start, after = heads(problem, times, compute), tails(problem, times, compute)
    kernels = list(problem.graph.kernels)
    return tuple(np.array([table[k] for k in kernels]) for table in (compute, start, after))


def affine_links(costs, devices: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """(latency, seconds per byte) of every link, when each transfer costs latency + bytes x rate
    (checked at a third size); None otherwise. A graph with thousands of distinct tensor sizes on
    64 devices would otherwise ask the cost model for millions of transfers."""
    small, large, middle = 1.0, float(2**30), float(2**20)
    size = len(devices)
    at = {
        n: np.array([[0.0 if a == b else costs.transfer_s(n, a, b) for b in devices] for a in devices])
        for n in (small, large, middle)
    }
    rate = (at[large] - at[small]) / (large - small)
    latency = at[small] - small * rate
    predicted = latency + middle * rate
    if not np.allclose(predicted, at[middle], rtol=MEETS, atol=1e-15):
        return None
    return latency * (1 - np.eye(size)), rate * (1 - np.eye(size))


def series_bound(problem: Problem, deadline: Deadline) -> float | None:
    """The series decomposition's bound: its DP over the segments' proven CP-SAT bounds, by
    ``deadline``; None where the decomposition is not exact (no cut kernel, co-location, memory
    that can bind, executor-charging costs)."""
    if series_obstacle(problem, series_decomposition(problem.graph)):
        return None
    with CpsatSession(seed=0, workers=2) as session:
        plan = series_plan(problem, session, deadline, segment_time_limit_s=deadline.left())
    return None if plan is None else plan.lower_bound_s
