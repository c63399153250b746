"""One orchestration of a solve, shared by ``diviml plan``/``run``, ``PartitionForDevices`` and the
model-coverage suite, so that ``--solver auto`` places a model the same way everywhere.

``plan_model`` runs the solver (``auto``: the default for the objective), keeps the fastest single
device where ``auto``'s plan across devices is not predicted faster by more than the costs' measured
error, scores the kept plan with the simulator, and gathers the baselines (each device alone, HEFT,
greedy) and the lower bounds that every report prints beside it. Plans and bounds are reported as they
improve; where the caller asks, an interrupt (Ctrl-C) during the solve keeps the best plan found so far.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .bounds import CoverAlongside, lower_bounds
from .errors import DivimlInputError, forget_interrupt
from .plan import Plan
from .problem import Problem
from .simulator import Simulation, simulate
from .solvers import default_solver, get_solver
from .solvers.replicas import best_with_replicas
from .toolkit.deadline import Deadline, OutOfTime
from .toolkit.incumbents import Event, Incumbents
from .toolkit.single_device import single_device_values
from .units import format_seconds

log = logging.getLogger(__name__)

# The least time left for which the MIP and CP-SAT bounds are started (else the combinatorial ones only).
MIN_BOUND_TIME_S = 1.0
# Replicas are kept only where they cut the period by at least this much: each one is another copy of
# the weights and a stream to share out (the demo's paper-node plan: two stages sent a share that rounds
# to 0% elsewhere, for the same period to four digits).
MIN_REPLICA_GAIN = 0.01
BASELINES_AFTER_DEADLINE_S = 1.0  # how long past the deadline HEFT and greedy may still be made for the report


@dataclass
class Solved:
    """A solved problem: the kept plan, its simulation, the lower bounds by source and the baselines
    (``fastest_single_device`` None where no device holds the whole model)."""

    plan: Plan
    simulation: Simulation
    bounds: dict[str, float]
    baselines: dict[str, float | None]
    kept_single_device: str | None = None  # why auto kept the single device instead of the split
    replicated: str | None = None  # why auto replicated kernels (None: it did not)
    trace: list[Event] = field(default_factory=list)  # the best plan and bound as they improved
    interrupted: bool = False  # Ctrl-C ended the solve: the plan is the best found until then
    bounds_s: float = 0.0  # seconds spent on the lower bounds after the solve

    @property
    def lower_bound_s(self) -> float:
        return max(self.bounds.values(), default=0.0)


def plan_model(
    problem: Problem,
    solver: str = "auto",
    *,
    time_limit_s: float = 60.0,
    seed: int = 0,
    bound_time_limit_s: float = 0.0,
    listener: Callable[[Event], None] | None = None,
    interrupt_keeps_best: bool = False,
    replicas: bool = False,
) -> Solved:
    """Solve ``problem`` with ``solver`` and gather what a report needs, all within ``time_limit_s`` of
    wall time. ``bound_time_limit_s``: seconds of it kept from the solver (up to a quarter of the
    limit) for the pipeline bound MIPs and the latency series bound, which also get whatever the
    solver leaves of the limit (0: the combinatorial bounds only).
    ``listener``: called with each improvement of the best plan or bound (``Event``). With
    ``interrupt_keeps_best``, an interrupt during the solve keeps the best plan offered so far (none
    yet: the interrupt goes on), and the bounds are then the combinatorial ones; without, it goes on.
    ``replicas``: ``auto`` may replicate the model or its stages for throughput
    (``replicate_where_faster``; a replicated plan builds as one executable per route,
    ``runtime.routed``); a solver's own bound, proven among plans without replicas, then does not count."""
    deadline = Deadline.after(time_limit_s)
    # a pipeline's stage cover starts now on a spare core, where there is one; stopped on the way out
    alongside = CoverAlongside.start(problem, deadline, seed) if bound_time_limit_s > 0 else CoverAlongside()
    with alongside:
        automatic = solver == "auto"
        name = default_solver(problem) if automatic else solver
        reserve = min(bound_time_limit_s, time_limit_s / 4)
        watch = Incumbents(problem, listener)
        interrupted = False
        try:
            plan = get_solver(name, time_limit_s=time_limit_s - reserve, seed=seed).solve(
                problem, deadline=deadline, watch=watch
            )
        except KeyboardInterrupt:
            if not interrupt_keeps_best or watch.best is None:
                raise
            forget_interrupt()  # answered: the best plan so far is the result
            plan, interrupted = watch.best, True
            plan.solver, plan.solve_s = name, watch.elapsed_s()
            log.warning("interrupted after %.1f s: keeping the best plan found so far", watch.elapsed_s())
        sim = simulate(problem, plan)
        if watch.best is not None and watch.best_value_s < sim.value_s:
            log.info("%s returned a plan worse than one it offered on the way: keeping that one", name)
            watch.best.lower_bound_s, watch.best.solver, watch.best.solve_s = (
                plan.lower_bound_s,
                plan.solver,
                plan.solve_s,
            )
            plan, sim = watch.best, simulate(problem, watch.best)
        single, per_device = single_device_values(problem)  # None: no device holds the model (it must split)
        baselines: dict[str, float | None] = {"fastest_single_device": single.value_s if single else None}
        kept_single = None
        if automatic and single and len(plan.devices_used()) > 1 and problem.objective != "pipeline":
            kept_single = _keep_single_device(plan.solver, sim.value_s, single.value_s, problem.costs.prediction_error)
            if kept_single:
                single.solver = "fastest_single_device"
                plan, sim = single, simulate(problem, single)
        with_replicas = replicas and problem.objective == "throughput" and problem.mode == "period_overlap"
        replicated = None
        if with_replicas and automatic and not interrupted:
            plan, sim, replicated = replicate_where_faster(problem, plan, sim, watch)
        if with_replicas and plan.optimal and not plan.replicas:
            plan.attrs["optimal_among"] = "plans without replicas"
        for device, entry in per_device.items():
            baselines[f"single:{device}"] = entry["value_s"]
        # a solver that used its whole limit leaves the baselines a moment (milliseconds each but on
        # 100,000s of kernels, where HEFT takes 10 s and more and is left out)
        baseline_deadline = Deadline(max(deadline.at, time.perf_counter() + BASELINES_AFTER_DEADLINE_S))
        baselines.update(
            list_scheduling_baselines(problem, plan if name in ("heft", "greedy") else None, baseline_deadline)
        )
        # a plan found by the series decomposition already carries its bound (no second run of it), and
        # a proven optimum that carries its bound needs no MIP bound
        series_solved = problem.objective == "latency" and "series" in plan.attrs
        proven = series_solved or (bool(plan.optimal) and plan.lower_bound_s is not None)
        # the bounds get every second the solver left: on randwire_er:nodes=32 at K = 16 the solver ends
        # at 19 s of 60, and the stage cover given 40 s instead of 10 took the gap from 58% to 33%
        searching = bound_time_limit_s > 0 and not (proven or interrupted)
        mip_time_limit_s = deadline.left() if searching else 0.0
        if mip_time_limit_s < MIN_BOUND_TIME_S:  # building the models alone takes longer on 1,000s of kernels
            mip_time_limit_s = 0.0
        bounds_began = time.perf_counter()
        bounds = lower_bounds(
            problem,
            mip_time_limit_s=mip_time_limit_s,
            upper_s=sim.value_s,
            deadline=deadline,
            alongside=alongside,
            progress=watch.phase,
        )
        if plan.lower_bound_s is not None and not with_replicas:
            bounds["solver"] = plan.lower_bound_s
        if bounds:
            source = max(bounds, key=bounds.__getitem__)
            watch.bound(bounds[source], f"bound: {source}")
        bounds_s = time.perf_counter() - bounds_began
        return Solved(plan, sim, bounds, baselines, kept_single, replicated, watch.trace, interrupted, bounds_s)


