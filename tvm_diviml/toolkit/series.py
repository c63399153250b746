"""Series decomposition of a kernel graph: the cut kernels that every path from the model's inputs to
its outputs passes through, in order, and the blocks of kernels between them.

A cut kernel separates the latency problem exactly: everything before it is its ancestor and must
finish (its tensors sent) before it starts, everything after it is its descendant and starts after it
ends. So one inference's makespan is a sum of segment times, each depending only on the devices of
the cut kernels at its two ends (docs/solvers.md#series-decomposition).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

import networkx as nx

from ..graph import OpGraph
from ..plan import Plan
from ..problem import Problem
from ..simulator import simulate
from ..tolerances import within_slack
from .cpsat_session import MAX_PRICES, CpsatSession, TickModel, tick_model
from .deadline import Deadline
from .windows import Context, list_schedule, order_by_start

log = logging.getLogger(__name__)

MIN_SEGMENT_S = 0.5
# Measured: bert_base on paper-node asks 468 (proven in 0.6 s); llama:layers=8,hidden=128 on 4 x paper-node
# (12 devices) asks 2,736: 136 of 300 distinct segments proven in 24 s, the bound 32% below the plan.
MAX_SEGMENT_PAIRS = 1000
SOURCE, SINK = ("series", "source"), ("series", "sink")  # virtual ends: tuples never clash with kernel names


@dataclass(frozen=True)
class Series:
    cuts: list[str]  # the cut kernels, first to last
    blocks: list[list[str]]  # len(cuts) + 1 blocks (before the first cut, between cuts, after the last)

    def segment(self, index: int) -> list[str]:
        """Segment ``index`` in topological order: block ``index`` and the cut that ends it (the last
        segment has no cut at its end)."""
        return self.blocks[index] + ([self.cuts[index]] if index < len(self.cuts) else [])


def series_decomposition(graph: OpGraph) -> Series:
    """The cut kernels (the dominators of the outputs, seen from the inputs) and the blocks between."""
    flow = nx.DiGraph()
    flow.add_nodes_from([SOURCE, SINK, *graph.kernels])
    flow.add_edges_from((e.src, e.dst) for e in graph.edges)
    readers = {k for graph_input in graph.inputs for k in graph_input.consumers}
    for kernel in graph.kernels:
        if kernel in readers or not graph.pred[kernel]:
            flow.add_edge(SOURCE, kernel)
        if kernel in graph.output_set or not graph.succ[kernel]:
            flow.add_edge(kernel, SINK)
    dominators = nx.immediate_dominators(flow, SOURCE)
    chain, node = [], dominators[SINK]
    while node != SOURCE:
        chain.append(node)
        node = dominators[node]
    cuts = list(reversed(chain))
    is_cut = set(cuts)
    blocks: list[list[str]] = [[] for _ in range(len(cuts) + 1)]
    passed = 0
    for kernel in graph.topo_order:  # an ancestor of a cut comes before it in any topological order
        if kernel in is_cut:
            passed += 1
        else:
            blocks[passed].append(kernel)
    return Series(cuts, blocks)


@dataclass(frozen=True)
class SegmentSchedule:
    """One segment with its ends on given devices: its time (from the opening cut's end to the closing
    cut's end; after the last cut, to the end of the inference), a bound on it, and its schedule."""

    value_s: float
    bound_s: float
    proven: bool
    assignment: dict[str, str]
    start_s: dict[str, float]  # from the segment's start


@dataclass
class SeriesSolution:
    plan: Plan  # the DP's best path, every segment as solved
    bound_s: float  # the DP over segment bounds: a lower bound for the whole problem
    solves: int  # segment schedules asked of CP-SAT (identical ones are solved once)
    proven: int  # of those, proven optimal


def series_obstacle(problem: Problem, series: Series) -> str | None:
    """Why not to use the series decomposition for ``problem`` (None: use it): where it is not exact
    (``decomposable``; costs that charge the executor's per-segment overheads couple segments too), or
    where its DP would ask too many segment schedules to finish in time."""
    why = decomposable(problem, series)
    if why is None and problem.costs.executor_segments:
        why = "the costs charge the executor's overheads per same-device segment"
    pairs = segment_pairs(problem, series)
    if why is None and pairs > MAX_SEGMENT_PAIRS:
        why = f"{pairs} segment schedules (a pair of end devices per segment) are too many to solve in time"
    prices = largest_segment_prices(problem, series) if why is None else 0
    if prices > MAX_PRICES:  # a model too large to build in time (``cpsat_session.MAX_PRICES``)
        why = f"its largest segment's model prices {prices} transfers, too many to build in time"
    return why


def largest_segment_prices(problem: Problem, series: Series) -> int:
    """The transfers the largest segment's CP-SAT model prices: its edges times the device pairs."""
    devices = len(problem.platform.devices)
    edges = max(
        (sum(len(problem.graph.pred[k]) for k in series.segment(i)) for i in range(len(series.cuts) + 1)), default=0
    )
    return edges * devices * devices


def decomposable(problem: Problem, series: Series) -> str | None:
    """Why the series decomposition is not exact for ``problem`` (None when it is): it needs a cut
    kernel, no co-location group, and devices that hold the whole model (memory couples segments)."""
    if not series.cuts:
        return "no cut kernel: no kernel lies on every path from the inputs to the outputs"
    if any(kernel.colocate is not None for kernel in problem.graph.kernels.values()):
        return "co-location groups tie segments together"
    short = devices_short_of_the_model(problem)
    return f"memory can bind on {', '.join(short)}: segments compete for it" if short else None


def segment_pairs(problem: Problem, series: Series) -> int:
    """How many segment schedules the DP asks for: per segment, the pairs of its end cuts' devices."""
    options = [1, *(len(problem.feasible_devices(cut)) for cut in series.cuts), 1]
    return sum(a * b for a, b in zip(options, options[1:]))


def devices_short_of_the_model(problem: Problem) -> list[str]:
    """Devices that cannot hold the whole model (every weight, activation and input at once): only
    there can memory cut a plan."""
    graph = problem.graph
    everything = sum(graph.weights.values()) + sum(k.output_bytes for k in graph.kernels.values())
    everything += sum(graph_input.bytes for graph_input in graph.inputs)
    return [d.name for d in problem.platform.devices if d.memory_bytes is not None and d.memory_bytes < everything]


class SeriesSolver:
    """The DP over the devices of the cut kernels, each segment solved by CP-SAT (``session``) once
    per pair of end devices; identical segments are solved once."""

    def __init__(self, problem: Problem, series: Series, session: CpsatSession, *, segment_time_limit_s: float):
        self.problem, self.series, self.session = problem, series, session
        self.segment_time_limit_s = segment_time_limit_s
        self.answers: dict[str, dict] = {}
        self.solves = self.proven = 0

    def solve(self, deadline: Deadline) -> SeriesSolution | None:
        """The best path of the DP (None when some segment found no schedule on every path), and the
        DP over the segments' bounds, which holds whatever CP-SAT proved."""
        cuts, problem = self.series.cuts, self.problem
        options = [problem.feasible_devices(cut) for cut in cuts]
        closes = [*options, [None]]  # segment i opens on cut i - 1 (the devices ``reached``), closes on cut i
        pairs_left = segment_pairs(problem, self.series)
        # device of the last cut so far -> (best value, its segments, the least bound)
        reached: dict = {None: (0.0, [], 0.0)}
        for index in range(len(cuts) + 1):
            step: dict = {}
            for close in closes[index]:
                best, path, bound = math.inf, None, math.inf
                for open_, (so_far, segments, so_far_bound) in reached.items():
                    if deadline.passed():  # a DP short of some pair has no path and no bound
                        log.info("series decomposition: the time limit ended before every segment was solved")
                        return None
                    # an even share of the time left, but never under half a second while time is left:
                    # most pairs repeat a segment already solved (cached) or prove in milliseconds
                    share = max(deadline.left() / max(pairs_left, 1), min(MIN_SEGMENT_S, deadline.left()))
                    until = deadline.within(min(self.segment_time_limit_s, share))
                    pairs_left -= 1
                    segment = self.segment(index, open_, close, until)
                    if path is None or so_far + segment.value_s < best:
                        best, path = so_far + segment.value_s, [*segments, segment]
                    bound = min(bound, so_far_bound + segment.bound_s)
                step[close] = (best, path, bound)
            reached = step
        value_s, segments, bound_s = reached[None]
        if not math.isfinite(value_s):
            return None
        return SeriesSolution(self.plan(segments), bound_s, self.solves, self.proven)

    def segment(self, index: int, open_: str | None, close: str | None, until: Deadline) -> SegmentSchedule:
        """Segment ``index`` opening on ``open_`` (its cut finished at time 0) and closing on ``close``,
        solved by ``until``."""
        problem, series = self.problem, self.series
        window = series.segment(index)
        opening = series.cuts[index - 1] if index > 0 else None
        returned = problem.output_return_s(opening, open_) if opening is not None and open_ is not None else 0.0
        if not window:  # after the last cut, nothing but its output's trip home
            return SegmentSchedule(returned, returned, True, {}, {})
        if opening is not None and index < len(series.cuts) and window == [series.cuts[index]]:  # two cuts in a row
            cut = window[0]
            nbytes = max(e.bytes for e in problem.graph.pred[cut])
            moved = problem.costs.transfer_s(nbytes, open_, close) if open_ != close else 0.0
            return SegmentSchedule(
                moved + problem.costs.compute_s(cut, close),
                moved + problem.costs.compute_s(cut, close),
                True,
                {cut: close},
                {cut: moved},
            )
        context = Context({opening: open_}, {opening: 0.0}) if opening is not None else Context()
        hint = list_schedule(problem, window, context, self.simple_assignment(window, open_, close))
        ends_on = {window[-1]: close} if close is not None else None
        model = tick_model(problem, window, context, ends_on=ends_on, hint=hint, horizon_s=hint.objective_s)
        solution = model.solution(problem, self.answer(model, until))
        if solution is None:  # CP-SAT found nothing in time: the list schedule stands
            return SegmentSchedule(max(hint.objective_s, returned), returned, False, hint.assignment, hint.start_s)
        return SegmentSchedule(
            max(solution.objective_s, returned),
            max(solution.bound_s, returned),
            solution.optimal,
            solution.assignment,
            solution.start_s,
        )

    def simple_assignment(self, window: list[str], open_: str | None, close: str | None) -> dict[str, str]:
        """A segment's starting plan: every kernel where the segment closes (else where it opens, else
        on its fastest device); the closing cut on its device."""
        problem = self.problem
        assignment = {}
        for kernel in window:
            feasible = problem.feasible_devices(kernel)
            preferred = [d for d in (close, open_) if d in feasible]
            assignment[kernel] = (
                preferred[0] if preferred else min(feasible, key=lambda d: problem.costs.compute_s(kernel, d))
            )
        if close is not None:
            assignment[window[-1]] = close
        return assignment

    def answer(self, model: TickModel, until: Deadline) -> dict:
        """CP-SAT's answer for ``model`` by ``until``, once per distinct model (identical segments share it)."""
        key = json.dumps(model.data, sort_keys=True)
        if key not in self.answers:
            self.answers[key] = self.session.solve(model, until)
            self.solves += 1
            self.proven += self.answers[key]["status"] == "OPTIMAL"
        return self.answers[key]

    def plan(self, segments: list[SegmentSchedule]) -> Plan:
        """The segments' schedules joined: each device runs segment by segment, by start within one."""
        graph = self.problem.graph
        assignment = {k: d for segment in segments for k, d in segment.assignment.items()}
        phase = {k: index for index, segment in enumerate(segments) for k in segment.assignment}
        start = {k: s for segment in segments for k, s in segment.start_s.items()}
        return Plan(
            assignment, objective="latency", mode="latency", order=order_by_start(graph, assignment, start, phase)
        )


def series_plan(
    problem: Problem, session: CpsatSession, deadline: Deadline, *, segment_time_limit_s: float
) -> Plan | None:
    """The latency plan of the series decomposition, with the DP's bound and proof, or None where
    ``series_obstacle`` names a reason not to use it or it found no plan in time."""
    if deadline.passed():  # finding the cut kernels alone takes a second on 100,000 kernels
        log.info("series decomposition not tried: the time limit has passed")
        return None
    series = series_decomposition(problem.graph)
    why = series_obstacle(problem, series)
    if why is not None:
        log.info("series decomposition not used: %s", why)
        return None
    solver = SeriesSolver(problem, series, session, segment_time_limit_s=segment_time_limit_s)
    found = solver.solve(deadline)
    if found is None:
        log.info("series decomposition: no plan in time")
        return None
    plan = found.plan
    sim = simulate(problem, plan)
    plan.value_s = sim.value_s
    plan.lower_bound_s = min(found.bound_s, sim.value_s)
    plan.optimal = sim.feasible and within_slack(sim.value_s, found.bound_s)
    largest = max(len(series.segment(i)) for i in range(len(series.blocks)))
    plan.series = {
        "cuts": len(series.cuts),
        "largest_segment": largest,
        "segment_solves": found.solves,
        "segment_solves_proven": found.proven,
        "bound_s": found.bound_s,
    }
    log.info(
        "series decomposition: %d cut kernels, segments of at most %d kernels, %d of %d CP-SAT solves proven: "
        "%.6g s (bound %.6g s)",
        len(series.cuts),
        largest,
        found.proven,
        found.solves,
        sim.value_s,
        found.bound_s,
    )
    return plan
