"""The exact MILP in place of another solver's method where that method found no plan within memory:
the MILP repairs its memory by what the simulator sees, so it places the model or proves that nothing
fits. A solver module of its own, because it runs a solver (the toolkit runs none)."""

from __future__ import annotations

import logging

from ..plan import Plan
from ..problem import Problem
from ..toolkit.deadline import Deadline
from .base import Solver
from .milp import Milp

log = logging.getLogger(__name__)


def exact_instead(problem: Problem, solver: Solver, deadline: Deadline, note: str) -> Plan:
    """``solver`` found no plan within memory by its own method: the MILP places the model (or proves
    that nothing fits) within ``solver``'s deadline, and the plan says so in ``note``."""
    log.warning("%s: %s", solver.name, note)
    plan = Milp(time_limit_s=deadline.left(), seed=solver.seed).solve(problem, deadline=deadline)
    plan.attrs["weaker_method"] = note
    return plan
