"""The exact pipeline MIP (MTPP of Archer et al., ICML 2024, with stage devices chosen too) as a solver
of its own, warm-started from SliceGraph: a plan in mode ``stage_serial`` whose bound is the MIP's
(docs/solvers.md#mtpp).
"""

from __future__ import annotations

import logging
import math
import time

import mip

from ..bounds import lower_bound
from ..errors import DivimlInputError
from ..plan import Plan
from ..problem import Problem
from ..simulator import Simulation, simulate
from ..tolerances import ABSOLUTE_SLACK, PIPELINE_AGREEMENT
from ..toolkit.deadline import Deadline
from ..toolkit.mip_backend import check_backend
from ..toolkit.pipeline_model import PipelineModel, optimize, stage_count
from .base import Solver
from .slicegraph import SliceGraph

log = logging.getLogger(__name__)


class PipelineMip(Solver):
    """``warm_start``: SliceGraph's plan (a quarter of the time limit) as the incumbent."""

    name = "pipeline_mip"
    objectives = ("pipeline",)
    modes = ("stage_serial",)

    def __init__(self, *, time_limit_s: float = 60.0, seed: int = 0, backend: str = "highs", warm_start: bool = True):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        self.backend, self.use_warm_start = check_backend(backend), warm_start

    def place(self, problem: Problem, deadline: Deadline) -> Plan:
        incumbent = (
            SliceGraph(time_limit_s=self.time_limit_s / 4, seed=self.seed).solve(problem, deadline=deadline)
            if self.use_warm_start
            else None
        )
        return solve_pipeline_mip(problem, deadline, backend=self.backend, seed=self.seed, warm_start=incumbent)


def solve_pipeline_mip(
    problem: Problem,
    deadline: Deadline,
    *,
    backend: str = "highs",
    seed: int = 0,
    warm_start: Plan | None = None,
    floor_s: float = 0.0,
    max_nodes: int | None = None,
) -> Plan:
    """The exact MTPP MIP with stage devices chosen too; a Plan in mode ``stage_serial`` by ``deadline``,
    the model's build included.

    ``value_s`` is the simulator's value, ``lower_bound_s`` the MIP's certified bound (never above
    the value), ``optimal`` only when the MIP proved its optimum and the simulator agrees with it.
    ``warm_start``: a pipeline plan (SliceGraph's) offered as the incumbent and returned if the MIP
    finds nothing better. ``floor_s``: a known lower bound on the optimum (the cheap bounds are
    always assumed), which sharpens the MIP's own bound. ``max_nodes``: stop after that many
    branch-and-bound nodes too (the same bound on every run where the time limit is not reached;
    ``stopped_by_time`` says whether it was)."""
    began = time.perf_counter()
    if problem.objective != "pipeline":
        raise DivimlInputError(
            f"the pipeline MIP places for objective 'pipeline', not '{problem.objective}'",
            field="objective",
            hint="use --objective pipeline --stages K",
        )
    stages = stage_count(problem)
    problem.validate()
    warm_start, incumbent_s = usable_warm_start(problem, warm_start, stages)
    model = PipelineModel(problem, stages, backend, max(floor_s, lower_bound(problem)), incumbent_s)
    if warm_start is not None:
        model.warm_start(warm_start)
    solving, solving_s = time.perf_counter(), deadline.left()
    status = optimize(model.builder, deadline, seed, max_nodes)
    stopped_by_time = status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.INFEASIBLE) and (
        time.perf_counter() - solving >= 0.95 * solving_s
    )
    bound = model.builder.bound_s()
    solved = status in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE)
    claim = model.builder.m.objective_value * model.builder.unit if solved else math.inf
    plan, sim, weaker = mip_or_warm_start(problem, model.plan() if solved else None, warm_start, incumbent_s)
    if plan is None:
        raise DivimlInputError(
            "the pipeline MIP found no plan within its time limit",
            field="time_limit",
            hint="raise --time-limit, or use --solver slicegraph",
        )
    if not sim.feasible:
        log.warning("the pipeline MIP's plan breaks a constraint the MIP does not model: %s", "; ".join(sim.problems))
    plan.solver, plan.value_s = PipelineMip.name, sim.value_s
    plan.lower_bound_s = None if bound is None else min(bound, sim.value_s)
    plan.optimal = (
        status == mip.OptimizationStatus.OPTIMAL
        and sim.feasible
        and sim.value_s <= claim * (1 + PIPELINE_AGREEMENT) + ABSOLUTE_SLACK
    )
    plan.solve_s, plan.stopped_by_time = time.perf_counter() - began, stopped_by_time
    plan.attrs.update(
        {
            "mip_status": status.name.lower(),
            "mip_objective_s": claim,
            "links_exact": model.links_exact,
            "mip_backend": backend,
        }
    )
    if weaker:
        plan.attrs["weaker_method"] = weaker
    log.info(
        "pipeline MIP: %d stages, period %.6g s, bound %s, %s in %.2f s",
        len(plan.stages),
        sim.value_s,
        plan.lower_bound_s,
        status.name,
        plan.solve_s,
    )
    return plan


def mip_or_warm_start(
    problem: Problem, plan: Plan | None, warm_start: Plan | None, incumbent_s: float | None
) -> tuple[Plan | None, Simulation | None, str | None]:
    """The MIP's plan or the warm start, with its simulation and, where the warm start replaced a MIP
    plan that overflows a memory, why: the warm start wins ties, and whenever the MIP's plan overflows
    a memory with its activations (the MIP counts weights only)."""
    sim = simulate(problem, plan) if plan is not None else None
    if warm_start is None or (sim is not None and sim.feasible and incumbent_s > sim.value_s):
        return plan, sim, None
    weaker = None
    if sim is not None and not sim.feasible:
        weaker = (
            "the pipeline MIP's own plan overflows a memory with its activations (it counts weights "
            "only): the plan is its warm start's"
        )
    plan = warm_start.copy()
    return plan, simulate(problem, plan), weaker


def usable_warm_start(problem: Problem, warm_start: Plan | None, stages: int) -> tuple[Plan | None, float | None]:
    """The warm start and its simulated period, or (None, None) where it breaks a constraint; a plan
    that is no pipeline of at most ``stages`` stages is refused."""
    if warm_start is None:
        return None, None
    if warm_start.mode != "stage_serial" or len(warm_start.stages or ()) > stages:
        raise DivimlInputError(
            f"the warm start must be a stage_serial plan of at most {stages} stages", field="warm_start"
        )
    sim = simulate(problem, warm_start)
    if sim.feasible:
        return warm_start, sim.value_s
    log.warning("the warm start breaks a constraint (%s); solving without it", "; ".join(sim.problems))
    return None, None
