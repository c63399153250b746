"""Baseline: the whole model on one device, for each device; the best one wins. Every device's value
is kept in ``plan.attrs["per_device"]``, because users compare against all of them."""

from __future__ import annotations

from ..plan import Plan
from ..problem import Problem
from ..toolkit.deadline import Deadline
from ..toolkit.single_device import fastest_single_device
from .base import Solver


class FastestSingleDevice(Solver):
    name = "fastest_single_device"
    modelled = False  # it simulates each device alone: every device, at the caller's prices

    def check(self, problem: Problem) -> None:
        """No ``validate``: the baseline names, per device, why it cannot run the whole model, which
        says more than the first constraint no plan can meet."""
        self.check_objective(problem)

    def place(self, problem: Problem, deadline: Deadline) -> Plan:
        return fastest_single_device(problem)
