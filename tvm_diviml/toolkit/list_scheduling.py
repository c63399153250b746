"""List scheduling: each kernel placed once, in an order, by a rule (docs/solvers.md#list-scheduling).

Latency: ``fastest_device_placement`` (what a user gets without a placement tool) and
``heft_placement`` (Topcuoglu et al. 2002: upward rank, insertion-based earliest finish, transfers
priced as the simulator's ``latency`` mode does). Throughput: ``balance_greedy``, each kernel where it
least raises the period. All place through a ``DeviceBudget`` (allowed devices, co-location, memory).
"""

from __future__ import annotations

import bisect
import copy
import logging
from collections import defaultdict
from collections.abc import Callable

from ..plan import Plan
from ..problem import Problem
from ..simulator import device_orders
from .constraints import DeviceBudget, model_inputs_of, place_within_memory
from .deadline import Deadline
from .throughput_model import throughput_plan

log = logging.getLogger(__name__)


def fastest_device_placement(budget: DeviceBudget) -> Plan:
    """Fastest allowed device per kernel; at a co-location group's first member, the device
    fastest for the whole group."""
    problem = budget.problem
    for kernel in problem.graph.topo_order:
        devices = budget.allowed(kernel)
        members = budget.moving_with(kernel)
        seconds = [sum(problem.costs.compute_s(m, d) for m in members) for d in devices]
        budget.place(kernel, devices[seconds.index(min(seconds))])
    plan = Plan(dict(budget.device_of), objective="latency", mode="latency")
    plan.order = device_orders(problem.graph, plan)
    return plan


def heft_placement(budget: DeviceBudget) -> Plan:
    """HEFT: kernels by decreasing upward rank, each where it finishes earliest, gaps filled."""
    problem = budget.problem
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    ranks = upward_ranks(problem, budget.deadline)
    inputs_of = model_inputs_of(graph)
    timelines = {d: Timeline() for d in problem.platform.device_names}
    finish: dict[str, float] = {}
    sent_bytes: dict[tuple[str, str], float] = {}  # (producer, device) -> bytes crossing there
    estimate = 0.0
    for kernel in sorted(graph.kernels, key=lambda k: (-ranks[k], graph.position[k])):
        best = None
        rest_of_group = [m for m in budget.moving_with(kernel) if m != kernel]
        for device in budget.allowed(kernel):
            ready = 0.0
            for edge in graph.pred[kernel]:
                there = budget.device_of[edge.src]
                nbytes = max(sent_bytes.get((edge.src, device), 0.0), edge.bytes)
                ready = max(ready, finish[edge.src] + costs.transfer_s(nbytes, there, device))
            for nbytes in inputs_of.get(kernel, ()):
                ready = max(ready, costs.transfer_s(nbytes, host, device))
            seconds = costs.compute_s(kernel, device)
            slot, start = timelines[device].earliest_slot(ready, seconds)
            done = start + seconds
            seen = done + problem.output_return_s(kernel, device)
            committed = seen + sum(costs.compute_s(m, device) for m in rest_of_group)
            if best is None or committed < best[0]:
                best = (committed, seen, device, slot, start, done)
        _, seen, device, slot, start, done = best
        budget.place(kernel, device)
        timelines[device].insert(slot, start, done, kernel)
        finish[kernel] = done
        estimate = max(estimate, seen)
        for edge in graph.pred[kernel]:
            if budget.device_of[edge.src] != device:
                key = (edge.src, device)
                sent_bytes[key] = max(sent_bytes.get(key, 0.0), edge.bytes)
    order = {d: line.kernels for d, line in timelines.items() if line.kernels}
    return Plan(
        dict(budget.device_of), objective="latency", mode="latency", order=order, attrs={"heft_estimate_s": estimate}
    )


def upward_ranks(problem: Problem, deadline: Deadline | None = None) -> dict[str, float]:
    """HEFT's rank_u: the mean-cost length of the longest path from a kernel to the end, the
    kernel included; an output's path ends with its mean return to the host. ``OutOfTime`` past
    ``deadline``."""
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    latency, per_byte = mean_link(problem)
    ranks: dict[str, float] = {}
    for kernel in reversed(graph.topo_order):
        if deadline is not None:
            deadline.check("HEFT's ranking")
        devices = problem.feasible_devices(kernel)
        compute = sum(costs.compute_s(kernel, d) for d in devices) / len(devices)
        tail = 0.0
        if kernel in graph.output_set and graph.kernels[kernel].output_bytes > 0:
            nbytes = graph.kernels[kernel].output_bytes
            tail = sum(costs.transfer_s(nbytes, d, host) for d in devices) / len(devices)
        for edge in graph.succ[kernel]:
            transfer = latency + per_byte * edge.bytes if edge.bytes > 0 else 0.0
            tail = max(tail, transfer + ranks[edge.dst])
        ranks[kernel] = compute + tail
    return ranks


def mean_link(problem: Problem) -> tuple[float, float]:
    """Latency and seconds per byte of the mean link over ordered pairs of distinct devices
    (Topcuoglu's averaged communication cost), read off the cost model's affine links at 1 and 2
    bytes, so that ranking costs O(devices^2) once instead of per edge."""
    devices = problem.platform.device_names
    pairs = [(a, b) for a in devices for b in devices if a != b]
    if not pairs:
        return 0.0, 0.0
    one = sum(problem.costs.transfer_s(1.0, a, b) for a, b in pairs) / len(pairs)
    two = sum(problem.costs.transfer_s(2.0, a, b) for a, b in pairs) / len(pairs)
    return one - (two - one), two - one


