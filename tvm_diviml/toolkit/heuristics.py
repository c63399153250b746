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
    """The fastest feasible plan of the best single device, HEFT and greedy (those that do the
    problem's objective), with a run order for latency; None when none fits. A list schedule that
    overflows stays one here: no exact model is called from inside an exact model. The single device
    comes first (a few simulations), though a list schedule of the same value wins; once ``deadline``
    passed, the first feasible plan is kept, and a list schedule under way stops (each costs seconds on
    10,000s of kernels, 10 s and more on 100,000)."""
    tries: list[Callable[[], Plan]] = [lambda: fastest_single_device(problem)]
    if problem.objective == "latency":
        tries += [
            lambda: list_schedule_plan(problem, heft_placement, "heft", deadline=deadline),
            lambda: list_schedule_plan(problem, fastest_device_placement, "greedy", deadline=deadline),
        ]
    elif problem.objective == "throughput":
        tries.append(lambda: greedy_throughput(problem, deadline=deadline))
    best = None
    for heuristic in tries:
        if best is not None and deadline is not None and deadline.passed():
            break
        try:
            plan = heuristic()
        except DivimlInputError:  # no placement within memory, or OutOfTime
            continue
        sim = simulate(problem, plan)
        ties_single = best is not None and best.solver == "fastest_single_device" and sim.value_s == best.value_s
        if sim.feasible and (best is None or sim.value_s < best.value_s or ties_single):
            plan.value_s = sim.value_s
            if plan.order is None and problem.objective == "latency":
                plan.order = order_by_start(problem.graph, plan.assignment, sim.start_s)
            best = plan
    return best
