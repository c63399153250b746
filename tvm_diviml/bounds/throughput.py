"""The LP load bound, valid in every cost mode: min T with every kernel split over its feasible devices
and every device's load (and, for period_overlap, the host's links) at most T. For pipelines
(stage_serial) a device's load is its one stage's: with the model outputs it returns to the host and
the model inputs it reads from it, which only the host's stage is spared.

Identical devices (the same price for everything the LP charges) are one class: its share of a
kernel is the sum of its devices' shares, within the class's size times T. That is the sum of their
constraints (a relaxation), and by symmetry no weaker: averaging a solution over the class keeps it
feasible. On 64 identical GPUs the LP has 2,000 variables instead of 128,000 (5.5 s -> 0.1 s).
"""

from __future__ import annotations

import logging
import math

import mip
import numpy as np

from ..problem import Problem
from ..tolerances import SOLVER_SLACK
from ..toolkit.device_classes import identical_devices
from ..toolkit.mip_backend import new_model
from .common import fastest_times

log = logging.getLogger(__name__)


def lp_load_bound(problem: Problem) -> float:
    """The LP load bound: every kernel split over its feasible devices, every load at most T. Kernels alike in every
    coefficient (the same time on every device, the same output to return, no model input) share one
    split: averaging the splits of two such kernels keeps every constraint, so the LP's value is the
    same, and a transformer's hundreds of kernels become a few dozen classes."""
    graph, platform, costs = problem.graph, problem.platform, problem.costs
    if not graph.kernels:
        return 0.0
    fastest = fastest_times(problem)
    unit = sum(fastest.values()) / len(graph.kernels) or 1.0  # seconds are tiny against solver tolerances
    host, kernels = platform.host, list(graph.kernels)
    outputs = [k for k in kernels if k in graph.output_set and graph.kernels[k].output_bytes > 0]
    host_pays = problem.mode in ("period_overlap", "stage_serial")  # the host alone reads and returns for free

    def describe(device: str) -> tuple:
        own = np.array([_own_load_s(problem, k, device) for k in kernels])
        returns = [costs.transfer_s(graph.kernels[k].output_bytes, device, host) for k in outputs]
        reads = [costs.transfer_s(i.bytes, host, device) for i in graph.inputs]
        return own, np.array(returns), np.array(reads), host_pays and device == host

    device_classes = identical_devices(platform.device_names, describe)
    reads_input = {k for graph_input in graph.inputs for k in graph_input.consumers}
    kernel_classes: dict[tuple, list[int]] = {}
    for v, kernel in enumerate(kernels):
        times = tuple(float(own[v]) for _, (own, *_) in device_classes)
        returned = graph.kernels[kernel].output_bytes if kernel in graph.output_set else None
        kernel_classes.setdefault((times, returned, kernel if kernel in reads_input else None), []).append(v)
    model = new_model("lp_load", "highs")
    T = model.add_var(lb=0.0)
    load: dict[tuple[str, int], list] = {("compute", c): [] for c in range(len(device_classes))}
    share: dict[tuple[int, int], tuple[mip.Var, int]] = {}
    for (times, _, _), members in kernel_classes.items():
        for c, seconds in enumerate(times):
            if math.isfinite(seconds):
                x = model.add_var(lb=0.0, ub=1.0)
                share[members[0], c] = (x, len(members))
                load["compute", c].append(len(members) * seconds / unit * x)
        model += mip.xsum(share[members[0], c][0] for c in range(len(times)) if (members[0], c) in share) == 1
    sizes = [len(devices) for devices, _ in device_classes]
    if problem.mode == "period_overlap":
        host_link_loads(problem, device_classes, share, load, unit, model)
    elif problem.mode == "stage_serial":  # each stage on a device of its own, which pays the inputs it reads
        input_loads(problem, device_classes, share, load, unit, model, "compute")
    for (_, c), terms in load.items():  # a class's devices each within T
        if terms:
            model += mip.xsum(terms) <= sizes[c] * T
    try:
        model.objective = mip.minimize(T)
        status = model.optimize(relax=True)
    except mip.InterfacingError as error:  # HiGHS refuses coefficients such as 1e300 s: no bound from the LP
        log.warning("the load LP bound is left out: HiGHS cannot take these costs (%s)", error)
        return 0.0
    if status != mip.OptimizationStatus.OPTIMAL:
        return 0.0
    # An LP solved to optimality: its value is the bound, less a relative slack for the solver's tolerances.
    return max(model.objective_value, 0.0) * unit * (1 - SOLVER_SLACK)


def _own_load_s(problem: Problem, kernel: str, device: str) -> float:
    """What ``kernel`` adds to ``device``'s load whatever else runs there: its time and, where a stage
    pays it (stage_serial), its model output's return to the host; inf where it may not run there."""
    if device not in problem.feasible_devices(kernel):
        return math.inf
    seconds = problem.costs.compute_s(kernel, device)
    if problem.mode == "stage_serial":
        seconds += problem.output_return_s(kernel, device, empty_pays_latency=True)
    return seconds


def host_link_loads(
    problem: Problem, device_classes: list, share: dict, load: dict, unit: float, model: mip.Model
) -> None:
    """Add to ``load`` the host's links in a period, per device class (keys ("return", c) and
    ("read", c)): each model output returns from every device that makes a share of it, and each
    model input goes once to every device that reads a share of it. ``share``: (a kernel class's
    first kernel id, device class) -> (the class's split variable, its kernels)."""
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    kernels = list(graph.kernels)
    for (v, c), (x, count) in share.items():
        device = device_classes[c][0][0]
        nbytes = graph.kernels[kernels[v]].output_bytes
        if kernels[v] in graph.output_set and nbytes > 0 and device != host:
            load.setdefault(("return", c), []).append(count * costs.transfer_s(nbytes, device, host) / unit * x)
    input_loads(problem, device_classes, share, load, unit, model, "read")


def input_loads(
    problem: Problem, device_classes: list, share: dict, load: dict, unit: float, model: mip.Model, charged: str
) -> None:
    """Add to ``load`` each model input's copy from the host to every device that reads a share of it,
    charged to ``load[charged, c]`` for device class c (its links, "read", or its stages, "compute"): at
    least the largest share of a reader in the class, at most one copy per device."""
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    index = {k: v for v, k in enumerate(graph.kernels)}
    for graph_input in graph.inputs:
        for c, (devices, _) in enumerate(device_classes):
            readers = [share[index[k], c][0] for k in graph_input.consumers if (index[k], c) in share]
            if host in devices or not readers:
                continue
            needed = model.add_var(lb=0.0, ub=len(devices))
            for x in readers:
                model += needed >= x
            load.setdefault((charged, c), []).append(
                costs.transfer_s(graph_input.bytes, host, devices[0]) / unit * needed
            )
