"""The exact MILP of each objective (python-mip; HiGHS, or CBC), over the whole graph, warm-started from
the best heuristic: latency (``toolkit.latency_model``), throughput (``toolkit.throughput_model``) and
pipelines (the ``pipeline_mip`` solver). Its dual bound is reported; ``optimal`` only when the solver
proves it and the simulator agrees. Memory: weights plus an activation reserve, repaired by what the
simulator sees overflow (``toolkit.memory``); where memory can bind the model is a restriction, so the
plan carries neither bound nor proof.
"""

from __future__ import annotations

import logging
import math

import mip

from ..errors import DivimlInputError
from ..plan import Plan
from ..problem import Problem, no_plan_exists
from ..simulator import simulate
from ..tolerances import within_slack
from ..toolkit.deadline import Deadline
from ..toolkit.heuristics import best_heuristic
from ..toolkit.latency_model import LatencyModel
from ..toolkit.memory import solve_within_memory
from ..toolkit.mip_backend import check_backend, proven_bound
from ..toolkit.throughput_model import ThroughputModel, score, throughput_plan
from ..toolkit.windows import PeakCut, order_by_start
from .base import Solver
from .pipeline_mip import PipelineMip

log = logging.getLogger(__name__)


class Milp(Solver):
    """The exact MILP of the problem's objective; ``warm_start``: from the best heuristic (pipelines:
    SliceGraph's plan)."""

    name = "milp"
    objectives = ("latency", "throughput", "pipeline")
    modes = ("latency", "period_overlap", "stage_serial")

    def __init__(
        self,
        *,
        time_limit_s: float = 60.0,
        seed: int = 0,
        backend: str = "highs",
        threads: int = 1,
        warm_start: bool = True,
    ):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        self.backend, self.threads, self.use_warm_start = check_backend(backend), threads, warm_start

    def place(self, problem: Problem, deadline: Deadline) -> Plan:
        if problem.objective == "pipeline":
            return PipelineMip(
                time_limit_s=self.time_limit_s, seed=self.seed, backend=self.backend, warm_start=self.use_warm_start
            ).solve(problem, deadline=deadline)
        if problem.objective == "throughput":
            return exact_throughput(
                problem,
                deadline,
                backend=self.backend,
                seed=self.seed,
                threads=self.threads,
                warm_start=self.use_warm_start,
            )
        incumbent = best_heuristic(problem) if self.use_warm_start else None
        return solve_within_memory(
            problem, lambda reserve, cuts: self._solve_once(problem, incumbent, reserve, cuts, deadline.left())
        )

    def _solve_once(
        self,
        problem: Problem,
        incumbent: Plan | None,
        reserve: dict[str, float],
        cuts: tuple[PeakCut, ...],
        time_limit_s: float,
    ) -> Plan:
        graph = problem.graph
        upper = incumbent.value_s if incumbent is not None and math.isfinite(incumbent.value_s) else None
        model = LatencyModel(problem, backend=self.backend, upper_bound_s=upper, reserve=reserve, cuts=cuts)
        if incumbent is not None:
            sim = simulate(problem, incumbent)
            model.warm_start(incumbent.assignment, sim.start_s, sim.value_s)
        found = model.solve(time_limit_s, seed=self.seed, threads=self.threads)
        if found is None:
            if incumbent is None:
                raise nothing_found(model.status, "MILP", "heft")
            plan = incumbent.copy(self.name)
            plan.lower_bound_s = model.bound_s()
            plan.attrs["milp_status"] = "no better incumbent"
            return plan
        plan = Plan(
            found.assignment,
            objective="latency",
            mode="latency",
            order=order_by_start(graph, found.assignment, found.start_s),
            solver=self.name,
        )
        sim = simulate(problem, plan)
        if incumbent is not None and incumbent.value_s < sim.value_s:
            plan = incumbent.copy(self.name)
            sim = simulate(problem, plan)
        plan.value_s = sim.value_s
        # No bound can exceed a value reached; the solver's may, by its tolerance.
        plan.lower_bound_s = None if found.bound_s is None else min(found.bound_s, sim.value_s)
        # Proven only if the simulator agrees with the model, up to the solver's feasibility tolerance.
        plan.optimal = found.optimal and within_slack(sim.value_s, found.objective_s)
        plan.attrs.update({"milp_objective_s": found.objective_s, "milp_backend": self.backend})
        if model.memory_binds:  # weights + a reserve: a restriction, so neither bound nor proof
            plan.lower_bound_s, plan.optimal = None, False
            plan.attrs["memory_restricts_bound"] = True
        return plan


