"""The greedy baselines. Latency: each kernel on its fastest allowed device, communication ignored,
then simulated honestly. Throughput: each kernel, in topological order, where it least raises the
period, transfers included (``toolkit.list_scheduling``)."""

from __future__ import annotations

from ..plan import Plan
from ..problem import Problem
from ..toolkit.deadline import Deadline
from ..toolkit.list_scheduling import fastest_device_placement, greedy_throughput
from .list_scheduler import ListScheduler


class Greedy(ListScheduler):
    name = "greedy"
    objectives = ("latency", "throughput")
    modes = ("latency", "period_overlap")
    placement = staticmethod(fastest_device_placement)

    def schedule(self, problem: Problem, deadline: Deadline) -> Plan:
        if problem.objective == "throughput":
            return greedy_throughput(problem, self.reserve, self.name, deadline)
        return super().schedule(problem, deadline)
