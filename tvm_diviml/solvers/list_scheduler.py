"""What the list-scheduling baselines share: a schedule under the memory budget, and the exact MILP
where the schedule's commitments leave no room although a plan may exist."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from ..errors import DivimlInputError
from ..plan import Plan
from ..problem import Problem
from ..simulator import simulate
from ..toolkit.constraints import DeviceBudget
from ..toolkit.deadline import Deadline
from ..toolkit.list_scheduling import list_schedule_plan
from .base import Solver
from .exact_fallback import exact_instead


class ListScheduler(Solver):
    """A latency list schedule (``placement``). Where it finds no placement within memory, the exact
    MILP places the model, or proves that nothing fits, and the plan says so; ``exact_fallback=False``
    returns the overflowing plan instead."""

    objectives = ("latency",)
    modes = ("latency",)
    placement: ClassVar[Callable[[DeviceBudget], Plan]]

    def __init__(
        self,
        *,
        time_limit_s: float = 60.0,
        seed: int = 0,
        reserve: dict[str, float] | None = None,
        exact_fallback: bool = True,
    ):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        self.reserve, self.exact_fallback = reserve, exact_fallback

    def place(self, problem: Problem, deadline: Deadline) -> Plan:
        try:
            plan = self.schedule(problem, deadline)
        except DivimlInputError as error:
            if error.field != "memory_bytes" or not self.exact_fallback:
                raise
            return self._exact(problem, deadline, error.detail)
        sim = simulate(problem, plan)
        if not sim.feasible and self.exact_fallback:
            return self._exact(problem, deadline, "; ".join(sim.problems))
        return plan

    def schedule(self, problem: Problem, deadline: Deadline) -> Plan:
        """The list schedule under the memory budget, made by ``deadline`` (else ``OutOfTime``)."""
        return list_schedule_plan(problem, type(self).placement, self.name, self.reserve, deadline)

    def _exact(self, problem: Problem, deadline: Deadline, why: str) -> Plan:
        return exact_instead(
            problem,
            self,
            deadline,
            f"{self.name} found no placement within memory ({why}): the exact MILP placed the model",
        )
