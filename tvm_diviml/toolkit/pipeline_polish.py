"""Better ``stage_serial`` pipelines from a given one by the downset DP over part of its ideals: windows
of consecutive stages re-cut exactly (every ideal of the window's kernels), and every cut moved at
once within the prefixes of topological orders that follow the plan's stages. SliceGraph moves one
cut along one order; these move any kernels across a window's cuts, or all cuts along many orders.
docs/solvers.md#downsets.
"""

from __future__ import annotations

import random

from ..plan import Plan
from ..problem import Problem
from ..simulator import Simulation, simulate
from ..tolerances import improves
from .deadline import Deadline
from .downsets import MaxLoadInstance, TooManyIdeals
from .pipeline_model import candidate_devices

FAMILY_SIZE = 10_000  # ideals per re-cut along orders: a few seconds of DP on 250 kernels
ORDERS = 2_000  # topological orders drawn per re-cut at most
STAGE_PREFERENCE = (0.9, 0.7, 0.5)  # per round in turn: chance an order's next kernel is from the earliest stage
STALE_ROUNDS = 3  # re-cuts along orders in a row that find nothing: stop


def polish_pipeline(problem: Problem, plan: Plan, deadline: Deadline, max_ideals: int = 20_000, seed: int = 0) -> Plan:
    """``plan`` improved until ``deadline`` passes or neither move finds anything:
    first windows of 1-3 consecutive stages around a bottleneck (``recut_window``), then, where none
    helps, every cut along orders (``recut_along_orders``, seeded by ``seed``). A change is kept only
    where the simulator's period, or the number of stages at it, drops."""
    best = plan.copy()
    sim = simulate(problem, best)
    rng = random.Random(seed)
    tried: set[tuple] = set()
    rounds = stale = 0
    while sim.feasible and not deadline.passed():
        step = recut_window(problem, best, sim, deadline, max_ideals, tried)
        if step is None:
            if stale >= STALE_ROUNDS:
                break
            preference = STAGE_PREFERENCE[rounds % len(STAGE_PREFERENCE)]
            step = recut_along_orders(problem, best, sim, deadline, rng, preference)
            rounds += 1
            stale = 0 if step is not None else stale + 1
        if step is not None:
            best, sim = step
    best.value_s = sim.value_s
    return best


def recut_window(
    problem: Problem, plan: Plan, sim: Simulation, deadline: Deadline, max_ideals: int, tried: set[tuple]
) -> tuple[Plan, Simulation] | None:
    """The first window of 1-3 consecutive stages around a bottleneck whose exact re-cut (by the DP
    on the window's devices and any device no stage uses, up to the stages asked for; the rest of the
    plan where it is) is better; None where none is. Windows in ``tried`` (which it extends) and
    windows of more than ``max_ideals`` ideals are skipped."""
    period = sim.value_s
    worst = [b for b, c in enumerate(sim.stage_cost_s) if c >= period * (1 - 1e-9)]
    windows = sorted(
        {
            (max(0, b - back), min(len(plan.stages), b - back + size))
            for b in worst
            for size in (1, 2, 3)
            for back in range(size)
        }
    )
    spare = [d for d in candidate_devices(problem) if d not in plan.stage_devices]
    spare = spare[: max(0, (problem.stages or len(problem.platform.devices)) - len(plan.stages))]
    for first, end in windows:
        kernels = frozenset(k for stage in plan.stages[first:end] for k in stage)
        if end - first + len(spare) < 2 or (kernels, tuple(plan.stage_devices[first:end])) in tried:
            continue
        tried.add((kernels, tuple(plan.stage_devices[first:end])))
        try:
            window = plan.stage_devices[first:end] + spare
            instance = MaxLoadInstance.of(
                problem, max_ideals, set(kernels), window, end - first + len(spare), deadline=deadline
            )
            split, _ = instance.search(deadline)
        except (TooManyIdeals, TimeoutError):
            continue
        if not split.value_s < period * (1 - 1e-9):
            continue
        stages, devices = instance.stages_of(split)
        candidate = Plan(
            {**plan.assignment, **{k: d for stage, d in zip(stages, devices) for k in stage}},
            objective=problem.objective,
            mode=problem.mode,
            stages=plan.stages[:first] + stages + plan.stages[end:],
            stage_devices=plan.stage_devices[:first] + devices + plan.stage_devices[end:],
        )
        step = _if_better(problem, candidate, sim)
        if step is not None:
            return step
    return None


def recut_along_orders(
    problem: Problem, plan: Plan, sim: Simulation, deadline: Deadline, rng: random.Random, preference: float
) -> tuple[Plan, Simulation] | None:
    """The DP over the plan's own cuts and the prefixes of random topological orders that take their
    next kernel from the earliest stage ready with chance ``preference`` (otherwise any ready kernel),
    up to ``FAMILY_SIZE`` ideals: the best chain of them on any devices, if better; else None."""
    graph = problem.graph
    index = {k: i for i, k in enumerate(graph.topo_order)}
    stage_of = {index[k]: s for s, stage in enumerate(plan.stages) for k in stage}
    predecessors = [{index[e.src] for e in graph.pred[k]} for k in graph.topo_order]
    successors = [{index[e.dst] for e in graph.succ[k]} for k in graph.topo_order]
    family, held = {0}, 0
    for stage in plan.stages:
        held |= sum(1 << index[k] for k in stage)
        family.add(held)
    for _ in range(ORDERS):
        if len(family) >= FAMILY_SIZE or deadline.passed():
            break
        waiting = [len(p) for p in predecessors]
        ready, held = [v for v, count in enumerate(waiting) if not count], 0
        while ready:
            earliest = min(stage_of[v] for v in ready)
            choices = [v for v in ready if stage_of[v] == earliest] if rng.random() < preference else ready
            v = rng.choice(choices)
            ready.remove(v)
            held |= 1 << v
            family.add(held)
            for w in successors[v]:
                waiting[w] -= 1
                if not waiting[w]:
                    ready.append(w)
    try:
        instance = MaxLoadInstance.of(problem, FAMILY_SIZE + len(graph) + 2, family=sorted(family), deadline=deadline)
        split, _ = instance.search(deadline, upper_s=sim.value_s)
    except (TooManyIdeals, TimeoutError):
        return None
    stages, devices = instance.stages_of(split)
    candidate = Plan(
        {k: d for stage, d in zip(stages, devices) for k in stage},
        objective=problem.objective,
        mode=problem.mode,
        stages=stages,
        stage_devices=devices,
    )
    return _if_better(problem, candidate, sim)


def _if_better(problem: Problem, candidate: Plan, sim: Simulation) -> tuple[Plan, Simulation] | None:
    """``candidate`` with its simulation where it lowers the period, or keeps it with fewer stages at it."""
    trial = simulate(problem, candidate)
    at_peak = sum(c >= trial.value_s * (1 - 1e-9) for c in trial.stage_cost_s)
    worst = sum(c >= sim.value_s * (1 - 1e-9) for c in sim.stage_cost_s)
    if trial.feasible and (improves(trial.value_s, sim.value_s) or (trial.value_s <= sim.value_s and at_peak < worst)):
        return candidate, trial
    return None
