"""The ``period_overlap`` throughput MILP over the whole graph as one step: the milp solver's throughput,
and the exact step after split's throughput windows or the symmetric solver's server program. It is
warm-started from a plan (or the best heuristic), repaired where the simulator saw activations overflow
(``memory``), and its dual bound is kept; where memory can bind the model is a restriction, so the plan
then carries neither bound nor proof.
"""

from __future__ import annotations

from ..plan import Plan
from ..problem import Problem
from ..tolerances import within_slack
from .deadline import Deadline, OutOfTime
from .heuristics import best_heuristic
from .memory import solve_within_memory
from .mip_backend import nothing_found, proven_bound
from .throughput_model import ThroughputModel, score, throughput_plan
from .windows import PeakCut


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
        incumbent = best_heuristic(problem, deadline)
    return solve_within_memory(
        problem,
        lambda reserve, cuts: _solve_once(problem, incumbent, reserve, cuts, deadline, backend, seed, threads, solver),
    )


def _solve_once(
    problem: Problem,
    incumbent: Plan | None,
    reserve: dict[str, float],
    cuts: tuple[PeakCut, ...],
    deadline: Deadline,
    backend: str,
    seed: int,
    threads: int,
    solver: str,
) -> Plan:
    """One throughput MILP with this activation ``reserve`` and these ``cuts``: its plan, or the
    incumbent's where that is better, the MILP found none, or its model was not built by ``deadline``."""
    try:
        model = ThroughputModel(problem, backend=backend, reserve=reserve, cuts=cuts, build_by=deadline)
    except OutOfTime:
        if incumbent is None:
            raise
        plan = throughput_plan(incumbent.assignment, solver)
        score(problem, plan)
        plan.attrs["milp_status"] = "its model was not built in time; the heuristic's plan"
        return plan
    if incumbent is not None:
        model.warm_start(incumbent.assignment)
    found = model.solve(deadline, seed=seed, threads=threads)
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
