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
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from .bounds import CoverAlongside, lower_bounds
from .errors import DivimlInputError, forget_interrupt
from .plan import Plan
from .problem import Problem
from .simulator import Simulation, simulate
from .solvers import Solver, default_solver, get_solver
from .solvers.replicas import best_with_replicas
from .tolerances import SOLVER_SLACK
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

Status = Literal["optimal", "feasible", "infeasible", "interrupted"]


@dataclass
class Solved:
    """A solve's one response, as OR-Tools' CpSolver gives it: ``status`` ("optimal": proven by the
    solver, or by a bound that meets the value within the solvers' tolerance; "feasible"; "infeasible":
    the kept plan breaks a constraint or never ends; "interrupted": Ctrl-C ended the solve and the plan
    is the best found until then), the kept plan's simulated ``value_s``, the best bound ``bound_s``
    and the ``gap`` value / bound - 1 (None without a positive bound or a finite value); with the plan,
    its simulation, the bounds by source and the baselines (``fastest_single_device`` None where no
    device holds the whole model). Made by ``Solved.of``, which sets the four once."""

    plan: Plan
    simulation: Simulation
    bounds: dict[str, float]
    baselines: dict[str, float | None]
    status: Status
    value_s: float
    bound_s: float
    gap: float | None
    kept_single_device: str | None = None  # why auto kept the single device instead of the split
    replicated: str | None = None  # why auto replicated kernels (None: it did not)
    trace: list[Event] = field(default_factory=list)  # the best plan and bound as they improved
    bounds_s: float = 0.0  # seconds spent on the lower bounds after the solve

    @classmethod
    def of(
        cls,
        plan: Plan,
        simulation: Simulation,
        bounds: dict[str, float],
        baselines: dict[str, float | None],
        *,
        interrupted: bool = False,
        **details: Any,
    ) -> Solved:
        """The response for ``plan`` as ``simulation`` scores it, against the best of ``bounds``;
        ``details``: the other fields."""
        value, bound = simulation.value_s, max(bounds.values(), default=0.0)
        gap = value / bound - 1.0 if bound > 0 and math.isfinite(value) else None
        status: Status
        if not simulation.feasible or math.isinf(value):
            status = "infeasible"
        elif plan.optimal or (gap is not None and gap <= SOLVER_SLACK):
            status = "optimal"
        else:
            status = "interrupted" if interrupted else "feasible"
        return cls(plan, simulation, bounds, baselines, status, value, bound, gap, **details)


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
        chosen = get_solver(name, time_limit_s=time_limit_s - reserve, seed=seed)
        plan, sim, interrupted = _solve(problem, chosen, name, deadline, watch, interrupt_keeps_best)
        single, per_device = single_device_values(problem)  # None: no device holds the model (it must split)
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
            plan.optimal_among = "plans without replicas"
        baselines = _baselines(problem, plan if name in ("heft", "greedy") else None, single, per_device, deadline)
        bounds_began = time.perf_counter()
        searching = bound_time_limit_s > 0 and not (interrupted or _carries_proof(problem, plan))
        bounds = _bounds(problem, plan, sim, deadline, searching, alongside, watch, own_bound=not with_replicas)
        return Solved.of(
            plan,
            sim,
            bounds,
            baselines,
            interrupted=interrupted,
            kept_single_device=kept_single,
            replicated=replicated,
            trace=watch.trace,
            bounds_s=time.perf_counter() - bounds_began,
        )


def _solve(
    problem: Problem, solver: Solver, name: str, deadline: Deadline, watch: Incumbents, interrupt_keeps_best: bool
) -> tuple[Plan, Simulation, bool]:
    """``solver``'s plan and its simulation, or the better plan it offered on the way; and whether an
    interrupt ended the solve (with ``interrupt_keeps_best``, the best plan offered until then)."""
    interrupted = False
    try:
        plan = solver.solve(problem, deadline=deadline, watch=watch)
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
        watch.best.lower_bound_s, watch.best.solver, watch.best.solve_s = plan.lower_bound_s, plan.solver, plan.solve_s
        plan, sim = watch.best, simulate(problem, watch.best)
    return plan, sim, interrupted


def _baselines(
    problem: Problem, made: Plan | None, single: Plan | None, per_device: dict[str, dict], deadline: Deadline
) -> dict[str, float | None]:
    """The fastest single device, each device alone, and HEFT and greedy (``made``: one of them, where
    it was the solver)."""
    baselines: dict[str, float | None] = {"fastest_single_device": single.value_s if single else None}
    baselines.update({f"single:{device}": entry["value_s"] for device, entry in per_device.items()})
    # a solver that used its whole limit leaves the baselines a moment (milliseconds each but on
    # 100,000s of kernels, where HEFT takes 10 s and more and is left out)
    late = Deadline(max(deadline.at, time.perf_counter() + BASELINES_AFTER_DEADLINE_S))
    baselines.update(list_scheduling_baselines(problem, late, made))
    return baselines


def _carries_proof(problem: Problem, plan: Plan) -> bool:
    """Whether ``plan`` needs no searched bound: a plan found by the series decomposition already
    carries its bound (no second run of it), and a proven optimum that carries its bound needs none."""
    series_solved = problem.objective == "latency" and plan.series is not None
    return series_solved or (plan.optimal and plan.lower_bound_s is not None)


def _bounds(
    problem: Problem,
    plan: Plan,
    sim: Simulation,
    deadline: Deadline,
    searching: bool,
    alongside: CoverAlongside,
    watch: Incumbents,
    own_bound: bool,
) -> dict[str, float]:
    """The lower bounds by source, the solver's own among them where ``own_bound``; ``searching``:
    the searches get every second the solver left (on randwire_er:nodes=32 at K = 16 the solver
    ends at 19 s of 60, and the stage cover given 40 s instead of 10 took the gap from 58% to 33%),
    where that is at least ``MIN_BOUND_TIME_S`` (building the models alone takes longer on 1,000s
    of kernels)."""
    search = searching and deadline.left() >= MIN_BOUND_TIME_S
    bounds = lower_bounds(
        problem, deadline, search=search, upper_s=sim.value_s, alongside=alongside, progress=watch.phase
    )
    if plan.lower_bound_s is not None and own_bound:
        bounds["solver"] = plan.lower_bound_s
    if bounds:
        source = max(bounds, key=bounds.__getitem__)
        watch.bound(bounds[source], f"bound: {source}")
    return bounds


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
    option = "the whole model" if replicated.replicas_option == "whole_model" else "the plan's stages"
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


def list_scheduling_baselines(problem: Problem, deadline: Deadline, solved: Plan | None = None) -> dict[str, float]:
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