def exact_throughput(
    problem: Problem,
    deadline: Deadline,
    *,
    backend: str = "highs",
    seed: int = 0,
    threads: int = 1,
    warm_start: bool = True,
    solver: str = "milp",
    incumbent: Plan | None = None,
) -> Plan:
    """The throughput MILP over the whole graph, repaired where the simulator saw activations overflow;
    warm-started from ``incumbent`` (a plan with its value), else from the best heuristic."""
    if incumbent is None and warm_start:
        incumbent = best_heuristic(problem)
    return solve_within_memory(
        problem,
        lambda reserve, cuts: _solve_throughput_once(
            problem, incumbent, reserve, cuts, deadline.left(), backend, seed, threads, solver
        ),
    )


def _solve_throughput_once(
    problem: Problem,
    incumbent: Plan | None,
    reserve: dict[str, float],
    cuts: tuple[PeakCut, ...],
    time_limit_s: float,
    backend: str,
    seed: int,
    threads: int,
    solver: str,
) -> Plan:
    model = ThroughputModel(problem, backend=backend, reserve=reserve, cuts=cuts)
    if incumbent is not None:
        model.warm_start(incumbent.assignment)
    found = model.solve(time_limit_s, seed=seed, threads=threads)
    if found is None:
        if incumbent is None:
            raise nothing_found(model.status, "throughput MILP", "greedy")
        plan = throughput_plan(incumbent.assignment, solver)
        score(problem, plan)
        plan.attrs["milp_status"] = "no incumbent of its own; the heuristic's plan"
        bound_s = proven_bound(model.m, model.unit)
        plan.lower_bound_s = None if bound_s is None else min(bound_s, plan.value_s)
    else:
        plan = throughput_plan(found.assignment, solver)
        sim = score(problem, plan)
        if incumbent is not None and incumbent.value_s < sim.value_s:
            plan = throughput_plan(incumbent.assignment, solver)
            score(problem, plan)
        # No bound may exceed a value reached; the solver's may, by its tolerance.
        plan.lower_bound_s = None if found.bound_s is None else min(found.bound_s, plan.value_s)
        plan.optimal = found.optimal and within_slack(plan.value_s, found.period_s)
        plan.attrs.update({"milp_objective_s": found.period_s, "milp_backend": backend})
    if model.memory_binds:  # weights + a reserve: a restriction, so neither bound nor proof
        plan.lower_bound_s, plan.optimal = None, False
        plan.attrs["memory_restricts_bound"] = True
    return plan


def nothing_found(status: mip.OptimizationStatus, method: str, heuristic: str) -> DivimlInputError:
    """The error for an exact solve with no plan and no incumbent: proven infeasible, or out of time."""
    if status == mip.OptimizationStatus.INFEASIBLE:
        return no_plan_exists(method)
    return DivimlInputError(
        f"the {method} found no plan within its time limit",
        field="time_limit",
        hint=f"raise --time-limit or use --solver {heuristic}",
    )


def exact_instead(problem: Problem, solver: Solver, deadline: Deadline, note: str) -> Plan:
    """``solver`` found no plan within memory by its own method: the MILP (its memory repaired by what
    the simulator sees) places the model, or proves that nothing fits; the plan says so in ``note``."""
    log.warning("%s: %s", solver.name, note)
    plan = Milp(time_limit_s=max(deadline.left(), 1.0), seed=solver.seed).solve(problem)
    plan.attrs["weaker_method"] = note
    return plan
