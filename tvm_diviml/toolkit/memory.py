"""Memory for the exact models: weights once per device plus an activation reserve, repaired by what
the simulator sees overflow (peak cuts), so that an exact model's plan fits or its proof says none can.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..plan import Plan
from ..problem import NoPlanError, Problem
from ..simulator import simulate
from .constraints import activation_overflow, default_reserve
from .windows import PeakCut

log = logging.getLogger(__name__)


def solve_within_memory(
    problem: Problem, solve_once: Callable[[dict[str, float], tuple[PeakCut, ...]], Plan], attempts: int = 8
) -> Plan:
    """An exact model of weights plus a per-device activation reserve, solved by ``solve_once(reserve,
    cuts)``: first with ``default_reserve``; where that model has no plan, with no reserve (weights
    alone: a relaxation, so its proof of infeasibility holds for the problem); then, up to
    ``attempts`` solves in all, with a ``PeakCut`` for each device the simulator saw overflow. The
    last plan may still overflow (the simulator then says so)."""
    reserve = default_reserve(problem)
    cuts: tuple[PeakCut, ...] = ()
    try:
        plan = solve_once(reserve, cuts)
    except NoPlanError:
        log.info("no plan with the default activation reserve; solving with weights alone, then repairing")
        reserve = dict.fromkeys(reserve, 0.0)
        plan = solve_once(reserve, cuts)
    for _ in range(attempts - 1):
        overflow = activation_overflow(problem, plan, simulate(problem, plan))
        new = {
            PeakCut(device, frozenset(k for k, d in plan.assignment.items() if d == device), peak)
            for device, peak in overflow.items()
        } - set(cuts)
        if not new:
            break
        cuts = (*cuts, *sorted(new, key=lambda cut: (cut.device, sorted(cut.kernels))))
        try:
            plan = solve_once(reserve, cuts)
        except NoPlanError:
            log.warning(
                "activations overflow %s, and no plan avoids the sets that overflowed; keeping the plan that overflows",
                ", ".join(sorted(overflow)),
            )
            break
    return plan
