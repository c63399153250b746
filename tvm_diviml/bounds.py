"""Lower bounds on the best value any plan can reach (TVM-free).

Each part is a valid bound on its own; the reported bound is their maximum. Kernels are priced at
their fastest feasible device and communication is free (pipelines: the cheapest link), so no
bound depends on a plan.

- ``critical_path`` (latency): the longest path of fastest-device times.
- ``transfer_path`` (latency): the same path with transfers priced: each kernel's earliest finish on
  each device, its inputs arriving from wherever their producers finish earliest (the model's inputs
  from the host), and each model output back on the host. Where the fastest device is far from the
  host (another server), this is the bound that sees the network.
- ``largest_kernel``: one kernel alone needs at least its fastest time (not valid for
  ``period_overlap``, where a replicated kernel splits the stream).
- ``average_load``: the devices' loads sum to at least the sum of fastest times, so the largest is
  at least that sum over the number of devices (over the number of stages for pipelines).
- ``lp_load`` (every mode): min T s.t. every kernel is split over its feasible devices (fractions
  summing to 1) and every device's load is at most T. It knows that devices differ, so it beats
  ``average_load`` on heterogeneous machines; with replicas it still holds, because a replicated
  kernel is exactly such a fractional split; for pipelines each stage has a device of its own and
  costs at least its work there; in ``host_staged`` a device's load is its work plus transfers, so
  compute alone relaxes it. In ``period_overlap`` the host's links are loads too: model outputs return
  to the host and model inputs leave it, from and to every device that takes a share.
- ``largest_group`` (every mode): a co-location group's work on the cheapest device that can run it
  all, since the group shares one device (msr-fiddle's colour classes).
- ``stage_serial`` (pipelines): ``solvers.mtpp.pipeline_bounds`` prices ``average_load`` and
  ``largest_kernel`` with output returns and model inputs, and, given ``mip_time_limit_s``, adds
  the MIP bounds ``three_superblock``, ``guess_bottleneck`` and ``exact_mip``.
"""
from __future__ import annotations

import logging

import mip
import numpy as np

from .solvers.base import Problem
from .solvers.milp import new_model
from .solvers.mtpp import pipeline_bounds

log = logging.getLogger(__name__)


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
        parts["transfer_path"] = transfer_path_bound(problem)
    return parts


def transfer_path_bound(problem: Problem) -> float:
    """``transfer_path`` (module docstring): earliest finishes per (kernel, device), transfers priced
    and contention ignored, so every plan's makespan is at least the largest of them."""
    graph, costs, platform = problem.graph, problem.costs, problem.platform
    devices = platform.device_names
    host = devices.index(platform.host)
    moves: dict[float, np.ndarray] = {}
    affine = _affine_links(costs, devices)

    def move_s(nbytes: float) -> np.ndarray:
        """[src, dst] seconds to move ``nbytes`` (zero on the diagonal)."""
        if nbytes <= 0:
            return np.zeros((len(devices), len(devices)))
        if affine is not None:
            return affine[0] + nbytes * affine[1]
        if nbytes not in moves:
            moves[nbytes] = np.array([[0.0 if a == b else costs.transfer_s(nbytes, a, b) for b in devices]
                                      for a in devices])
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


def _affine_links(costs, devices: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """(latency, seconds per byte) of every link, when each transfer costs latency + bytes x rate
    (checked at a third size); None otherwise. A graph with thousands of distinct tensor sizes on
    64 devices would otherwise ask the cost model for millions of transfers."""
    small, large, middle = 1.0, float(2**30), float(2**20)
    size = len(devices)
    at = {n: np.array([[0.0 if a == b else costs.transfer_s(n, a, b) for b in devices] for a in devices])
          for n in (small, large, middle)}
    rate = (at[large] - at[small]) / (large - small)
    latency = at[small] - small * rate
    predicted = latency + middle * rate
    if not np.allclose(predicted, at[middle], rtol=1e-9, atol=1e-15):
        return None
    return latency * (1 - np.eye(size)), rate * (1 - np.eye(size))


def _host_link_loads(problem: Problem, share: dict, load: dict, unit: float, model: mip.Model) -> None:
    """Add to ``load`` the host's links in a period: each model output returns from every device that
    makes a share of it, and each model input goes once to every device that reads a share of it.
    ``share``: (a class's first kernel, device) -> (the class's split variable, its kernels)."""
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    for (kernel, device), (x, count) in share.items():
        nbytes = graph.kernels[kernel].output_bytes
        if kernel in graph.output_set and nbytes > 0 and device != host:
            load.setdefault((device, host), []).append(count * costs.transfer_s(nbytes, device, host) / unit * x)
    for graph_input in graph.inputs:
        for device in problem.platform.device_names:
            readers = [share[k, device][0] for k in graph_input.consumers if (k, device) in share]
            if device == host or not readers:
                continue
            needed = model.add_var(lb=0.0, ub=1.0)
            for x in readers:
                model += needed >= x
            load.setdefault((host, device), []).append(costs.transfer_s(graph_input.bytes, host, device) / unit * needed)


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
    """The LP load bound (DESIGN.md "Lower bounds for placement", (ii)). Kernels alike in every
    coefficient (the same time on every device, the same output to return, no model input) share one
    split: averaging the splits of two such kernels keeps every constraint, so the LP's value is the
    same, and a transformer's hundreds of kernels become a few dozen classes."""
    graph = problem.graph
    if not graph.kernels:
        return 0.0
    fastest = fastest_times(problem)
    unit = sum(fastest.values()) / len(graph.kernels) or 1.0       # seconds are tiny against solver tolerances
    reads_input = {k for graph_input in graph.inputs for k in graph_input.consumers}
    classes: dict[tuple, list[str]] = {}
    for kernel in graph.kernels:
        times = tuple((d, problem.costs.compute_s(kernel, d)) for d in problem.feasible_devices(kernel))
        returned = graph.kernels[kernel].output_bytes if kernel in graph.output_set else None
        classes.setdefault((times, returned, kernel if kernel in reads_input else None), []).append(kernel)
    model = new_model("lp_load", "highs")
    T = model.add_var(lb=0.0)
    load: dict = {d: [] for d in problem.platform.device_names}
    share: dict[tuple[str, str], tuple[mip.Var, int]] = {}
    for (times, _, _), members in classes.items():
        for device, seconds in times:
            x = model.add_var(lb=0.0, ub=1.0)
            share[members[0], device] = (x, len(members))
            load[device].append(len(members) * seconds / unit * x)
        model += mip.xsum(share[members[0], d][0] for d, _ in times) == 1
    if problem.mode == "period_overlap":
        _host_link_loads(problem, share, load, unit, model)
    for terms in load.values():
        if terms:
            model += mip.xsum(terms) <= T
    try:
        model.objective = mip.minimize(T)
        status = model.optimize(relax=True)
    except mip.InterfacingError as error:      # HiGHS refuses coefficients such as 1e300 s: no bound from the LP
        log.warning("the load LP bound is left out: HiGHS cannot take these costs (%s)", error)
        return 0.0
    if status != mip.OptimizationStatus.OPTIMAL:
        return 0.0
    # An LP solved to optimality: its value is the bound, less a relative slack for the solver's tolerances.
    return max(model.objective_value, 0.0) * unit * (1 - 1e-6)
