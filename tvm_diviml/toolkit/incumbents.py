"""The best plan and the best lower bound of one solve as they improve, so that a user sees progress
on a long solve and an interrupted one still returns its best plan with a certified gap.

A solver that finds plans over time (a quick list schedule first, a MILP's improvement later) offers
each to the ``Incumbents`` its caller handed to ``Solver.solve``; the one simulator scores the offer
in the watched problem, so a value in the trace is what the report would print for that plan.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..plan import Plan, PlanError
from ..problem import Problem
from ..simulator import simulate


@dataclass(frozen=True)
class Event:
    """One improvement: seconds since the solve began, the best plan's value and the best bound then
    (0 where none is known yet), which of the two improved (``kind``: "plan" or "bound") and what
    brought it ("split: list schedule", "bound: cpsat"); or, ``kind`` "phase", what the solve started
    then ("bound: overlap_branching, up to 58 s")."""

    at_s: float
    value_s: float | None
    lower_bound_s: float
    kind: str
    by: str

    @property
    def gap(self) -> float | None:
        if self.value_s is None or self.lower_bound_s <= 0 or not math.isfinite(self.value_s):
            return None
        return self.value_s / self.lower_bound_s - 1.0

    def as_json(self) -> dict:
        return {
            "at_s": self.at_s,
            "value_s": self.value_s,
            "lower_bound_s": self.lower_bound_s,
            "kind": self.kind,
            "by": self.by,
        }


class Incumbents:
    """The best feasible plan offered for ``problem`` and the best bound, with the trace of their
    improvements; ``listener`` is called with each new ``Event`` (the CLI's progress line)."""

    def __init__(self, problem: Problem, listener: Callable[[Event], None] | None = None):
        self.problem = problem
        self.listener = listener
        self.began = time.perf_counter()
        self.best: Plan | None = None
        self.best_value_s: float | None = None
        self.lower_bound_s = 0.0
        self.trace: list[Event] = []

    def offer(self, plan: Plan, by: str, value_s: float | None = None) -> None:
        """Keep ``plan`` where it is feasible and better than the best so far (a copy: the solver may go
        on changing its own). ``value_s``: the plan's simulated value in the watched problem, where the
        caller has just computed it (else the simulator scores it here)."""
        if value_s is None:
            try:
                sim = simulate(self.problem, plan)
            except PlanError:
                return
            value_s = sim.value_s if sim.feasible else None
        if value_s is None or not math.isfinite(value_s):
            return
        if self.best_value_s is not None and value_s >= self.best_value_s:
            return
        kept = copy.deepcopy(plan)
        kept.value_s = value_s
        self.best, self.best_value_s = kept, value_s
        self._record("plan", by)

    def bound(self, value_s: float | None, by: str) -> None:
        """Raise the best bound to ``value_s`` where it is higher."""
        if value_s is None or not math.isfinite(value_s) or value_s <= self.lower_bound_s:
            return
        self.lower_bound_s = value_s
        self._record("bound", by)

    def phase(self, what: str) -> None:
        """Say what the solve does now (``kind`` "phase"): a long step that improves nothing for a while,
        such as a bound's search, still shows on the progress lines."""
        self._record("phase", what)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.began

    def first_plan(self) -> Event | None:
        """The first plan's event: when it came, its value and what found it (None: no plan yet)."""
        return next((event for event in self.trace if event.kind == "plan"), None)

    def _record(self, kind: str, by: str) -> None:
        event = Event(self.elapsed_s(), self.best_value_s, self.lower_bound_s, kind, by)
        self.trace.append(event)
        if self.listener is not None:
            self.listener(event)
