"""Brute-force oracles for latency, throughput and pipelines: the exact optima that exact solvers are tested against.

The latency optimum is taken over every assignment of kernels to devices (each kernel on a device it
may run on with a finite cost, co-location groups together, weights within memory) and every
per-device run order, scored by the simulator's ``latency`` mode (no link contention); a plan counts
only where the simulator finds it feasible (weights plus the peak of live activations in its run
order within each device's memory). The throughput optimum (``best_period``) is the least simulated
period over the same assignments; the pipeline optimum (``best_pipeline``) the least simulated
``stage_serial`` period over every split into ordered stages, each on a device of its own.

A combination of per-device orders runs without deadlock iff it is the restriction of one global
topological order; enumerating those would repeat each combination many times, so per device we
enumerate only the orders of kernels that no path orders (linear extensions of reachability), and
let the simulator reject the few combinations that deadlock across devices. Pruning keeps it fast
(7 kernels on 3 devices: about 0.1 s on average, 0.25 s at most): assignments are visited in
increasing order of a cheap bound (largest device load, longest path of compute), and the search
ends at the first whose cheap bound reaches the best value found. An assignment still in the race
gets a sharper bound (heads and tails along paths with its exact transfer times, and each device's
load between its earliest head and its smallest tail), is skipped when that reaches the best, and
its orders stop once one reaches it.
"""

from __future__ import annotations

import itertools
import math

from tvm_diviml.cost.base import CostModel
from tvm_diviml.graph import OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.platform import Platform
from tvm_diviml.problem import Problem
from tvm_diviml.simulator import PlanError, remote_sends, simulate


def best_latency(graph: OpGraph, platform: Platform, costs: CostModel) -> tuple[float, Plan | None]:
    """The least simulated latency of any feasible plan, and one plan that reaches it; (inf, None)
    where no plan is feasible."""
    ranked = sorted(
        (compute_lower_bound(graph, costs, assignment), index, assignment)
        for index, assignment in enumerate(feasible_assignments(graph, platform, costs))
    )
    ancestors = _ancestors(graph)
    best_value, best_plan = math.inf, None
    for quick_bound, _, assignment in ranked:
        if quick_bound >= best_value:
            break
        bound = assignment_lower_bound(graph, platform, costs, assignment)
        if bound >= best_value:
            continue
        for order in device_order_choices(graph, assignment, ancestors):
            plan = Plan(assignment, order=order)
            try:
                sim = simulate(Problem(graph, platform, costs), plan)
            except PlanError:  # the per-device orders deadlock across devices
                continue
            value = sim.value_s if sim.feasible else math.inf
            if value < best_value:
                best_value, best_plan = value, plan
            if best_value <= bound:
                break
    if best_plan is not None:
        best_plan.value_s = best_value
    return best_value, best_plan


def best_period(graph: OpGraph, platform: Platform, costs: CostModel, fixed: dict[str, str] | None = None) -> float:
    """The least simulated throughput period of any feasible assignment that agrees with ``fixed``
    (inf where none fits)."""
    best = math.inf
    for assignment in feasible_assignments(graph, platform, costs):
        if fixed and any(assignment[k] != d for k, d in fixed.items()):
            continue
        sim = simulate(Problem(graph, platform, costs), Plan(assignment, objective="throughput", mode="period_overlap"))
        if sim.feasible:
            best = min(best, sim.value_s)
    return best


def best_pipeline(problem: Problem) -> float:
    """The least simulated period of any feasible pipeline (inf where none fits: memory with
    activations, allowed devices, infinite costs, co-location): every labelling of the kernels with
    stages 0..K-1 that no edge runs backwards in, on every sequence of K distinct devices."""
    graph, stages = problem.graph, problem.stages
    names = graph.topo_order
    best, seen = math.inf, set()
    for labels in itertools.product(range(stages), repeat=len(names)):
        stage = dict(zip(names, labels))
        if any(stage[e.src] > stage[e.dst] for e in graph.edges):
            continue
        members = [[k for k in names if stage[k] == b] for b in range(stages)]
        for devices in itertools.permutations(problem.platform.device_names, stages):
            kept = tuple((tuple(s), d) for s, d in zip(members, devices) if s)
            if kept in seen:
                continue
            seen.add(kept)
            plan = Plan(
                {k: d for s, d in kept for k in s},
                objective="pipeline",
                mode="stage_serial",
                stages=[list(s) for s, _ in kept],
                stage_devices=[d for _, d in kept],
            )
            sim = simulate(problem, plan)
            if sim.feasible:
                best = min(best, sim.value_s)
    return best


