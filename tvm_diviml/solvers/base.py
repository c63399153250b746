"""The contract every solver keeps: a Problem in, a Plan out, checked, timed and scored the same way.

``Solver.solve`` is a template: it refuses objectives and cost modes the solver does not declare and
problems no plan can satisfy, sets one ``Deadline`` for the whole solve (sub-solves get it too), calls
the solver's ``place`` and ends with ``finish``, which names the solver, times the solve and makes the
claimed value the simulator's. Options are keyword arguments with defaults; every random choice takes
a seed. What belongs to one call rather than to the solver (a plan to start from, an open CP-SAT
process) is an argument of ``solve``, handed to ``place`` where the solver declares it in ``inputs``.
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from ..errors import DivimlInputError
from ..plan import MODES, OBJECTIVES, Mode, Objective, Plan
from ..problem import Problem
from ..simulator import simulate
from ..tolerances import ABSOLUTE_SLACK, SOLVER_SLACK, meets
from ..toolkit.deadline import Deadline
from ..toolkit.pages import without_huge_pages
from ..toolkit.pipeline_model import stage_count
from ..toolkit.solvable import solvable
from .catalog import solvers_for

if TYPE_CHECKING:
    from ..toolkit.cpsat_session import CpsatSession
    from ..toolkit.incumbents import Incumbents

log = logging.getLogger(__name__)


class Solver(ABC):
    name: ClassVar[str] = ""
    objectives: ClassVar[tuple[Objective, ...]] = OBJECTIVES  # the objectives this solver places for
    modes: ClassVar[tuple[Mode, ...]] = MODES  # the simulator's cost modes it places in
    # The per-call inputs of ``solve`` that its ``place`` takes as keyword arguments ("hint",
    # "session", "watch"); a solver that takes none keeps ``place(problem, deadline)`` and solves without them.
    inputs: ClassVar[tuple[str, ...]] = ()
    # Whether ``place`` solves the problem as ``toolkit.solvable`` models it (a solver that builds a
    # model of it) or the caller's problem itself (one that only simulates plans at the caller's prices).
    modelled: ClassVar[bool] = True
    # Whether ``place`` needs every device, identical ones included (replicas use as many as there are).
    every_device: ClassVar[bool] = False

    def __init__(self, *, time_limit_s: float = 60.0, seed: int = 0):
        self.time_limit_s = time_limit_s
        self.seed = seed

    @without_huge_pages
    def solve(
        self,
        problem: Problem,
        *,
        deadline: Deadline | None = None,
        hint: Plan | None = None,
        session: CpsatSession | None = None,
        watch: Incumbents | None = None,
    ) -> Plan:
        """A plan for ``problem`` within ``time_limit_s`` of wall time (and ``deadline``, when a caller
        solving a larger problem passes its own). This call's inputs, for the solvers that declare them
        in ``inputs``: ``hint``, a plan to start from; ``session``, an open CP-SAT process to solve in
        (a caller that solves many small problems saves OR-Tools' start-up for each); ``watch``, where
        the plans found on the way are offered as they improve (and the final one in any case).
        ``place`` solves ``problem`` as ``toolkit.solvable`` models it where the solver is ``modelled``
        (spare identical devices gone, prices in range: the same optimum); ``finish`` scores the plan
        on ``problem``."""
        began = time.perf_counter()
        self.check(problem)
        given = {"hint": hint, "session": session, "watch": watch}
        inputs = {name: value for name, value in given.items() if name in self.inputs}
        own = Deadline.after(self.time_limit_s) if deadline is None else deadline.within(self.time_limit_s)
        if self.modelled:
            keeping = hint.devices_used() if hint is not None else ()
            problem_placed = solvable(problem, keeping, every_device=self.every_device)
        else:
            problem_placed = problem
        plan = self.finish(problem, self.place(problem_placed, own, **inputs), began)
        if watch is not None:
            watch.offer(plan, self.name)
            watch.bound(plan.lower_bound_s, f"{self.name}'s bound")
        return plan

    def check(self, problem: Problem) -> None:
        """Refuse, naming what would work, a problem this solver cannot place or no plan satisfies."""
        self.check_objective(problem)
        self.check_mode(problem)
        if problem.objective == "pipeline":
            stage_count(problem)
        if "validated" not in problem.memo:  # a second solver of the problem (a baseline) checks it once
            problem.validate()
            problem.memo["validated"] = True

    def check_objective(self, problem: Problem) -> None:
        if problem.objective in self.objectives:
            return
        raise DivimlInputError(
            f"solver {self.name} does {' and '.join(self.objectives)}, not '{problem.objective}'",
            field="objective",
            hint=f"for {problem.objective} use --solver "
            + " or ".join(solvers_for(problem.objective))
            + (" (with --stages K)" if problem.objective == "pipeline" else ""),
        )

    def check_mode(self, problem: Problem) -> None:
        mode = problem.mode
        if mode in self.modes:
            return
        if mode == "host_staged":
            raise DivimlInputError(
                f"solver {self.name} does not place on platforms that stage transfers through "
                f"host memory (host_staged), as '{problem.platform.name}' does",
                field="solver",
                hint="use --solver downsets (throughput) or slicegraph for host_staged platforms",
            )
        raise DivimlInputError(
            f"solver {self.name} places in cost modes {', '.join(self.modes)}; platform "
            f"'{problem.platform.name}' prices {problem.objective} as '{mode}'",
            field="solver",
            hint="for period_overlap throughput use --solver milp, split, greedy or replicas",
        )

    @abstractmethod
    def place(self, problem: Problem, deadline: Deadline) -> Plan:
        """A plan in ``problem.mode``, with ``lower_bound_s``, ``optimal`` and ``attrs`` as known (and
        the keyword arguments named in ``inputs``, where the solver declares any)."""

    def finish(self, problem: Problem, plan: Plan, began: float) -> Plan:
        """Name the solver, time the solve and make the claim the simulator's value of the plan."""
        sim = simulate(problem, plan)
        claim = plan.value_s
        if (
            sim.feasible
            and claim is not None
            and math.isfinite(claim)
            and not (abs(claim - sim.value_s) <= max(abs(sim.value_s) * SOLVER_SLACK, ABSOLUTE_SLACK))
        ):
            log.warning(
                "%s claimed %.9g s, the simulator says %.9g s: reporting the simulator's", self.name, claim, sim.value_s
            )
            # a proof of optimality was about the claimed value: it holds only where the bound meets the real one
            plan.optimal = (
                bool(plan.optimal) and plan.lower_bound_s is not None and meets(sim.value_s, plan.lower_bound_s)
            )
        plan.value_s = sim.value_s
        plan.solver = self.name
        plan.solve_s = time.perf_counter() - began
        return plan
