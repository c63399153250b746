"""Exact latency placement with OR-Tools CP-SAT (``toolkit.cpsat_session``): proven optima for graphs of
tens of kernels where the MILP stalls. The plan is re-scored by the simulator, and ``optimal`` needs
both CP-SAT's proof and a simulated value that meets its bound, so tick rounding cannot fake a proof.
Where memory can bind, CP-SAT's model (every activation a device receives held at once) is a
restriction: its bound is then no bound, and where it leaves no plan the MILP places the model
(docs/solvers.md#cp-sat).
"""

from __future__ import annotations

import contextlib
import logging

from ..bounds import lower_bound
from ..errors import DivimlInputError
from ..plan import Plan
from ..problem import Problem
from ..simulator import simulate
from ..tolerances import meets
from ..toolkit.cpsat_session import MAX_PRICES, CpsatSession, tick_model
from ..toolkit.deadline import Deadline, OutOfTime
from ..toolkit.series import series_plan
from ..toolkit.windows import WindowSolution, order_by_start
from .base import Solver
from .exact_fallback import exact_instead
from .heft import Heft

log = logging.getLogger(__name__)


class Cpsat(Solver):
    """Proven-optimal latency plans for graphs of tens of kernels (CP-SAT, interval variables);
    ``workers``: CP-SAT's threads; ``warm_start``: from HEFT's plan where the call gives no hint."""

    name = "cpsat"
    objectives = ("latency",)
    modes = ("latency",)
    inputs = ("hint", "session")

    def __init__(self, *, time_limit_s: float = 60.0, seed: int = 0, workers: int = 2, warm_start: bool = True):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        if workers < 1:
            raise DivimlInputError("workers must be at least 1", field="workers")
        self.workers, self.warm_start = workers, warm_start

    def place(
        self, problem: Problem, deadline: Deadline, *, hint: Plan | None = None, session: CpsatSession | None = None
    ) -> Plan:
        """The best plan CP-SAT finds in the time limit. ``hint`` (else HEFT's plan when ``warm_start``)
        seeds the search and stands in if CP-SAT finds nothing in time; without one, a model of blocks
        joined by cut kernels is first proven block by block. ``session``: an open OR-Tools process to
        solve in (else one per solve)."""
        if hint is None:
            with self._session(session) as opened:
                in_series = series_plan(problem, opened, deadline, segment_time_limit_s=self.time_limit_s)
            if in_series is not None and in_series.optimal:
                return in_series
        return self._whole_graph(problem, hint, deadline, session)

    def _whole_graph(
        self, problem: Problem, hint: Plan | None, deadline: Deadline, session: CpsatSession | None
    ) -> Plan:
        """CP-SAT over the whole graph at once, from ``hint`` (or HEFT's plan)."""
        graph = problem.graph
        fallback = self._starting_plan(problem, hint)
        warm = horizon = None
        if fallback is not None:
            hinted = simulate(problem, fallback)
            warm = WindowSolution(fallback.assignment, hinted.start_s, hinted.finish_s, hinted.value_s, 0.0, False)
            horizon = hinted.value_s if hinted.feasible else None  # the optimum is no longer than a feasible plan
        combinatorial = lower_bound(problem)
        try:
            model = tick_model(
                problem,
                hint=warm,
                horizon_s=horizon,
                lower_bound_s=combinatorial,
                deadline=deadline,
                prices_at_most=MAX_PRICES,
            )
        except OutOfTime as error:
            if fallback is None:
                raise
            log.info("cpsat: %s; returning the warm start", error)
            plan = Plan(dict(fallback.assignment), order=fallback.order, solver=self.name, lower_bound_s=combinatorial)
            plan.attrs["cpsat_status"] = "OUT_OF_TIME"
            return plan
        with self._session(session) as opened:
            answer = opened.solve(model, deadline, deadline=deadline)
        status = answer["status"]
        if status == "INFEASIBLE":  # memory held every activation at once: a restriction
            return exact_instead(
                problem,
                self,
                deadline,
                "CP-SAT's memory model (every activation a device receives "
                "held at once) leaves no plan: the MILP placed the model instead",
            )
        if "device" in answer:
            assignment = {k: model.devices[d] for k, d in zip(model.kernels, answer["device"])}
            start = dict(zip(model.kernels, answer["start"]))
            plan = Plan(assignment, order=order_by_start(graph, assignment, start))
        elif fallback is not None:
            log.info("cpsat: CP-SAT found no plan in %.3g s (%s); returning the warm start", self.time_limit_s, status)
            plan = Plan(dict(fallback.assignment), order=fallback.order)
        else:
            raise DivimlInputError(
                f"CP-SAT found no plan within {self.time_limit_s:.3g} s ({status})",
                field="time_limit",
                hint="raise --time-limit or use --solver heft",
            )
        sim = simulate(problem, plan)
        if fallback is not None:
            sim_fallback = simulate(problem, fallback)
            if sim_fallback.feasible and sim_fallback.value_s < sim.value_s:  # rounding can lose a tie
                plan, sim = Plan(dict(fallback.assignment), order=fallback.order), sim_fallback
        bound_s = answer["bound"] / model.scale
        plan.solver, plan.value_s = self.name, sim.value_s
        exact = not (model.memory_binds or model.restricted)  # else the model is a restriction: no bound
        plan.lower_bound_s = max(bound_s, combinatorial) if exact else combinatorial
        plan.optimal = status == "OPTIMAL" and exact and meets(sim.value_s, bound_s)
        plan.attrs.update(
            {
                "cpsat_status": status,
                "cpsat_wall_s": answer["wall_s"],
                "cpsat_bound_s": bound_s,
                "ticks_per_s": model.scale,
                "memory_restricts_bound": model.memory_binds,
                "devices_restricted": model.restricted,
            }
        )
        log.info("cpsat: %s in %.3g s: %.6g s (bound %.6g s)", status, answer["wall_s"], sim.value_s, bound_s)
        return plan

    def _session(self, session: CpsatSession | None):
        """The caller's session, or a new OR-Tools process for this solve."""
        if session is not None:
            return contextlib.nullcontext(session)
        return CpsatSession(workers=self.workers, seed=self.seed)

    def _starting_plan(self, problem: Problem, hint: Plan | None) -> Plan | None:
        if hint is not None:
            simulate(problem, hint)  # a plan for another graph fails here
            return hint
        if not self.warm_start:
            return None
        try:
            # not stopped by the deadline: it is what stands in when CP-SAT gets no time (milliseconds on
            # the tens of kernels CP-SAT is for)
            return Heft(exact_fallback=False).solve(problem)
        except DivimlInputError as error:
            log.info("cpsat: no HEFT warm start (%s)", error)
            return None