# Gaps HEFT's insertion tries past a kernel's ready time before it appends the kernel at the end:
# every gap on devices of up to this many kernels, and a linear (not quadratic) search at scale.
INSERTION_WINDOW = 64


class Timeline:
    """One device's busy intervals in run order (sorted by start, hence by finish)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.finishes: list[float] = []
        self.kernels: list[str] = []

    def earliest_slot(self, ready: float, seconds: float) -> tuple[int, float]:
        """(list position, start) of the earliest idle gap that fits ``seconds`` from ``ready`` on,
        among the ``INSERTION_WINDOW`` gaps after ``ready``, else the end of the timeline.

        A kernel may be put before an interval only if it starts strictly before it, so kernels
        that start at one instant keep the order they were placed in, which is topological.
        """
        index = bisect.bisect_left(self.starts, ready + seconds)
        last = min(len(self.starts), index + INSERTION_WINDOW)
        while index < last:
            start = max(ready, self.finishes[index - 1]) if index > 0 else ready
            if start + seconds <= self.starts[index] and start < self.starts[index]:
                return index, start
            index += 1
        return len(self.starts), max(ready, self.finishes[-1]) if self.finishes else ready

    def insert(self, index: int, start: float, finish: float, kernel: str) -> None:
        self.starts.insert(index, start)
        self.finishes.insert(index, finish)
        self.kernels.insert(index, kernel)


def list_schedule_plan(
    problem: Problem,
    place: Callable[[DeviceBudget], Plan],
    name: str,
    reserve: dict[str, float] | None = None,
    deadline: Deadline | None = None,
) -> Plan:
    """A latency list schedule under the memory budget, claimed at the simulator's value (which may
    report an overflow: callers decide what to do with it). Without a ``reserve``, scheduled once per
    problem (``Problem.memo``); each caller gets its own copy. ``OutOfTime`` where ``deadline`` passes
    before it is made."""
    key = ("list_schedule", place, name)
    if reserve is None and key in problem.memo:
        return copy.deepcopy(problem.memo[key])
    plan, sim = place_within_memory(problem, place, reserve, deadline=deadline)
    plan.solver, plan.value_s, plan.optimal = name, sim.value_s, False
    log.info(
        "%s: %.6g s, kernels per device %s%s",
        name,
        sim.value_s,
        {d: len(v) for d, v in plan.order.items()},
        "" if sim.feasible else f"; {'; '.join(sim.problems)}",
    )
    if reserve is None:
        problem.memo[key] = copy.deepcopy(plan)
    return plan


# ---------------------------------------------------------------------- heuristics
def balance_greedy(budget: DeviceBudget) -> Plan:
    """Kernels in topological order, each to the device with the least resulting period (its compute
    and every transfer it adds: its producers' tensors, model inputs, its output's return), ties to
    the least added load, then platform order. A co-location group's first member weighs the whole
    group's compute on each device."""
    problem = budget.problem
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    inputs_of: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for graph_input in graph.inputs:
        for consumer in dict.fromkeys(graph_input.consumers):
            inputs_of[consumer].append((graph_input.name, graph_input.bytes))
    load: dict[tuple, float] = defaultdict(float)
    crossed: dict[tuple[str, str], float] = {}  # (tensor, device) -> bytes sent there so far
    period = 0.0
    for kernel in graph.topo_order:
        best = None
        for rank, device in enumerate(budget.allowed(kernel)):
            added: dict[tuple, float] = defaultdict(float)
            added["device", device] = sum(costs.compute_s(m, device) for m in budget.moving_with(kernel))
            for edge in graph.pred[kernel]:
                src = budget.device_of[edge.src]
                sent = crossed.get((edge.src, device), 0.0)
                if src != device and edge.bytes > sent:
                    grown = costs.transfer_s(edge.bytes, src, device) - costs.transfer_s(sent, src, device)
                    added["link", src, device] += grown
            for name, nbytes in inputs_of[kernel]:
                if device != host and (name, device) not in crossed:
                    added["link", host, device] += costs.transfer_s(nbytes, host, device)
            out = graph.kernels[kernel].output_bytes
            if kernel in graph.output_set and out > 0 and device != host:
                added["link", device, host] += costs.transfer_s(out, device, host)
            key = (max([period, *(load[r] + s for r, s in added.items())]), sum(added.values()), rank)
            if best is None or key < best[0]:
                best = (key, device, added)
        _, device, added = best
        added["device", device] = costs.compute_s(kernel, device)  # the rest of a group pays when placed
        for resource, seconds in added.items():
            load[resource] += seconds
            period = max(period, load[resource])
        for edge in graph.pred[kernel]:
            key = (edge.src, device)
            crossed[key] = max(crossed.get(key, 0.0), edge.bytes)
        for name, _ in inputs_of[kernel]:
            crossed[name, device] = 0.0
        budget.place(kernel, device)
    return throughput_plan(budget.device_of, "greedy")


def greedy_throughput(
    problem: Problem, reserve: dict[str, float] | None = None, solver: str = "greedy", deadline: Deadline | None = None
) -> Plan:
    """``balance_greedy`` under the memory budget (placed again where activations outgrew the reserve),
    for a problem its solver has checked (throughput in ``period_overlap`` mode); ``OutOfTime`` where
    ``deadline`` passes before it is made."""
    plan, sim = place_within_memory(problem, balance_greedy, reserve, deadline=deadline)
    plan.solver, plan.value_s, plan.optimal = solver, sim.value_s, False
    log.info("%s (throughput): period %.6g s%s", solver, sim.value_s, "" if sim.feasible else f"; {sim.problems}")
    return plan
