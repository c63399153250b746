"""Keep the fastest *measured* plan: a prediction can be wrong, a measurement side by side cannot lose.

``diviml run --candidates N`` builds and times the N best distinct plans by prediction (the solver's,
HEFT's, greedy's, each device alone), always with the best single-device plan and every single-device
configuration of the machine (the whole CPU with all its threads among them), and keeps the fastest
measured. For a stream (throughput, pipeline) the replicated plans (the whole model, the plan's
stages) and the best pipeline are always among them, each priced as the stream runs
(``simulator.stream_price``, with the inputs in flight it runs at), each replicated plan twice: its
inputs sent by the shares, and to the next free replica; a plan whose devices pass tensors
back and forth (a cycle) is left out of the build, named with why. A tuned run also times each
single-device configuration with the default schedules, so tuning that measures slower inside the
model than the default rules is not kept. This module chooses and ranks; how a candidate is timed
is the caller's (``measure``), so the choice is tested with given timings.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import DivimlInputError
from ..plan import Plan
from ..simulator import simulate, stream_price
from ..solvers import Problem, get_solver
from ..solvers.replicas import stage_replicas, whole_model_replicas
from ..toolkit.single_device import single_device_plan
from ..units import format_seconds

log = logging.getLogger(__name__)


@dataclass
class Candidate:
    """A plan to build and time; ``threads`` sizes a single-device plan's CPU pool (None: as the
    platform gives the device); ``predicted_s`` is None where the cost model has no figure for it, and
    ``measured_s`` where no time was measured; ``default_schedules``: built with the default rules
    only, not the run's tuning database; ``outputs_differ``: from the reference's, so it never wins
    over a candidate whose outputs match."""

    label: str
    plan: Plan
    predicted_s: float | None
    threads: int | None = None
    measured_s: float | None = None
    default_schedules: bool = False
    outputs_differ: bool = False
    in_flight: int | None = None  # a stream's inputs in flight, as priced (None: one at a time)
    left_out: str | None = None  # why it is not built and timed (None: it is)
    policy: str = "shares"  # how a replicated plan's stream picks a replica (``runtime.replicas.POLICIES``)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "solver": self.plan.solver,
            "devices": self.plan.devices_used(),
            "threads": self.threads,
            "default_schedules": self.default_schedules,
            "predicted_s": self.predicted_s,
            "measured_s": self.measured_s,
            "outputs_differ": self.outputs_differ,
            "in_flight": self.in_flight,
            "replicas": len(self.plan.replicas),
            "policy": self.policy if self.plan.replicas else None,
            "left_out": self.left_out,
        }


@dataclass
class Selection:
    candidates: list[Candidate]  # fastest measured first
    winner: Candidate

    @property
    def margin(self) -> float | None:
        """How much faster the winner measured than the next candidate (runner-up time / winner's)."""
        if len(self.candidates) < 2 or not self.winner.measured_s or self.candidates[1].measured_s is None:
            return None
        return self.candidates[1].measured_s / self.winner.measured_s

    def to_json(self) -> dict[str, Any]:
        return {
            "winner": self.winner.label,
            "margin": self.margin,
            "candidates": [c.to_json() for c in self.candidates],
        }


def plan_key(plan: Plan) -> tuple:
    """Two plans that build the same executable have the same key: the assignment, the device orders
    where there are several devices (one device runs its kernels in the order data allows), and the
    replica groups."""
    several = len(set(plan.assignment.values())) > 1
    order = tuple(sorted((d, tuple(ks)) for d, ks in plan.order.items())) if plan.order and several else None
    replicas = tuple((tuple(g.kernels), tuple(sorted(g.shares.items()))) for g in plan.replicas)
    return tuple(sorted(plan.assignment.items())), order, replicas


def candidate_plans(problem: Problem, chosen: Plan, count: int) -> list[Candidate]:
    """The ``count`` best distinct plans by prediction among ``chosen``, HEFT's and greedy's (latency),
    and each device alone; the best single-device plan is always among them. For a stream, the
    replicated plans and the best pipeline are always among them too, and plans whose device graph
    has a cycle are left out (``Candidate.left_out``)."""
    if count < 1:
        raise DivimlInputError(f"must be at least 1, got {count}", field="--candidates")
    plans = [(f"{chosen.solver or 'given'} plan", chosen)]
    if problem.objective == "latency":
        plans += [
            (f"{name} plan", get_solver(name, exact_fallback=False).solve(problem)) for name in ("heft", "greedy")
        ]
    plans += [(f"{device} alone", single_device_plan(problem, device)) for device in problem.platform.device_names]
    always = stream_plans(problem, chosen) if problem.objective != "latency" else []
    seen: dict[tuple, Candidate] = {}
    for position, (label, plan) in enumerate(plans + always):
        key = plan_key(plan)
        if key in seen:
            if position >= len(plans):  # e.g. the solver's plan is the whole model replicated
                seen[key].label += f" = {label}"
            continue
        sim = simulate(problem, plan)
        if not sim.feasible:
            continue
        seen[key] = priced(problem, label, plan)
        if problem.objective != "latency" and not sim.device_graph_acyclic:
            seen[key].left_out = CYCLE
    scored = {key: c for key, c in seen.items() if not c.left_out}
    left_out = [c for c in seen.values() if c.left_out]
    ranked = sorted(scored.values(), key=lambda c: c.predicted_s)
    singles = [c for c in ranked if len(c.plan.devices_used()) == 1 and not c.plan.replicas]
    chosen_ones = ranked[:count]
    for candidate in [*singles[:1], *(scored.get(plan_key(plan)) for _, plan in always)]:
        if candidate is not None and candidate not in chosen_ones:
            chosen_ones.append(candidate)
    return chosen_ones + [next_free_twin(c) for c in chosen_ones if len(c.plan.routes()) > 1] + left_out


def next_free_twin(candidate: Candidate) -> Candidate:
    """``candidate``'s replicated plan with each input sent to the replica with the fewest inputs in
    it rather than by the shares: where one replica runs slower than its share says (its core also
    runs the driver, another process runs beside it) the others take more. Priced as the shares run:
    the simulator has no model of who is free first."""
    return Candidate(
        f"{candidate.label}, each input to the next free replica",
        candidate.plan,
        candidate.predicted_s,
        threads=candidate.threads,
        in_flight=candidate.in_flight,
        policy="next_free",
    )


CYCLE = (
    "its devices pass tensors back and forth (a cycle in the device graph): each input waits on both "
    "devices in turn, which a stream's period does not price"
)


def priced(problem: Problem, label: str, plan: Plan, threads: int | None = None) -> Candidate:
    """A candidate with its predicted time: the latency, or the period of its stream as it runs."""
    if problem.objective == "latency":
        return Candidate(label, plan, simulate(problem, plan).value_s, threads=threads)
    price = stream_price(problem, plan)
    return Candidate(label, plan, price.period_s, threads=threads, in_flight=price.in_flight)


def stream_plans(problem: Problem, chosen: Plan) -> list[tuple[str, Plan]]:
    """What a stream is always timed with: the whole model replicated on every device that holds it,
    ``chosen``'s stages replicated (where it has none), and the best pipeline of one stage per device
    (SliceGraph within a few seconds)."""
    out = []
    if problem.objective == "throughput":
        whole = whole_model_replicas(problem)
        if whole is not None:
            out.append(("the whole model replicated", whole))
        stages = None if chosen.replicas else stage_replicas(problem, chosen)
        if stages is not None:
            out.append((f"{chosen.solver or 'given'} plan, its stages replicated", stages))
    if problem.objective != "pipeline" and len(problem.platform.devices) > 1:
        pipeline = Problem(
            problem.graph, problem.platform, problem.costs, objective="pipeline", stages=len(problem.platform.devices)
        )
        try:
            out.append(("the best pipeline", get_solver("slicegraph", time_limit_s=PIPELINE_TIME_S).solve(pipeline)))
        except DivimlInputError as error:  # no pipeline fits: the other plans still run
            log.info("no pipeline candidate: %s", error)
    return out


PIPELINE_TIME_S = 5.0  # SliceGraph's limit for the pipeline that a stream is timed with


def select_fastest(candidates: list[Candidate], measure: Callable[[Candidate], float]) -> Selection:
    """Time every candidate with ``measure`` (seconds per inference; not finite: no time) and rank
    them, those whose outputs match first, then fastest first, those without a time last; a tie goes
    to the earlier candidate."""
    if not candidates:
        raise DivimlInputError("no candidate plans to time", field="--candidates")
    for candidate in candidates:
        seconds = math.inf if candidate.left_out else measure(candidate)
        candidate.measured_s = seconds if math.isfinite(seconds) else None
    ranked = sorted(candidates, key=lambda c: (c.outputs_differ, c.measured_s is None, c.measured_s or 0.0))
    return Selection(ranked, ranked[0])


def format_selection(selection: Selection) -> str:
    """The candidates' table: predicted and measured side by side, the winner marked."""
    timed = [c for c in selection.candidates if not c.left_out]
    lines = [f"candidates, built and timed now ({len(timed)}; the fastest measured is kept):"]
    width = max(44, *(len(c.label) + 2 for c in selection.candidates))
    for candidate in timed:
        mark = "  <- kept" if candidate is selection.winner else ""
        mark += "  (outputs DIFFERENT from the reference)" if candidate.outputs_differ else ""
        mark += f"  ({candidate.in_flight} in flight)" if candidate.in_flight else ""
        known = candidate.predicted_s is not None and math.isfinite(candidate.predicted_s)
        predicted = format_seconds(candidate.predicted_s) if known else "not predicted"
        lines.append(
            f"  {candidate.label:<{width}}predicted {predicted:>12}   measured "
            f"{format_seconds(candidate.measured_s):>12}{mark}"
        )
    for candidate in selection.candidates:
        if candidate.left_out:
            lines.append(
                f"  {candidate.label:<{width}}predicted {format_seconds(candidate.predicted_s):>12}   "
                f"not built: {candidate.left_out}"
            )
    if selection.margin is not None:
        lines.append(
            f"kept {selection.winner.label}: {selection.margin:.2f}x faster than the next candidate "
            f"({selection.candidates[1].label})"
        )
    if selection.winner.default_schedules:
        lines.append(
            "the tuned schedules measured slower inside the model than the default ones: the default build is kept"
        )
    return "\n".join(lines)