def feasible_assignments(graph: OpGraph, platform: Platform, costs: CostModel):
    """Every {kernel: device} with allowed, finite-cost devices, co-location groups kept together and
    each device's weights within its memory (activations come on top: the simulator judges them)."""
    names = list(graph.kernels)
    choices = []
    for name in names:
        allowed = graph.kernels[name].allowed_devices
        choices.append(
            [
                d
                for d in platform.device_names
                if (allowed is None or d in allowed) and not math.isinf(costs.compute_s(name, d))
            ]
        )
    for devices in itertools.product(*choices):
        assignment = dict(zip(names, devices))
        group_device: dict[str, str] = {}
        if all(
            group_device.setdefault(graph.kernels[k].colocate, d) == d
            for k, d in assignment.items()
            if graph.kernels[k].colocate is not None
        ) and _weights_fit(graph, platform, assignment):
            yield assignment


def _weights_fit(graph: OpGraph, platform: Platform, assignment: dict[str, str]) -> bool:
    for device in set(assignment.values()):
        capacity = platform.device(device).memory_bytes
        if capacity is not None and graph.weight_bytes([k for k, d in assignment.items() if d == device]) > capacity:
            return False
    return True


def compute_lower_bound(graph: OpGraph, costs: CostModel, assignment: dict[str, str]) -> float:
    """A cheap bound that ignores transfers: the largest device load, and the longest path of compute."""
    compute = {k: costs.compute_s(k, d) for k, d in assignment.items()}
    load: dict[str, float] = {}
    for kernel, device in assignment.items():
        load[device] = load.get(device, 0.0) + compute[kernel]
    finish: dict[str, float] = {}
    for kernel in graph.topo_order:
        finish[kernel] = max((finish[e.src] for e in graph.pred[kernel]), default=0.0) + compute[kernel]
    return max(*load.values(), *finish.values())


def assignment_lower_bound(graph: OpGraph, platform: Platform, costs: CostModel, assignment: dict[str, str]) -> float:
    """A latency no order can beat with this assignment (transfers as the simulator charges them)."""
    host = platform.host
    compute = {k: costs.compute_s(k, d) for k, d in assignment.items()}
    arrival_delay: dict[str, dict[str, float]] = {}  # producer -> device -> transfer seconds
    for kernel in graph.kernels:
        sends = remote_sends(graph, assignment, kernel)
        output = graph.kernels[kernel].output_bytes
        if kernel in graph.output_set and assignment[kernel] != host and output > 0:
            sends[host] = max(sends.get(host, 0.0), output)
        arrival_delay[kernel] = {e: costs.transfer_s(b, assignment[kernel], e) for e, b in sends.items()}
    head = {k: 0.0 for k in graph.kernels}
    for graph_input in graph.inputs:
        for consumer in graph_input.consumers:
            head[consumer] = max(head[consumer], costs.transfer_s(graph_input.bytes, host, assignment[consumer]))
    for kernel in graph.topo_order:
        for edge in graph.succ[kernel]:
            delay = arrival_delay[kernel].get(assignment[edge.dst], 0.0)
            head[edge.dst] = max(head[edge.dst], head[kernel] + compute[kernel] + delay)
    tail = {k: arrival_delay[k].get(host, 0.0) if k in graph.output_set else 0.0 for k in graph.kernels}
    for kernel in reversed(graph.topo_order):
        for edge in graph.succ[kernel]:
            delay = arrival_delay[kernel].get(assignment[edge.dst], 0.0)
            tail[kernel] = max(tail[kernel], delay + compute[edge.dst] + tail[edge.dst])
    bound = max(head[k] + compute[k] + tail[k] for k in graph.kernels)
    for device in set(assignment.values()):
        on_device = [k for k, d in assignment.items() if d == device]
        bound = max(
            bound,
            min(head[k] for k in on_device) + sum(compute[k] for k in on_device) + min(tail[k] for k in on_device),
        )
    return bound


def device_order_choices(graph: OpGraph, assignment: dict[str, str], ancestors: dict[str, frozenset[str]]):
    """Every combination of per-device orders that respects the paths between kernels of one device."""
    per_device: dict[str, list[str]] = {}
    for kernel in graph.topo_order:
        per_device.setdefault(assignment[kernel], []).append(kernel)
    devices = list(per_device)
    options = [list(_linear_extensions(per_device[d], ancestors)) for d in devices]
    for combination in itertools.product(*options):
        yield dict(zip(devices, combination))


def _ancestors(graph: OpGraph) -> dict[str, frozenset[str]]:
    found: dict[str, frozenset[str]] = {}
    for kernel in graph.topo_order:
        found[kernel] = frozenset().union(*({e.src} | found[e.src] for e in graph.pred[kernel]))
    return found


def _linear_extensions(kernels: list[str], ancestors: dict[str, frozenset[str]]):
    """Orders of ``kernels`` (given in topological order) in which no kernel precedes an ancestor."""
    if not kernels:
        yield []
        return
    members = set(kernels)
    for index, kernel in enumerate(kernels):
        if not (ancestors[kernel] & members):
            for rest in _linear_extensions(kernels[:index] + kernels[index + 1 :], ancestors):
                yield [kernel, *rest]
