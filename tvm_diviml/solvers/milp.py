"""The exact MILP of each objective (python-mip; HiGHS, or CBC), over the whole graph, warm-started from
the best heuristic: latency (``toolkit.latency_model``), throughput (``toolkit.throughput_exact``) and
pipelines (the ``pipeline_mip`` solver). Its dual bound is reported; ``optimal`` only when the solver
proves it and the simulator agrees. Memory: weights plus an activation reserve, repaired by what the
simulator sees overflow (``toolkit.memory``); where memory can bind the model is a restriction, so the
plan carries neither bound nor proof.
"""

from __future__ import annotations

import logging
import math

from ..plan import Plan
from ..problem import Problem
from ..simulator import simulate
from ..tolerances import within_slack
from ..toolkit.deadline import Deadline, OutOfTime
from ..toolkit.heuristics import best_heuristic
from ..toolkit.latency_model import LatencyModel
from ..toolkit.memory import solve_within_memory
from ..toolkit.mip_backend import check_backend, nothing_found
from ..toolkit.throughput_exact import exact_throughput
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
        incumbent = best_heuristic(problem, deadline) if self.use_warm_start else None
        return solve_within_memory(
            problem, lambda reserve, cuts: self._solve_once(problem, incumbent, reserve, cuts, deadline)
        )

    def _solve_once(
        self,
        problem: Problem,
        incumbent: Plan | None,
        reserve: dict[str, float],
        cuts: tuple[PeakCut, ...],
        deadline: Deadline,
    ) -> Plan:
        graph = problem.graph
        upper = incumbent.value_s if incumbent is not None and math.isfinite(incumbent.value_s) else None
        try:
            model = LatencyModel(
                problem, backend=self.backend, upper_bound_s=upper, reserve=reserve, cuts=cuts, build_by=deadline
            )
        except OutOfTime:
            if incumbent is None:
                raise
            plan = incumbent.copy(self.name)
            plan.attrs["milp_status"] = "its model was not built in time"
            return plan
        if incumbent is not None:
            sim = simulate(problem, incumbent)
            model.warm_start(incumbent.assignment, sim.start_s, sim.value_s)
        found = model.solve(deadline, seed=self.seed, threads=self.threads)
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
