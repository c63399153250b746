"""Split's throughput algorithm: Louvain modules of at most ``module_size`` kernels in topological order,
each solved by a window of the ``period_overlap`` MILP with the modules before it fixed, then sweeps of
overlapping windows re-solved while the simulator says the period shrinks. It starts from the greedy
plan (the whole-graph MILP's where greedy's does not fit memory) and never returns worse
(docs/solvers.md#split).
"""

from __future__ import annotations

import contextlib
import logging

from ..errors import DivimlInputError
from ..plan import Plan
from ..problem import Problem
from ..simulator import simulate
from ..tolerances import improves
from .communities import communities, improvement_windows, modules
from .constraints import default_reserve
from .deadline import Deadline
from .list_scheduling import greedy_throughput
from .throughput_exact import exact_throughput
from .throughput_model import ThroughputModel, score, throughput_plan

log = logging.getLogger(__name__)

# Split's windows stop after this many branch-and-bound nodes. On inception_v3 (paper-node, roofline)
# windows cut by the clock alone made plans that differed from run to run (periods within 0.03%);
# with 200 nodes (or 1,000) every run made the same plan, within 0.03% of the best clock-cut run, in
# 17-26 s against 26-30 s (a shared two-core machine).
WINDOW_NODES = 200


def throughput_start(problem: Problem, deadline: Deadline, *, seed: int, backend: str, solver: str) -> Plan:
    """The greedy throughput plan, or the throughput MILP's (within ``deadline``) where greedy's does
    not fit memory."""
    greedy = None
    with contextlib.suppress(DivimlInputError):
        greedy = greedy_throughput(problem)
    if greedy is None or not simulate(problem, greedy).feasible:
        log.info("split: the greedy plan does not fit memory; the throughput MILP gives the starting plan")
        greedy = exact_throughput(problem, deadline, seed=seed, backend=backend, solver=solver)
    return greedy


class ThroughputWindowSolver:
    """Solves windows of the throughput MILP one after another, the rest of the plan fixed: each within
    the window time limit and an even share of the time left before ``deadline``, and at most
    ``window_nodes`` branch-and-bound nodes (so that a seed gives one plan wherever the clock does not
    cut in first)."""

    def __init__(
        self,
        problem: Problem,
        deadline: Deadline,
        *,
        backend: str,
        seed: int,
        window_time_limit_s: float,
        window_nodes: int | None,
    ):
        self.problem, self.deadline, self.backend, self.seed = problem, deadline, backend, seed
        self.window_time_limit_s, self.window_nodes = window_time_limit_s, window_nodes
        self.reserve = default_reserve(problem)
        self.solved = self.proven = 0

    def solve(
        self, window: list[str], fixed: dict[str, str], hint: dict[str, str], windows_left: int
    ) -> dict[str, str] | None:
        """The window's assignment found from ``hint``, or None (no time left, or none found)."""
        remaining = self.deadline.left()
        if remaining <= 0:
            return None
        try:
            model = ThroughputModel(
                self.problem,
                window,
                fixed,
                backend=self.backend,
                reserve=self.reserve,
                tie_break=True,
                build_by=self.deadline,
            )
        except DivimlInputError as error:  # e.g. a co-location group left without a device; OutOfTime
            log.debug("split: window of %d kernels skipped: %s", len(window), error)
            return None
        model.warm_start(hint)
        limit = min(self.window_time_limit_s, remaining / max(windows_left, 1))
        found = model.solve(self.deadline.within(limit), seed=self.seed, max_nodes=self.window_nodes)
        self.solved += 1
        self.proven += bool(found is not None and found.optimal)
        return None if found is None else found.assignment


def split_throughput(
    problem: Problem,
    deadline: Deadline,
    *,
    seed: int = 0,
    module_size: int = 32,
    module_time_limit_s: float = 2.0,
    window_nodes: int | None = WINDOW_NODES,
    backend: str = "highs",
    solver: str = "split",
) -> Plan:
    """Modules forward, then improvement sweeps (module docstring), every window within ``deadline``."""
    graph = problem.graph
    greedy = throughput_start(problem, deadline, seed=seed, backend=backend, solver=solver)
    pieces = modules(problem, communities(problem, seed), module_size)
    spans = improvement_windows(len(graph), module_size) if len(graph) > module_size else []
    windows = ThroughputWindowSolver(
        problem,
        deadline,
        backend=backend,
        seed=seed,
        window_time_limit_s=module_time_limit_s,
        window_nodes=window_nodes,
    )
    assignment: dict[str, str] = {}
    for index, piece in enumerate(pieces):
        found = windows.solve(piece, assignment, greedy.assignment, len(pieces) - index + len(spans))
        assignment.update(found or {k: greedy.assignment[k] for k in piece})
    plan = throughput_plan(assignment, solver)
    sim = score(problem, plan)
    started_from = "modules"
    if not sim.feasible or greedy.value_s < plan.value_s:
        plan, started_from = throughput_plan(greedy.assignment, solver), "greedy"
        score(problem, plan)
    plan, improvements = improve_throughput(problem, plan, spans, windows, solver)
    plan.attrs.update(
        {
            "modules": len(pieces),
            "module_size": module_size,
            "windows_solved": windows.solved,
            "windows_proven": windows.proven,
            "improvements": improvements,
            "started_from": started_from,
            "greedy_value_s": greedy.value_s,
        }
    )
    return plan


def improve_throughput(
    problem: Problem, plan: Plan, spans: list[tuple[int, int]], windows: ThroughputWindowSolver, solver: str
) -> tuple[Plan, int]:
    """Sweeps of the windows ``spans`` (of the topological order) until one improves nothing or time
    runs out: each window re-solved with the rest of ``plan`` fixed, kept where the simulator says the
    period shrinks. The plan and the number of windows kept."""
    graph = problem.graph
    improvements = 0
    while spans and not windows.deadline.passed():
        before = improvements
        for index, (first, last) in enumerate(spans):
            window = graph.topo_order[first:last]
            fixed = {k: d for k, d in plan.assignment.items() if k not in set(window)}
            found = windows.solve(window, fixed, plan.assignment, len(spans) - index)
            if found is None:
                continue
            candidate = throughput_plan({**plan.assignment, **found}, solver)
            candidate_sim = score(problem, candidate)
            if candidate_sim.feasible and improves(candidate.value_s, plan.value_s):
                plan, improvements = candidate, improvements + 1
        if improvements == before:
            break
    return plan, improvements
