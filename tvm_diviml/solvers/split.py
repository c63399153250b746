"""DiviML's splitting heuristic: Louvain communities cut into modules of at most ``module_size`` kernels
in topological order, each solved exactly with the modules before it fixed (latency: CP-SAT windows, or
the latency MILP, ``toolkit.window_solver``; throughput: the period MILP, ``toolkit.split_throughput``),
then sweeps of overlapping windows re-solved while the simulator says the whole plan improves. It never
returns worse than the best heuristic it started from (docs/solvers.md#split).
"""

from __future__ import annotations

import contextlib
import logging
import math

from ..errors import DivimlInputError
from ..plan import Plan, better_of
from ..problem import Problem
from ..simulator import simulate
from ..tolerances import improves
from ..toolkit.communities import communities, improvement_windows, modules
from ..toolkit.cpsat_session import CpsatSession
from ..toolkit.deadline import Deadline
from ..toolkit.heuristics import best_heuristic
from ..toolkit.incumbents import Incumbents
from ..toolkit.mip_backend import BACKENDS as MILP_BACKENDS
from ..toolkit.series import devices_short_of_the_model, series_plan
from ..toolkit.split_throughput import split_throughput
from ..toolkit.window_solver import (
    WindowSolver,
    bottom_levels,
    by_start,
    fixed_context,
    plan_tails,
    window_tails,
)
from ..toolkit.windows import WindowSolution, list_schedule, order_by_start
from .base import Solver
from .cpsat import Cpsat
from .milp import Milp

log = logging.getLogger(__name__)

BACKENDS = ("cpsat", *MILP_BACKENDS)
IMPROVEMENT_SHARE = 0.5  # of the window time limit, for a window of the improvement sweeps


