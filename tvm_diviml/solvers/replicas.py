"""Throughput with replicas: the model, or the stages of the best plain plan, on several devices at once,
each taking a share of the stream in proportion to its speed (an LP chooses the shares), so that their
throughputs add. The best of none, whole-model and stage replicas (docs/solvers.md#throughput).
"""

from __future__ import annotations

from collections import defaultdict

import mip

from ..errors import DivimlInputError
from ..plan import Plan, ReplicaGroup
from ..problem import Problem
from ..tolerances import MEETS, SOLVER_SLACK
from ..toolkit.deadline import Deadline
from ..toolkit.mip_backend import new_model, optimized
from ..toolkit.single_device import single_device_values
from ..toolkit.solvable import solvable
from ..toolkit.throughput_model import mean_fastest_s, score, throughput_plan
from . import get_solver
from .base import Solver

BASE_SHARE = 0.9  # of the time limit, for the solver of the plain plan


# ---------------------------------------------------------------------- replicas
def whole_model_replicas(problem: Problem, solver: str = "replicas") -> Plan | None:
    """The whole model on every device that can run and hold it, each taking a share of the stream
    proportional to its speed (1 / its period alone): each device and its links to and from the host
    then carry share x its own period, so the period is 1 / sum(1 / t_d). None below two devices."""
    _, per_device = single_device_values(problem)  # identical devices share one simulation
    alone = {d: entry["value_s"] for d, entry in per_device.items() if entry["value_s"]}
    if len(alone) < 2:
        return None
    speed = {d: 1.0 / t for d, t in alone.items()}
    shares = normalised(speed)
    fastest = min(alone, key=alone.__getitem__)
    plan = throughput_plan(
        {k: fastest for k in problem.graph.kernels}, solver, [ReplicaGroup(list(problem.graph.topo_order), shares)]
    )
    score(problem, plan)
    return plan


def normalised(weights: dict[str, float]) -> dict[str, float]:
    """Shares that sum to exactly 1 (the last takes the rounding), tiny ones dropped."""
    total = sum(weights.values())
    kept = {d: w / total for d, w in weights.items() if w / total > SOLVER_SLACK}
    last = list(kept)[-1]
    kept[last] = 1.0 - sum(s for d, s in kept.items() if d != last)
    return kept


def stage_replicas(problem: Problem, base: Plan, solver: str = "replicas") -> Plan | None:
    """``base``'s kernels grouped by device into stages; an LP shares each stage's stream over the
    devices that can run it (min the largest device load, links ignored; then, at that load, the
    least work moved off the stage's own device, so only bottlenecks spread). A device that then
    overflows its memory stops taking other stages' shares and the LP runs again. None when no stage
    spreads."""
    graph = problem.graph
    stages: dict[str, list[str]] = defaultdict(list)
    for kernel in graph.topo_order:
        stages[base.assignment[kernel]].append(kernel)
    feasible = {k: set(problem.feasible_devices(k)) for k in graph.kernels}
    movable = {
        home: [d for d in problem.platform.device_names if all(d in feasible[k] for k in kernels)]
        for home, kernels in stages.items()
        if all(graph.kernels[k].colocate is None for k in kernels)
    }  # a shared group may not split
    barred: set[str] = set()
    for _ in range(len(problem.platform.devices)):
        options = {home: [d for d in movable.get(home, [home]) if d == home or d not in barred] for home in stages}
        shares = stage_share_lp(problem, stages, options)
        groups = [ReplicaGroup(list(stages[home]), split) for home, split in shares.items() if len(split) > 1]
        if not groups:
            return None
        plan = throughput_plan(base.assignment, solver, groups)
        sim = score(problem, plan)
        over = {
            d
            for d in sim.memory_bytes
            if problem.platform.device(d).memory_bytes is not None
            and sim.memory_bytes[d] > problem.platform.device(d).memory_bytes
        }
        if not over:
            return plan
        barred |= over
    return None


def stage_share_lp(
    problem: Problem, stages: dict[str, list[str]], options: dict[str, list[str]]
) -> dict[str, dict[str, float]]:
    """Home device -> {device: share} (see ``stage_replicas``), priced in range (``toolkit.solvable``)."""
    modelled = solvable(problem, every_device=True)
    costs, unit = modelled.costs, mean_fastest_s(modelled)
    work = {
        (home, d): sum(costs.compute_s(k, d) for k in kernels) / unit
        for home, kernels in stages.items()
        for d in options[home]
    }
    shares: dict[str, dict[str, float]] = {}
    period = None
    for phase in ("period", "moved"):
        model = new_model("stage_shares", "highs")
        y = {key: model.add_var(lb=0.0, ub=1.0) for key in work}
        T = model.add_var(lb=0.0)
        for home in stages:
            model += mip.xsum(y[home, d] for d in options[home]) == 1
        for device in problem.platform.device_names:
            terms = [work[key] * var for key, var in y.items() if key[1] == device]
            if terms:
                model += mip.xsum(terms) <= (T if period is None else period * (1 + MEETS) + MEETS)
        moved = mip.xsum(work[key] * var for key, var in y.items() if key[0] != key[1])
        model.objective = mip.minimize(T if phase == "period" else moved)
        if optimized(model) != mip.OptimizationStatus.OPTIMAL:
            return {home: {home: 1.0} for home in stages}
        period = T.x
        for home in stages:
            shares[home] = normalised({d: y[home, d].x for d in options[home] if y[home, d].x > 0})
    return shares


class Replicas(Solver):
    """Throughput with replicas (module docstring); ``base``: the solver of the plain plan that
    the stages come from (greedy, split or milp), given most of the time limit."""

    name = "replicas"
    objectives = ("throughput",)
    modes = ("period_overlap",)
    every_device = True
    BASES = ("greedy", "split", "milp")

    def __init__(self, *, time_limit_s: float = 60.0, seed: int = 0, base: str = "milp"):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        if base not in self.BASES:
            raise DivimlInputError(
                f"unknown base solver '{base}' for replicas", field="base", hint=f"use one of {', '.join(self.BASES)}"
            )
        self.base = base

    def place(self, problem: Problem, deadline: Deadline) -> Plan:
        base = get_solver(self.base, time_limit_s=self.time_limit_s * BASE_SHARE, seed=self.seed).solve(
            problem, deadline=deadline
        )
        plan = best_with_replicas(problem, base, self.name)
        plan.attrs["base_solver"] = self.base
        return plan


def best_with_replicas(problem: Problem, base: Plan, solver: str) -> Plan:
    """The best of ``base`` as it is, the whole model replicated and ``base``'s stages replicated
    (``attrs``: ``replicas_option``, ``option_values_s``), scored by the simulator."""
    options = {
        "none": throughput_plan(base.assignment, solver),
        "whole_model": whole_model_replicas(problem, solver),
        "stages": stage_replicas(problem, base, solver),
    }
    values: dict[str, float | None] = {}
    best_name = None
    for name, plan in options.items():
        sim = None if plan is None else score(problem, plan)
        values[name] = sim.value_s if sim is not None and sim.feasible else None
        if values[name] is not None and (best_name is None or values[name] < values[best_name]):
            best_name = name
    if best_name is None:
        raise DivimlInputError(
            "no replica option gave a plan that fits",
            field="memory_bytes",
            hint="check memory and allowed devices; try --solver greedy",
        )
    plan = options[best_name]
    plan.replicas_option, plan.attrs["option_values_s"] = best_name, values
    return plan
