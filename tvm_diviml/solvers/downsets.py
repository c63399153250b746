"""The ``downsets`` solver: the exact DP over downsets (``toolkit/downsets.py``) for ``host_staged`` max
load (msr-fiddle) and ``stage_serial`` pipelines; past ``max_ideals`` downsets or the time limit it
falls back to SliceGraph (for pipelines, then re-cuts its cuts by the DP: ``pipeline_polish``) and says so in
``plan.attrs``. docs/solvers.md#downsets.
"""

from __future__ import annotations

import logging

from ..errors import DivimlInputError
from ..plan import Plan
from ..problem import Problem
from ..simulator import simulate
from ..toolkit.deadline import Deadline
from ..toolkit.downsets import DpStopped, TooManyIdeals, downset_plan
from ..toolkit.incumbents import Incumbents
from ..toolkit.pipeline_model import stage_count
from ..toolkit.pipeline_polish import polish_pipeline
from .base import Solver
from .slicegraph import SliceGraph, pipeline_plan, slice_order
from .stage_recombination import recombine_stages

log = logging.getLogger(__name__)


# Of the time SliceGraph leaves, what the first polish may take; the rest goes to recombining priced
# blocks (stage_recombination), then to polishing again. The polish alone took all of it on
# randwire_er:nodes=40 at K = 16 (41 s) without improving after its first seconds.
POLISH_SHARE = 0.5
# Rounds of recombining and polishing, each with seeds (orders) of its own, that find nothing before the
# fallback stops ahead of its deadline. On graphs of 71-105 kernels at K = 16 it used 11-15 s of 60;
# rounds in the time left found randwire_ws:nodes=24,seed=1's optimum in the sixth round (1.010 of it
# before) and took randwire_er:nodes=20,seed=2 from 1.023 to 1.005 of its optimum in the second.
STALE_RECOMBINATIONS = 8