class Split(Solver):
    """The splitting heuristic (module docstring). ``module_size``: kernels per module and window;
    ``module_time_limit_s``: solver seconds per module (half that per improvement window), never
    more than an even share of the time left; ``improve``: run the improvement sweeps; ``backend``:
    cpsat, highs or cbc; ``workers``: CP-SAT's threads; ``series``: with CP-SAT, first solve latency
    by the series decomposition where it is exact (cut kernels), keeping modules and windows for
    graphs without cuts or where a segment stays unproven; ``whole_up_to``:
    graphs of at most this many kernels are then solved whole by CP-SAT from split's plan, in the time
    left (its proof or bound, and any better plan it finds), where its model is exact (memory cannot
    bind, costs without the executor's overheads). A call's ``session`` (an open CP-SAT process) is
    solved in instead of a process of its own."""

    name = "split"
    objectives = ("latency", "throughput")
    modes = ("latency", "period_overlap")
    inputs = ("session", "watch")

    def __init__(
        self,
        *,
        time_limit_s: float = 60.0,
        seed: int = 0,
        module_size: int = 32,
        module_time_limit_s: float = 2.0,
        improve: bool = True,
        backend: str = "cpsat",
        workers: int = 2,
        series: bool = True,
        whole_up_to: int = 64,
    ):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        self.series, self.whole_up_to = series, whole_up_to
        if module_size < 2:
            raise DivimlInputError("module_size must be at least 2", field="module_size")
        if backend not in BACKENDS:
            raise DivimlInputError(
                f"unknown split backend '{backend}'", field="backend", hint=f"use one of {', '.join(BACKENDS)}"
            )
        if workers < 1:
            raise DivimlInputError("workers must be at least 1", field="workers")
        self.module_size, self.module_time_limit_s = module_size, module_time_limit_s
        self.improve, self.backend, self.workers = improve, backend, workers

    def place(
        self,
        problem: Problem,
        deadline: Deadline,
        *,
        session: CpsatSession | None = None,
        watch: Incumbents | None = None,
    ) -> Plan:
        if problem.objective == "throughput":  # windows of the throughput MILP (HiGHS unless cbc)
            return split_throughput(
                problem,
                deadline,
                seed=self.seed,
                module_size=self.module_size,
                module_time_limit_s=self.module_time_limit_s,
                backend="cbc" if self.backend == "cbc" else "highs",
            )
        if self.backend != "cpsat":
            opened = contextlib.nullcontext()
        elif session is not None:
            opened = contextlib.nullcontext(session)
        else:
            opened = CpsatSession(workers=self.workers, seed=self.seed)
        with opened as cpsat_session:
            plan, solved, proven = self._latency(problem, deadline, cpsat_session, watch)
        plan.attrs.update(
            {
                "module_size": self.module_size,
                "split_backend": self.backend,
                "windows_solved": solved,
                "windows_proven": proven,
            }
        )
        return plan

    def _latency(
        self, problem: Problem, deadline: Deadline, session: CpsatSession | None, watch: Incumbents | None
    ) -> tuple[Plan, int, int]:
        """The series decomposition where it is exact and proves the optimum, else modules and windows
        (the better of both where a segment stayed unproven); a graph of at most ``whole_up_to`` kernels
        is then solved whole by CP-SAT from that plan. Also the windows solved and proven (a series
        segment is a window too: its kernels solved with the cut before it fixed). Each better plan on
        the way is offered to ``watch``."""
        in_series = None
        quick = None  # with a watch, the best list schedule at once, before the exact parts (and split's start)
        if watch is not None and (quick := best_heuristic(problem, deadline)) is not None:
            watch.offer(quick, f"split: list schedule ({quick.solver})", quick.value_s)
        if session is not None and self.series:
            in_series = series_plan(problem, session, deadline, segment_time_limit_s=self.module_time_limit_s)
            if in_series is not None and watch is not None:
                watch.offer(in_series, "split: series decomposition")
        windows = WindowSolver(
            problem,
            self.backend,
            session,
            deadline=deadline,
            window_time_limit_s=self.module_time_limit_s,
            seed=self.seed,
        )
        if in_series is not None and in_series.optimal:
            plan = in_series
        else:
            plan = self._solve(problem, windows, watch, quick)
        if in_series is not None and plan is not in_series:
            plan = better_of(plan, in_series)
        exact_model = not problem.costs.executor_segments and not devices_short_of_the_model(problem)
        if session is not None and exact_model and not plan.optimal and len(problem.graph) <= self.whole_up_to:
            whole = Cpsat(time_limit_s=deadline.left(), seed=self.seed, workers=self.workers).solve(
                problem, deadline=deadline, hint=plan, session=session, watch=watch
            )
            plan = better_of(plan, whole)
            plan.attrs["whole_graph"] = whole.attrs.get("cpsat_status")
        segments = in_series.series if in_series is not None else {}
        solved = windows.solved + segments.get("segment_solves", 0)
        return plan, solved, windows.proven + segments.get("segment_solves_proven", 0)

    def _solve(self, problem: Problem, windows: WindowSolver, watch: Incumbents | None, quick: Plan | None) -> Plan:
        """Modules, then improvement windows, from ``quick`` (the best list schedule, where the caller
        has made it already)."""
        graph = problem.graph
        fallback = quick if quick is not None else best_heuristic(problem, windows.deadline)
        if fallback is None:  # the list schedules found no room: the exact model (or its proof) starts it
            log.info("split: no heuristic plan fits memory; the MILP gives the starting plan")
            fallback = Milp(time_limit_s=windows.deadline.left(), seed=self.seed).solve(
                problem, deadline=windows.deadline
            )
        pieces = (
            [] if windows.deadline.passed() else modules(problem, communities(problem, self.seed), self.module_size)
        )
        log.info("split: %d kernels in %d modules of at most %d", len(graph), len(pieces), self.module_size)
        improving = self.improve and len(graph) > self.module_size
        sweep = len(improvement_windows(len(graph), self.module_size)) if improving else 0
        plan, value = self._forward(problem, pieces, fallback, windows, sweep)
        if watch is not None:
            watch.offer(plan, "split: modules", value)
        if fallback.value_s < value:
            plan, value = (
                Plan(
                    dict(fallback.assignment),
                    objective="latency",
                    mode="latency",
                    order={d: list(v) for d, v in fallback.order.items()},
                    solver=self.name,
                ),
                fallback.value_s,
            )
            plan.attrs["started_from"] = fallback.solver
        improved = 0
        if improving:
            plan, value, improved = self._improve(problem, plan, value, windows, watch)
        plan.value_s = value
        plan.attrs.update({"modules": len(pieces), "improvements": improved})
        return plan

    def _forward(
        self, problem: Problem, pieces: list[list[str]], fallback: Plan, windows: WindowSolver, later_windows: int
    ) -> tuple[Plan, float]:
        """Each module in turn, with those before it fixed; the plan and its simulated latency."""
        graph = problem.graph
        if windows.deadline.passed():  # the quick plan stands
            log.info("split: the time limit ended before the modules were solved")
            return fallback, math.inf
        bottom = bottom_levels(problem)
        fallback_start = simulate(problem, fallback).start_s
        assignment: dict[str, str] = {}
        finish: dict[str, float] = {}
        start: dict[str, float] = {}
        for index, piece in enumerate(pieces):
            if windows.deadline.passed():  # the quick plan stands (fixing each module costs O(kernels))
                log.info("split: the time limit ended after %d of %d modules", index, len(pieces))
                return fallback, math.inf
            context, fixed_start = fixed_context(problem, assignment, start, finish, list(assignment))
            tail = window_tails(problem, piece, bottom)
            piece = by_start(graph, piece, fallback_start)
            heuristic = list_schedule(problem, piece, context, fallback.assignment, tail)
            solution = windows.solve(
                piece, context, fixed_start, tail, heuristic, windows_left=len(pieces) - index + later_windows
            )
            if solution is None or solution.objective_s > heuristic.objective_s:
                solution = heuristic  # no time left, or the solver did no better: the heuristic's choice
            assignment.update(solution.assignment)
            start.update(solution.start_s)
            finish.update(solution.finish_s)
        phase = None if windows.sees_gaps else {k: index for index, piece in enumerate(pieces) for k in piece}
        plan = Plan(
            assignment,
            objective="latency",
            mode="latency",
            order=order_by_start(graph, assignment, start, phase),
            solver=self.name,
        )
        sim = simulate(problem, plan)
        return plan, sim.value_s if sim.feasible else float("inf")

    def _improve(
        self, problem: Problem, plan: Plan, value: float, windows: WindowSolver, watch: Incumbents | None
    ) -> tuple[Plan, float, int]:
        """Sweeps of overlapping windows along the plan's start order until a sweep improves nothing:
        each window re-solved with the kernels before it fixed and those after it keeping their devices
        and order (their tails), kept when the simulator says the whole plan got faster."""
        graph = problem.graph
        spans = improvement_windows(len(graph), self.module_size)
        improved = 0
        if windows.deadline.passed():  # before a simulation of the whole graph (seconds at 100,000 kernels)
            return plan, value, improved
        sim = simulate(problem, plan)
        while True:
            before_sweep = improved
            for index, (first, last) in enumerate(spans):
                if windows.deadline.passed():
                    return plan, value, improved
                order = by_start(graph, list(graph.kernels), sim.start_s)
                before, window, after = order[:first], order[first:last], order[last:]
                context, fixed_start = fixed_context(problem, plan.assignment, sim.start_s, sim.finish_s, before)
                tail = plan_tails(problem, plan, sim, window, after)
                hint = WindowSolution(
                    {k: plan.assignment[k] for k in window},
                    {k: sim.start_s[k] for k in window},
                    {k: sim.finish_s[k] for k in window},
                    sim.value_s,
                    0.0,
                    False,
                )
                if not windows.sees_gaps:  # the MILP takes one tail per kernel: the least is valid
                    tail = {k: min(by_device.values(), default=0.0) for k, by_device in tail.items()}
                solution = windows.solve(
                    window, context, fixed_start, tail, hint, windows_left=len(spans) - index, share=IMPROVEMENT_SHARE
                )
                if solution is None:
                    continue
                assignment = {**plan.assignment, **solution.assignment}
                start = {**sim.start_s, **solution.start_s}
                # Kernels after the window run after it on each device; before it, by start when windows see gaps.
                inner = 0 if windows.sees_gaps else 1
                phase = {kernel: 0 if i < first else inner if i < last else 2 for i, kernel in enumerate(order)}
                candidate = Plan(
                    assignment,
                    objective="latency",
                    mode="latency",
                    order=order_by_start(graph, assignment, start, phase),
                    solver=self.name,
                )
                candidate_sim = simulate(problem, candidate)
                if candidate_sim.feasible and improves(candidate_sim.value_s, value):
                    plan, sim, value, improved = candidate, candidate_sim, candidate_sim.value_s, improved + 1
                    if watch is not None:
                        watch.offer(plan, "split: improvement windows", value)
            if improved == before_sweep:
                return plan, value, improved
