"""Lower bounds on the best value any plan can reach (TVM-free).

Each part is a valid bound on its own; the reported bound is their maximum. Kernels are priced at
their fastest feasible device and communication is free, so no bound depends on a plan.

- ``critical_path`` (latency): the longest path of fastest-device times.
- ``largest_kernel``: one kernel alone needs at least its fastest time (not valid for
  ``period_overlap``, where a replicated kernel splits the stream).
- ``average_load``: the devices' loads sum to at least the sum of fastest times, so the largest is
  at least that sum over the number of devices (over the number of stages for pipelines).
"""
from __future__ import annotations

from .solvers.base import Problem


def fastest_times(problem: Problem) -> dict[str, float]:
    """Each kernel's time on its fastest feasible device."""
    times = {}
    for kernel in problem.graph.kernels:
        devices = problem.feasible_devices(kernel)
        times[kernel] = min((problem.costs.compute_s(kernel, d) for d in devices), default=float("inf"))
    return times


def lower_bounds(problem: Problem) -> dict[str, float]:
    """Named lower bounds valid for ``problem``'s objective and cost mode."""
    graph, mode = problem.graph, problem.mode
    fastest = fastest_times(problem)
    devices = len(problem.platform.devices)
    parts: dict[str, float] = {}
    if mode == "stage_serial":
        devices = min(devices, problem.stages or devices)
    parts["average_load"] = sum(fastest.values()) / devices
    if mode != "period_overlap":
        parts["largest_kernel"] = max(fastest.values(), default=0.0)
    if mode == "latency":
        finish: dict[str, float] = {}
        for kernel in graph.topo_order:
            ready = max((finish[e.src] for e in graph.pred[kernel]), default=0.0)
            finish[kernel] = ready + fastest[kernel]
        parts["critical_path"] = max(finish.values(), default=0.0)
    return parts


def lower_bound(problem: Problem) -> float:
    return max(lower_bounds(problem).values(), default=0.0)
