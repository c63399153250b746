"""The LP load bound, valid in every cost mode: min T with every kernel split over its feasible devices
and every device's load (and, for period_overlap, the host's links) at most T. For pipelines
(stage_serial) a device's load is its one stage's: with the model outputs it returns to the host and
the model inputs it reads from it, which only the host's stage is spared.
"""

from __future__ import annotations

import logging

import mip

from ..problem import Problem
from ..tolerances import SOLVER_SLACK
from ..toolkit.mip_backend import new_model
from .common import fastest_times

log = logging.getLogger(__name__)


def lp_load_bound(problem: Problem) -> float:
    """The LP load bound: every kernel split over its feasible devices, every load at most T. Kernels alike in every
    coefficient (the same time on every device, the same output to return, no model input) share one
    split: averaging the splits of two such kernels keeps every constraint, so the LP's value is the
    same, and a transformer's hundreds of kernels become a few dozen classes."""
    graph = problem.graph
    if not graph.kernels:
        return 0.0
    fastest = fastest_times(problem)
    unit = sum(fastest.values()) / len(graph.kernels) or 1.0  # seconds are tiny against solver tolerances
    reads_input = {k for graph_input in graph.inputs for k in graph_input.consumers}
    classes: dict[tuple, list[str]] = {}
    for kernel in graph.kernels:
        times = tuple((d, _own_load_s(problem, kernel, d)) for d in problem.feasible_devices(kernel))
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
        host_link_loads(problem, share, load, unit, model)
    elif problem.mode == "stage_serial":  # each stage on a device of its own, which pays the inputs it reads
        input_loads(problem, share, load, unit, model, lambda host, device: device)
    for terms in load.values():
        if terms:
            model += mip.xsum(terms) <= T
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
    pays it (stage_serial), its model output's return to the host."""
    seconds = problem.costs.compute_s(kernel, device)
    if problem.mode == "stage_serial":
        seconds += problem.output_return_s(kernel, device, empty_pays_latency=True)
    return seconds


def host_link_loads(problem: Problem, share: dict, load: dict, unit: float, model: mip.Model) -> None:
    """Add to ``load`` the host's links in a period: each model output returns from every device that
    makes a share of it, and each model input goes once to every device that reads a share of it.
    ``share``: (a class's first kernel, device) -> (the class's split variable, its kernels)."""
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    for (kernel, device), (x, count) in share.items():
        nbytes = graph.kernels[kernel].output_bytes
        if kernel in graph.output_set and nbytes > 0 and device != host:
            load.setdefault((device, host), []).append(count * costs.transfer_s(nbytes, device, host) / unit * x)
    input_loads(problem, share, load, unit, model, lambda host, device: (host, device))


def input_loads(problem: Problem, share: dict, load: dict, unit: float, model: mip.Model, charged) -> None:
    """Add to ``load`` each model input's copy from the host to every device that reads a share of it,
    charged to ``load[charged(host, device)]`` (the link, or the device's stage)."""
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    for graph_input in graph.inputs:
        for device in problem.platform.device_names:
            readers = [share[k, device][0] for k in graph_input.consumers if (k, device) in share]
            if device == host or not readers:
                continue
            needed = model.add_var(lb=0.0, ub=1.0)
            for x in readers:
                model += needed >= x
            load.setdefault(charged(host, device), []).append(
                costs.transfer_s(graph_input.bytes, host, device) / unit * needed
            )
