"""List scheduling for one inference's latency: the baselines ``greedy`` and ``heft``.

- ``greedy``: every kernel on its fastest allowed device, communication ignored; each device runs
  its kernels in the graph's topological order. What a user gets without a placement tool.
- ``heft``: Heterogeneous Earliest Finish Time (Topcuoglu, Hariri and Wu, IEEE TPDS 2002). Kernels
  are taken in decreasing *upward rank*, rank(v) = mean compute time of v over its feasible devices
  + the largest (mean transfer time of an out-edge + rank of its consumer), where a mean transfer is
  taken over the ordered pairs of distinct devices. Each kernel goes to the device where it finishes
  earliest, and may fill an idle gap left earlier on that device (insertion-based scheduling).
  The first member of a co-location group decides the device of the whole group, so there the
  finish time is compared plus the other members' compute time on each device (otherwise a
  group whose first member is cheap everywhere follows it to a slow device).

HEFT prices transfers as the simulator's ``latency`` mode does (links do not contend): model inputs
start on the platform's host and cross once to each device that reads them; a tensor crosses to a
device once, carrying the largest edge any consumer there reads; an output made off the host
returns to it, and HEFT counts that return when it chooses an output's device. Because a tensor
already sent to a device may grow when a later consumer there reads a larger edge, the simulator
can start kernels later than HEFT assumed, never earlier: HEFT's own makespan is kept in
``plan.attrs["heft_estimate_s"]`` (equal to the simulated value when every edge carries its
producer's whole output), and ``value_s`` is the simulator's.

Both respect allowed devices, infinite costs, co-location and memory through ``DeviceBudget``.
Ties go to the earlier kernel in topological order, then to the earlier device in platform order.
"""
from __future__ import annotations

import bisect
import logging
import time
from abc import abstractmethod

from ..errors import DivimlInputError
from ..plan import Plan
from ..simulator import device_orders, simulate
from .base import Problem, Solver
from .constraints import DeviceBudget, model_inputs_of, place_within_memory

log = logging.getLogger(__name__)


class _ListScheduler(Solver):
    """Shared by both baselines: memory repair, the simulator's value as the claim. Where the list
    schedule finds no placement within memory (its commitments can leave no room although a plan
    exists), the exact MILP places the model, or proves that nothing fits, and the plan says so;
    ``exact_fallback=False`` (the MILP's own warm start) returns the overflowing plan instead."""

    objectives = ("latency",)

    def __init__(self, *, time_limit_s: float = 60.0, seed: int = 0, reserve: dict[str, float] | None = None,
                 exact_fallback: bool = True):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        self.reserve, self.exact_fallback = reserve, exact_fallback

    def solve(self, problem: Problem) -> Plan:
        self.check_objective(problem)
        began = time.perf_counter()
        problem.validate()
        try:
            plan = self.schedule(problem)
        except DivimlInputError as error:
            if error.field != "memory_bytes" or not self.exact_fallback:
                raise
            return self._exact_fallback(problem, began, error.detail)
        sim = simulate(problem.graph, problem.platform, problem.costs, plan)
        if not sim.feasible and self.exact_fallback:
            return self._exact_fallback(problem, began, "; ".join(sim.problems))
        plan.solve_s = time.perf_counter() - began
        return plan

    def schedule(self, problem: Problem) -> Plan:
        """The list schedule under the memory budget (latency)."""
        plan, sim = place_within_memory(problem, self.place, self.reserve)
        plan.solver, plan.value_s, plan.optimal = self.name, sim.value_s, False
        log.info("%s: %.6g s, kernels per device %s%s", self.name, sim.value_s,
                 {d: len(v) for d, v in plan.order.items()}, "" if sim.feasible else f"; {'; '.join(sim.problems)}")
        return plan

    def _exact_fallback(self, problem: Problem, began: float, why: str) -> Plan:
        from .milp import milp_instead        # the MILP warm-starts from these schedules

        return milp_instead(problem, self, began,
                            f"{self.name} found no placement within memory ({why}): the exact MILP placed the model")

    @abstractmethod
    def place(self, budget: DeviceBudget) -> Plan:
        """A latency plan with ``order`` filled, every kernel placed through ``budget``."""


class Greedy(_ListScheduler):
    """Latency: the fastest device per kernel. Throughput: ``throughput.balance_greedy``."""

    name = "greedy"
    objectives = ("latency", "throughput")

    def schedule(self, problem: Problem) -> Plan:
        if problem.objective == "throughput":
            from .throughput import greedy_throughput          # it imports the split heuristic

            return greedy_throughput(problem, self.reserve, self.name)
        return super().schedule(problem)

    def place(self, budget: DeviceBudget) -> Plan:
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


class Heft(_ListScheduler):
    name = "heft"

    def place(self, budget: DeviceBudget) -> Plan:
        problem = budget.problem
        graph, costs, host = problem.graph, problem.costs, problem.platform.host
        ranks = upward_ranks(problem)
        inputs_of = model_inputs_of(graph)
        timelines = {d: _Timeline() for d in problem.platform.device_names}
        finish: dict[str, float] = {}
        sent_bytes: dict[tuple[str, str], float] = {}     # (producer, device) -> bytes crossing there
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
                seen = done + _return_s(problem, kernel, device)
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
        return Plan(dict(budget.device_of), objective="latency", mode="latency", order=order,
                    attrs={"heft_estimate_s": estimate})


def upward_ranks(problem: Problem) -> dict[str, float]:
    """HEFT's rank_u: the mean-cost length of the longest path from a kernel to the end, the
    kernel included; an output's path ends with its mean return to the host."""
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    latency, per_byte = _mean_link(problem)
    ranks: dict[str, float] = {}
    for kernel in reversed(graph.topo_order):
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


def _mean_link(problem: Problem) -> tuple[float, float]:
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


def _return_s(problem: Problem, kernel: str, device: str) -> float:
    """Seconds for an output made on ``device`` to reach the host (zero for other kernels)."""
    nbytes = problem.graph.kernels[kernel].output_bytes
    if kernel not in problem.graph.output_set or nbytes <= 0:
        return 0.0
    return problem.costs.transfer_s(nbytes, device, problem.platform.host)


class _Timeline:
    """One device's busy intervals in run order (sorted by start, hence by finish)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.finishes: list[float] = []
        self.kernels: list[str] = []

    def earliest_slot(self, ready: float, seconds: float) -> tuple[int, float]:
        """(list position, start) of the earliest idle gap that fits ``seconds`` from ``ready`` on.

        A kernel may be put before an interval only if it starts strictly before it, so kernels
        that start at one instant keep the order they were placed in, which is topological.
        """
        index = bisect.bisect_left(self.starts, ready + seconds)
        while index < len(self.starts):
            start = max(ready, self.finishes[index - 1]) if index > 0 else ready
            if start + seconds <= self.starts[index] and start < self.starts[index]:
                return index, start
            index += 1
        return index, max(ready, self.finishes[-1]) if self.finishes else ready

    def insert(self, index: int, start: float, finish: float, kernel: str) -> None:
        self.starts.insert(index, start)
        self.finishes.insert(index, finish)
        self.kernels.insert(index, kernel)
