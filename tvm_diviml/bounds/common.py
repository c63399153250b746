"""Pieces every bound shares: each kernel at its fastest device, and the largest co-location group."""

from __future__ import annotations

from ..problem import Problem


def fastest_times(problem: Problem) -> dict[str, float]:
    """Each kernel's time on its fastest feasible device; kept in ``problem.memo`` (several bounds read
    it: callers do not change it)."""
    if "fastest_times" not in problem.memo:
        times = {}
        for kernel in problem.graph.kernels:
            devices = problem.feasible_devices(kernel)
            times[kernel] = min((problem.costs.compute_s(kernel, d) for d in devices), default=float("inf"))
        problem.memo["fastest_times"] = times
    return problem.memo["fastest_times"]


def largest_group(problem: Problem) -> float:
    """The largest co-location group's work on the cheapest device that may run all of it: the group
    shares one device (never replicated, never split over stages), so that device's load, and the
    period or the makespan, is at least this. 0 without groups; inf when no device runs a whole group."""
    members: dict[str, list[str]] = {}
    for kernel in problem.graph.kernels.values():
        if kernel.colocate is not None:
            members.setdefault(kernel.colocate, []).append(kernel.name)
    largest = 0.0
    for kernels in members.values():
        common = set.intersection(*(set(problem.feasible_devices(k)) for k in kernels))
        work = [sum(problem.costs.compute_s(k, d) for k in kernels) for d in common]
        largest = max(largest, min(work, default=float("inf")))
    return largest
