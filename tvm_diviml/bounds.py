"""Lower bounds on the best value any plan can reach (TVM-free).

Each part is a valid bound on its own; the reported bound is their maximum. Kernels are priced at
their fastest feasible device and communication is free (pipelines: the cheapest link), so no
bound depends on a plan.

- ``critical_path`` (latency): the longest path of fastest-device times.
- ``largest_kernel``: one kernel alone needs at least its fastest time (not valid for
  ``period_overlap``, where a replicated kernel splits the stream).
- ``average_load``: the devices' loads sum to at least the sum of fastest times, so the largest is
  at least that sum over the number of devices (over the number of stages for pipelines).
- ``lp_load`` (every mode): min T s.t. every kernel is split over its feasible devices (fractions
  summing to 1) and every device's load is at most T. It knows that devices differ, so it beats
  ``average_load`` on heterogeneous machines; with replicas it still holds, because a replicated
  kernel is exactly such a fractional split; for pipelines each stage has a device of its own and
  costs at least its work there; in ``host_staged`` a device's load is its work plus transfers, so
  compute alone relaxes it.
- ``largest_group`` (every mode): a co-location group's work on the cheapest device that can run it
  all, since the group shares one device (msr-fiddle's colour classes).
- ``stage_serial`` (pipelines): ``solvers.mtpp.pipeline_bounds`` prices ``average_load`` and
  ``largest_kernel`` with output returns and model inputs, and, given ``mip_time_limit_s``, adds
  the MIP bounds ``three_superblock``, ``guess_bottleneck`` and ``exact_mip``.
"""
from __future__ import annotations

import mip

from .solvers.base import Problem
from .solvers.milp import new_model
from .solvers.mtpp import pipeline_bounds


def fastest_times(problem: Problem) -> dict[str, float]:
    """Each kernel's time on its fastest feasible device."""
    times = {}
    for kernel in problem.graph.kernels:
        devices = problem.feasible_devices(kernel)
        times[kernel] = min((problem.costs.compute_s(kernel, d) for d in devices), default=float("inf"))
    return times


def lower_bounds(problem: Problem, mip_time_limit_s: float = 0.0) -> dict[str, float]:
    """Named lower bounds valid for ``problem``'s objective and cost mode. ``mip_time_limit_s`` > 0
    adds the MIP bounds of pipelines (seconds shared among them); 0 keeps every bound cheap."""
    graph, mode = problem.graph, problem.mode
    fastest = fastest_times(problem)
    parts: dict[str, float] = {}
    if mode == "stage_serial":
        parts.update(pipeline_bounds(problem, mip_time_limit_s))
    else:
        parts["average_load"] = sum(fastest.values()) / len(problem.platform.devices)
        if mode != "period_overlap":
            parts["largest_kernel"] = max(fastest.values(), default=0.0)
    parts["lp_load"] = lp_load_bound(problem)
    group = largest_group(problem)
    if group > 0:
        parts["largest_group"] = group
    if mode == "latency":
        finish: dict[str, float] = {}
        for kernel in graph.topo_order:
            ready = max((finish[e.src] for e in graph.pred[kernel]), default=0.0)
            finish[kernel] = ready + fastest[kernel]
        parts["critical_path"] = max(finish.values(), default=0.0)
    return parts


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


def lower_bound(problem: Problem, mip_time_limit_s: float = 0.0) -> float:
    return max(lower_bounds(problem, mip_time_limit_s).values(), default=0.0)


def lp_load_bound(problem: Problem) -> float:
    """The LP load bound (DESIGN.md "Lower bounds for placement", (ii))."""
    kernels = list(problem.graph.kernels)
    if not kernels:
        return 0.0
    fastest = fastest_times(problem)
    unit = sum(fastest.values()) / len(kernels) or 1.0       # seconds are tiny against solver tolerances
    model = new_model("lp_load", "highs")
    T = model.add_var(lb=0.0)
    load: dict[str, list] = {d: [] for d in problem.platform.device_names}
    for kernel in kernels:
        shares = []
        for device in problem.feasible_devices(kernel):
            x = model.add_var(lb=0.0, ub=1.0)
            shares.append(x)
            load[device].append(problem.costs.compute_s(kernel, device) / unit * x)
        model += mip.xsum(shares) == 1
    for terms in load.values():
        if terms:
            model += mip.xsum(terms) <= T
    model.objective = mip.minimize(T)
    status = model.optimize(relax=True)
    if status != mip.OptimizationStatus.OPTIMAL:
        return 0.0
    # An LP solved to optimality: its value is the bound, less a relative slack for the solver's tolerances.
    return max(model.objective_value, 0.0) * unit * (1 - 1e-6)
