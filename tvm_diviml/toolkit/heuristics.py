"""The best quick plan for a problem: the list schedules and the single-device baseline, as the exact
models' warm start and the splitting heuristic's fallback.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import DivimlInputError
from ..plan import Plan
from ..problem import Problem
from ..simulator import simulate
from .deadline import Deadline
from .list_scheduling import fastest_device_placement, greedy_throughput, heft_placement, list_schedule_plan
from .single_device import fastest_single_device
from .windows import order_by_start


def best_heuristic(problem: Problem, deadline: Deadline | None = None) -> Plan | None:
    """The fastest feasible plan of HEFT, greedy and the best single device (those that do the
    problem's objective), with a run order for latency; None when none fits. A list schedule that
    overflows stays one here: no exact model is called from inside an exact model. Once ``deadline``
    passed, the first feasible plan is kept (each try costs seconds on 10,000s of kernels)."""
    tries: list[Callable[[], Plan]] = [lambda: fastest_single_device(problem)]
    if problem.objective == "latency":
        tries[:0] = [
            lambda: list_schedule_plan(problem, heft_placement, "heft"),
            lambda: list_schedule_plan(problem, fastest_device_placement, "greedy"),
        ]
    elif problem.objective == "throughput":
        tries.insert(0, lambda: greedy_throughput(problem))
    best = None
    for heuristic in tries:
        if best is not None and deadline is not None and deadline.passed():
            break
        try:
            plan = heuristic()
        except DivimlInputError:
            continue
        sim = simulate(problem, plan)
        if sim.feasible and (best is None or sim.value_s < best.value_s):
            plan.value_s = sim.value_s
            if plan.order is None and problem.objective == "latency":
                plan.order = order_by_start(problem.graph, plan.assignment, sim.start_s)
            best = plan
    return best