def replicate_where_faster(
    problem: Problem, plan: Plan, sim: Simulation, watch: Incumbents
) -> tuple[Plan, Simulation, str | None]:
    """``plan``, or the best of it with the whole model or its stages replicated
    (``solvers.replicas.best_with_replicas``) where that is predicted faster by more than the costs'
    measured error and by ``MIN_REPLICA_GAIN``; with why (None: ``plan`` kept)."""
    replicated = best_with_replicas(problem, plan, plan.solver)
    if not replicated.replicas:
        return plan, sim, None
    replicated_sim = simulate(problem, replicated)
    wanted_s = sim.value_s * (1.0 - max(problem.costs.prediction_error, MIN_REPLICA_GAIN))
    if replicated_sim.value_s >= wanted_s:
        return plan, sim, None
    replicated.solve_s = plan.solve_s
    option = "the whole model" if replicated.attrs["replicas_option"] == "whole_model" else "the plan's stages"
    watch.offer(replicated, f"{option} replicated", replicated_sim.value_s)
    why = (
        f"{option} replicated (each replica takes a share of the stream): period "
        f"{format_seconds(replicated_sim.value_s)} against {format_seconds(sim.value_s)} for {plan.solver}'s plan"
    )
    return replicated, replicated_sim, why


def _keep_single_device(solver: str, split_s: float, single_s: float, error: float) -> str | None:
    """Why ``auto`` keeps the fastest single device instead of ``solver``'s split plan (None: the split
    is predicted faster by more than the costs' measured error, so it is kept)."""
    if split_s < single_s * (1.0 - error):
        return None
    gain = 100 * (single_s / split_s - 1.0) if split_s > 0 else 0.0
    return (
        f"{solver}'s plan across devices is predicted {gain:.1f}% faster than the fastest single device, "
        f"within the measured error of {100 * error:.1f}%: the single device is kept"
    )


def list_scheduling_baselines(
    problem: Problem, solved: Plan | None = None, deadline: Deadline | None = None
) -> dict[str, float]:
    """HEFT and greedy: for latency as they are; for throughput, HEFT's latency placement and the
    throughput greedy, each scored in the problem's mode. Pipelines get none (HEFT's device graph
    need not be a pipeline). ``solved``: a plan of one of them already made for ``problem``. A
    baseline not made by ``deadline`` is left out (one takes 10 s and more on 100,000 kernels)."""
    if problem.objective == "pipeline":
        return {}
    values = {}
    for name in ("heft", "greedy"):
        if solved is not None and solved.solver == name:
            plan = solved
        elif problem.objective == "latency" or name == "greedy":
            try:
                plan = get_solver(name, exact_fallback=False).solve(problem, deadline=deadline)
            except DivimlInputError as error:  # greedy does not place for host_staged copies; OutOfTime
                log.debug("baseline %s skipped: %s", name, error)
                continue
        else:
            latency = Problem(problem.graph, problem.platform, problem.costs, objective="latency")
            try:
                placed = get_solver(name, exact_fallback=False).solve(latency, deadline=deadline)
            except OutOfTime as error:
                log.debug("baseline %s skipped: %s", name, error)
                continue
            plan = Plan(placed.assignment, objective=problem.objective, mode=problem.mode)
        values[name] = simulate(problem, plan).value_s
    return values