class Downsets(Solver):
    """Exact max-load placement for ``host_staged`` platforms, and exact ``stage_serial`` pipelines, by
    the DP over ideals.

    Options: ``max_ideals`` (the most group-closed ideals to enumerate before falling back to
    SliceGraph, whose options go in ``fallback_options``) and ``time_limit_s`` (for the whole solve:
    the DP falls back when it has used ``DP_SHARE`` of the time the solve has, or at once where a
    pass's pairs would take longer, so that SliceGraph still gets the rest).
    """

    name = "downsets"
    objectives = ("throughput", "pipeline")
    modes = ("host_staged", "stage_serial")
    inputs = ("watch",)
    DP_SHARE = 0.8

    def __init__(
        self,
        *,
        time_limit_s: float = 60.0,
        seed: int = 0,
        max_ideals: int = 150_000,
        fallback_options: dict | None = None,
    ):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        if max_ideals < 1:
            raise DivimlInputError("max_ideals must be at least 1", field="max_ideals")
        self.max_ideals = max_ideals
        self.fallback_options = dict(fallback_options or {})

    def place(self, problem: Problem, deadline: Deadline, *, watch: Incumbents | None = None) -> Plan:
        """The DP's plan; where it cannot finish, SliceGraph's (offered to ``watch``) and its polish."""
        if watch is not None and problem.objective == "pipeline":
            self._offer_quick_slicing(problem, watch)
        try:
            plan = downset_plan(problem, self.max_ideals, deadline.within(self.DP_SHARE * deadline.left()))
        except DpStopped as stop:
            return self._fall_back(problem, deadline, str(stop), watch, stop.plan)
        except TooManyIdeals as stop:
            return self._fall_back(problem, deadline, str(stop), watch)
        if plan.infeasible:  # pipelines: the DP's plan breaks a constraint it relaxes
            fallback = self._fall_back(problem, deadline, plan.infeasible, watch)
            fallback.lower_bound_s = max(fallback.lower_bound_s or 0.0, plan.lower_bound_s)
            return fallback
        return plan

    def _fall_back(
        self,
        problem: Problem,
        deadline: Deadline,
        reason: str,
        watch: Incumbents | None,
        stopped: Plan | None = None,
    ) -> Plan:
        """SliceGraph in the time left before ``deadline`` (for pipelines 70% of it), or the split of a
        DP pass that proved nothing (``stopped``) where that is better; for pipelines then
        ``polish_pipeline`` for ``POLISH_SHARE`` of the rest, then rounds of ``recombine_stages`` and
        the polish again (``_recombine_and_polish``). None outlives ``deadline``."""
        left = deadline.left()
        then = (
            ", then its cuts re-cut by the DP (windows of stages, orders) and its stages recombined,"
            if problem.mode == "stage_serial"
            else ""
        )
        log.warning("downsets: %s; falling back to SliceGraph%s for %.0f s (not proven optimal)", reason, then, left)
        share = 0.7 * left if problem.mode == "stage_serial" else left
        options = {"time_limit_s": share, "seed": self.seed, **self.fallback_options}
        plan = SliceGraph(**options).solve(problem, deadline=deadline.within(share), watch=watch)
        plan.method, plan.attrs["fallback_reason"] = "slicegraph (fallback)", reason
        if stopped is not None and stopped.value_s < plan.value_s and self._feasible(problem, stopped):
            stopped.attrs.update(fallback_reason=reason, slicegraph_value_s=plan.value_s)
            stopped.lower_bound_s = plan.lower_bound_s
            plan = stopped
        if problem.mode == "stage_serial":
            polished = polish_pipeline(problem, plan, deadline.within(POLISH_SHARE * deadline.left()), seed=self.seed)
            plan = self._better(plan, polished, "cuts re-cut by the DP")
            if watch is not None:
                watch.offer(plan, "downsets")
            plan = self._recombine_and_polish(problem, plan, deadline, watch)
        return plan

    def _recombine_and_polish(self, problem: Problem, plan: Plan, deadline: Deadline, watch: Incumbents | None) -> Plan:
        """Rounds of ``recombine_stages`` and ``polish_pipeline`` (along other orders than the polish
        before), each round with seeds of its own, until ``deadline`` or ``STALE_RECOMBINATIONS``
        rounds in a row improve nothing; each better plan is offered to ``watch``."""
        stale = rounds = 0
        while not deadline.passed() and stale < STALE_RECOMBINATIONS:
            seed, before = self.seed + rounds, plan.value_s
            rounds += 1
            recombined = recombine_stages(problem, plan, deadline, seed=seed)
            if recombined is not None:
                plan = self._better(plan, recombined, "blocks recombined")
            plan = self._better(plan, polish_pipeline(problem, plan, deadline, seed=seed + 1), "re-cut again")
            stale = stale + 1 if plan.value_s >= before else 0
            if watch is not None and not stale:
                watch.offer(plan, "downsets: blocks recombined and re-cut")
        return plan

    @staticmethod
    def _better(plan: Plan, step: Plan, how: str) -> Plan:
        """``step`` where its period is lower than ``plan``'s, carrying the method that led to it."""
        if not step.value_s < plan.value_s:
            return plan
        steps = plan.method.split(", ")
        step.method = ", ".join(steps if how in steps else [*steps, how])
        step.attrs.update(plan.attrs)
        step.attrs.setdefault("slicegraph_value_s", plan.value_s)
        step.lower_bound_s = plan.lower_bound_s
        return step

    @staticmethod
    def _offer_quick_slicing(problem: Problem, watch: Incumbents) -> None:
        """A pipeline within moments, before the DP enumerates its ideals (seconds on 2,000 kernels):
        the graph's topological order cut exactly for the fastest devices (0.45 s and 11.6% above the
        final plan on a 2,000-kernel DAG at K = 8). Offered only where it fits (the simulator says)."""
        costs = problem.costs
        speed = {d: sum(costs.compute_s(k, d) for k in problem.graph.kernels) for d in problem.platform.device_names}
        fastest = sorted(problem.platform.device_names, key=speed.__getitem__)[: stage_count(problem)]
        try:
            _, cuts = slice_order(problem, problem.graph.topo_order, fastest)
        except DivimlInputError as error:  # devices the DP could use, but not in this order
            log.debug("downsets: no quick slicing (%s)", error)
            return
        watch.offer(pipeline_plan(problem, problem.graph.topo_order, fastest, cuts), "downsets: one order sliced")

    @staticmethod
    def _feasible(problem: Problem, plan: Plan) -> bool:
        return simulate(problem, plan).feasible
