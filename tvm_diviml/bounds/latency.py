"""Lower bounds on one inference's makespan: the critical path at fastest devices, and the same path
with transfers priced (inputs from the host, outputs back to it), which sees a distant fastest device;
given time, the series decomposition's DP over CP-SAT's segment bounds (toolkit/series.py).
"""

from __future__ import annotations

import importlib.util

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
    graph, costs, platform = problem.graph, problem.costs, problem.platform
    devices = platform.device_names
    host = devices.index(platform.host)
    moves: dict[float, np.ndarray] = {}
    affine = affine_links(costs, devices)

    def move_s(nbytes: float) -> np.ndarray:
        """[src, dst] seconds to move ``nbytes`` (zero on the diagonal)."""
        if nbytes <= 0:
            return np.zeros((len(devices), len(devices)))
        if affine is not None:
            return affine[0] + nbytes * affine[1]
        if nbytes not in moves:
            moves[nbytes] = np.array(
                [[0.0 if a == b else costs.transfer_s(nbytes, a, b) for b in devices] for a in devices]
            )
        return moves[nbytes]

    arrival = {k: np.zeros(len(devices)) for k in graph.kernels}
    for graph_input in graph.inputs:
        for consumer in graph_input.consumers:
            arrival[consumer] = np.maximum(arrival[consumer], move_s(graph_input.bytes)[host])
    feasible = {k: set(problem.feasible_devices(k)) for k in graph.kernels}
    finish: dict[str, np.ndarray] = {}
    latest = 0.0
    for kernel in graph.topo_order:
        ready = arrival[kernel]
        for edge in graph.pred[kernel]:
            ready = np.maximum(ready, (finish[edge.src][:, None] + move_s(edge.bytes)).min(axis=0))
        compute = np.array([costs.compute_s(kernel, d) if d in feasible[kernel] else np.inf for d in devices])
        finish[kernel] = ready + compute
        done = finish[kernel]
        if kernel in graph.output_set and graph.kernels[kernel].output_bytes > 0:
            done = done + move_s(graph.kernels[kernel].output_bytes)[:, host]
        latest = max(latest, float(done.min()))
    return latest


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


def series_bound(problem: Problem, time_limit_s: float) -> float | None:
    """The series decomposition's bound: its DP over the segments' proven CP-SAT bounds, within
    ``time_limit_s``; None where the decomposition is not exact (no cut kernel, co-location, memory
    that can bind, executor-charging costs) or OR-Tools is missing."""
    if importlib.util.find_spec("ortools") is None or series_obstacle(problem, series_decomposition(problem.graph)):
        return None
    with CpsatSession(seed=0, workers=2) as session:
        plan = series_plan(problem, session, Deadline.after(time_limit_s), segment_time_limit_s=time_limit_s)
    return None if plan is None else plan.lower_bound_s
