"""Lower bounds on the best ``stage_serial`` period (pipelines of at most K stages): the combinatorial
ones (average load, the dearest kernel, a kernel's neighbourhood, the tensors no stage keeps inside:
``separation``), the downset DP's value where the
graph's ideals fit (the optimum, or a relaxation of it), and the MIP relaxations of Archer et al.
(three superblocks; guess the bottleneck block), each from a time-limited MIP's proven bound only
(docs/solvers.md#mtpp), and the stage cover (``stage_cover.py``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import mip
import numpy as np

from ..errors import DivimlInputError
from ..plan import Plan
from ..problem import Problem
from ..toolkit.deadline import Deadline
from ..toolkit.downsets import TooManyIdeals, downset_plan
from ..toolkit.mip_backend import check_backend
from ..toolkit.pages import without_huge_pages
from ..toolkit.pipeline_model import (
    BlockPricing,
    BuildStopped,
    MipBuilder,
    PipelineData,
    PipelineModel,
    cheapest_pricing,
    optimize,
    time_unit,
)
from .stage_cover import stage_cover_bound

log = logging.getLogger(__name__)
DP_IDEALS = 150_000  # the downset DP runs where the graph has at most this many ideals, if in time
SEPARATION_UP_TO = 8_000  # kernels: the separation bound keeps an n x n ancestor matrix (64 MB at 8,000)
PAIRS_PER_PASS = 4_096  # producer-consumer pairs priced per numpy pass (pairs x n booleans each)
# From this many stages on the stage cover (each stage pays its own transfers, which superblocks
# lump) is the best bound and gets two thirds of the bound time without a node limit, below a third:
# randwire_er:nodes=32 at K = 16, defaults: 47.85 us with a third, 52.63 with two thirds;
# randwire_ws:nodes=64 at K = 4: the MIPs' 287.6 us with a third, 273.9 with two thirds.
MANY_STAGES = 8


@without_huge_pages
def pipeline_bounds(
    problem: Problem,
    deadline: Deadline | None = None,
    *,
    backend: str = "highs",
    seed: int = 0,
    superblock_positions: int = 16,
    exact_mip: bool = True,
    downsets: bool = True,
    stage_cover: bool = True,
    max_nodes: int | None = None,
    stats: dict | None = None,
    upper_s: float = math.inf,
    alongside: Callable[[Deadline], float | None] | None = None,
) -> dict[str, float]:
    """Named lower bounds on the best ``stage_serial`` period with at most ``problem.stages`` stages.

    Without a ``deadline`` only the combinatorial ones (LB0); otherwise first the downset DP
    (if ``downsets``; where at most ``DP_IDEALS`` ideals and its pairs can be priced within half the
    time, given ``upper_s``, a known plan's period, if any; where it proves its plan optimal nothing
    more is run), then the stage cover (``stage_cover``: two thirds of the time left from
    ``MANY_STAGES`` stages on, else a third), then the MIP bounds (``mip_runs``), in this order,
    each MIP with a share of the time still left:
    three_superblock (at most ``superblock_positions`` positions, spread evenly), guess_bottleneck
    (all K positions) and, if ``exact_mip``, the exact MIP's bound. Each MIP may assume the bounds found before it: the
    superblock MIPs only those of the cheapest-priced problem itself (average_load, the dearest
    kernel at its cheapest, three_superblock), the exact MIP every one.

    ``max_nodes``: each MIP also stops after that many branch-and-bound nodes (the stage cover's
    pricings after ``PRICING_NODES``) and may use all the time left, so that, where no MIP reaches
    ``deadline`` first, the bounds are the same on every run (one thread, one seed).
    ``stats``, if given, receives the MIPs run and those the clock stopped (``stopped_by_time``, the
    stage cover counting as one). ``alongside``: the bound, by a deadline, of a stage cover already
    running beside the solver (``CoverAlongside.result``); taken at the end in place of running the
    cover here, and the MIPs get all the time."""
    began = time.perf_counter()
    data, cheap, stages, parts = relaxed_pipeline(problem)
    if deadline is None or not parts or not math.isfinite(parts["largest_kernel"]):
        return parts
    solved = downset_bound(problem, deadline.within(deadline.left() / 2), upper_s=upper_s) if downsets else None
    if solved is not None:
        parts["downsets"] = solved.lower_bound_s
        if solved.optimal:
            return parts
    covering = stage_cover and alongside is None
    timed_out = _cover_here(parts, data, cheap, stages, deadline, backend, seed, max_nodes) if covering else 0
    runs = mip_runs(stages, superblock_positions, exact_mip)
    found, spent, mips_timed_out = mip_bounds(
        problem, data, cheap, stages, runs, parts, deadline, backend=backend, seed=seed, max_nodes=max_nodes
    )
    timed_out += mips_timed_out
    parts.update(_best_of_mips(found))
    covered = alongside(deadline) if alongside is not None and stage_cover else None
    if covered is not None:
        parts["stage_cover"] = covered
    _log_bounds(parts, spent, time.perf_counter() - began, timed_out, len(runs) + int(covering), max_nodes)
    if stats is not None:
        stats.update({"mips": len(runs), "stopped_by_time": timed_out})
    return parts


def _cover_here(
    parts: dict[str, float],
    data: PipelineData,
    cheap: BlockPricing,
    stages: int,
    deadline: Deadline,
    backend: str,
    seed: int,
    max_nodes: int | None,
) -> int:
    """The stage cover's bound added to ``parts``, in two thirds of the time left from ``MANY_STAGES``
    stages on, else a third (with a node limit, all of it: then the time is a ceiling); whether the
    clock stopped it."""
    share = 2 / 3 if stages >= MANY_STAGES else 1 / 3
    until = deadline if max_nodes is not None else deadline.within(deadline.left() * share)
    covered, timed_out = timed_stage_cover(
        data, cheap, stages, max(parts.values()), until, backend, seed, repeatable=max_nodes is not None
    )
    if covered is not None:  # not the superblock MIPs' floor: it changed their node-limited
        parts["stage_cover"] = covered  # search, and lowered their bound (514 -> 495 us on one graph)
    return timed_out


def _best_of_mips(found: dict[str, list[float]]) -> dict[str, float]:
    """The MIPs' bounds by name: guess_bottleneck only as the minimum over every position (where that
    is finite), the others' largest."""
    parts = {name: max(found[name]) for name in ("three_superblock", "exact_mip") if found[name]}
    if found["guess_bottleneck"] and math.isfinite(min(found["guess_bottleneck"])):
        parts = {"guess_bottleneck": min(found["guess_bottleneck"]), **parts}
    return parts


def _log_bounds(
    parts: dict[str, float],
    spent: dict[str, float],
    took_s: float,
    timed_out: int,
    searches: int,
    max_nodes: int | None,
) -> None:
    """The bounds found and the time each search took; a warning where the clock stopped a
    node-limited search (the cover counts as one of the ``searches``): that bound is not repeatable."""
    log.info(
        "pipeline bounds in %.2f s: %s",
        took_s,
        ", ".join(f"{k} {v:.6g}" + (f" ({spent[k]:.2f} s)" if k in spent else "") for k, v in parts.items()),
    )
    if max_nodes is not None and timed_out:
        log.warning(
            "pipeline bounds: %d of %d searches (the MIPs and the stage cover) stopped at the time limit "
            "before their node limit (%d): not repeatable",
            timed_out,
            searches,
            max_nodes,
        )


def timed_stage_cover(
    data: PipelineData,
    cheap: BlockPricing,
    stages: int,
    floor_s: float,
    deadline: Deadline,
    backend: str,
    seed: int,
    repeatable: bool = False,
) -> tuple[float | None, int]:
    """The stage cover's bound above ``floor_s`` (None where it refutes nothing), and 1 where the
    clock stopped it (else 0)."""
    mark, cover_stats = time.perf_counter(), {}
    covered = stage_cover_bound(
        data, cheap, stages, floor_s, deadline, seed=seed, backend=backend, stats=cover_stats, repeatable=repeatable
    )
    log.info("pipeline bounds: stage cover %s in %.2f s", covered, time.perf_counter() - mark)
    return covered, int(cover_stats["stopped_by_time"])


MipRun = tuple[str, int, float]  # (bound, superblock position, weight of its time share)


def mip_runs(stages: int, superblock_positions: int, exact_mip: bool) -> list[MipRun]:
    """The MIPs in the order they run: three_superblock at up to ``superblock_positions`` positions
    (middle ones first: they tend to give the best bound, which the later MIPs may then assume),
    guess_bottleneck at every position (weighing least: they add to the three-superblock bound only
    when every one of them does), then the exact MIP."""
    step = max(1, math.ceil(stages / superblock_positions))
    positions = sorted(set(range(1, stages + 1, step)) | {stages}, key=lambda i: (abs(2 * i - stages - 1), i))
    runs = [("three_superblock", i, 4.0) for i in positions] + [
        ("guess_bottleneck", i, 1.0) for i in range(1, stages + 1)
    ]
    return runs + [("exact_mip", 0, float(len(positions)))] * exact_mip


def mip_bounds(
    problem: Problem,
    data: PipelineData,
    cheap: BlockPricing,
    stages: int,
    runs: list[MipRun],
    parts: dict[str, float],
    deadline: Deadline,
    *,
    backend: str,
    seed: int,
    max_nodes: int | None,
) -> tuple[dict[str, list[float]], dict[str, float], int]:
    """Each MIP of ``runs`` with its weight's share of the time left before ``deadline`` (all of it
    with a node limit: then the time is a ceiling): the bounds found per name, the seconds spent per
    name, and how many MIPs the clock stopped. Each may assume the bounds found before it: the
    superblock MIPs those of the cheapest-priced problem, the exact MIP every one (``parts`` too)."""
    relaxed = max(parts["average_load"], float(cheap.work.max()), parts["neighbourhood"])
    found: dict[str, list[float]] = defaultdict(list)
    spent: dict[str, float] = defaultdict(float)
    timed_out = 0
    for done, (name, i, weight) in enumerate(runs):
        relaxed = max([relaxed, *found["three_superblock"]])
        mark = time.perf_counter()
        left = deadline.left()
        share = left if max_nodes is not None else left * weight / sum(w for *_, w in runs[done:])
        try:
            if deadline.passed():
                raise BuildStopped("no time left")
            if name == "exact_mip":
                known = [*parts.values(), relaxed, min(found["guess_bottleneck"])]
                floor = max(b for b in known if math.isfinite(b))
                until = Deadline(mark + share)
                model = PipelineModel(problem, stages, backend, floor, None, until)
                status = optimize(model.builder, until, seed, max_nodes)
                bound = model.builder.bound_s()
            else:
                bound = superblock_bound(
                    data,
                    [cheap] * 3,
                    (i - 1, stages - i),
                    guess=name == "guess_bottleneck",
                    deadline=Deadline(mark + share),
                    floor_s=relaxed,
                    backend=backend,
                    seed=seed,
                    max_nodes=max_nodes,
                )
                status = None
        except BuildStopped as stop:  # the MIPs left would get no more time each: none is started
            left_out = runs[done:]
            log.info("pipeline bounds: %s (%d kernels): %d of %d MIPs left out", stop, data.n, len(left_out), len(runs))
            timed_out += len(left_out)
            # guess_bottleneck is valid only as the minimum over every position: those not run keep the floor
            found["guess_bottleneck"] += [relaxed for name, *_ in left_out if name == "guess_bottleneck"]
            break
        took = time.perf_counter() - mark
        finished = status in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.INFEASIBLE)
        timed_out += not finished and took >= 0.95 * share
        if name == "guess_bottleneck":  # valid only as the minimum over every i: a gap keeps the floor
            found[name].append(relaxed if bound is None else max(bound, relaxed))
        elif bound is not None and math.isfinite(bound):
            found[name].append(bound)
        spent[name] += took
    return found, spent, timed_out


def downset_bound(
    problem: Problem, deadline: Deadline, max_ideals: int = DP_IDEALS, upper_s: float = math.inf
) -> Plan | None:
    """The downset DP's plan, whose ``lower_bound_s`` is the DP's value (the optimum where the plan is
    ``optimal``); None where the ideals exceed ``max_ideals``, the DP passes ``deadline`` or finds
    no split (then the plan's own checks say why). ``upper_s``: a known plan's period, if any."""
    try:
        return downset_plan(problem, max_ideals, deadline, upper_s)
    except (TooManyIdeals, TimeoutError, DivimlInputError) as stop:
        log.info("pipeline bounds: no downset DP (%s)", stop)
        return None


def relaxed_pipeline(problem: Problem) -> tuple[PipelineData, BlockPricing, int, dict[str, float]]:
    """What every pipeline bound starts from: the problem in ids, priced at its cheapest, the stage
    count and the combinatorial bounds (LB0)."""
    data = PipelineData.of(problem)
    devices = len(problem.platform.devices)
    stages = min(problem.stages or devices, devices)
    cheap = cheapest_pricing(problem, data)
    return data, cheap, stages, combinatorial_bounds(problem, data, cheap, stages)


def combinatorial_bounds(problem: Problem, data: PipelineData, cheap: BlockPricing, stages: int) -> dict[str, float]:
    """LB0: the work at its cheapest over the stages, and the dearest kernel with the model inputs it
    reads, each on its cheapest device (inf where a kernel can run nowhere); the neighbourhood and,
    up to ``SEPARATION_UP_TO`` kernels, the separation bound."""
    if not data.n:
        return {}
    host, costs = problem.platform.host, problem.costs
    reads = [[b for b, members in zip(data.input_bytes, data.input_consumers) if v in members] for v in range(data.n)]
    alone = [
        min(
            (
                costs.compute_s(k, d)
                + problem.output_return_s(k, d, empty_pays_latency=True)
                + sum(costs.transfer_s(b, host, d) for b in reads[v])
                for d in problem.feasible_devices(k)
            ),
            default=math.inf,
        )
        for v, k in enumerate(data.names)
    ]
    parts = {
        "average_load": float(cheap.work.sum()) / stages,
        "largest_kernel": max(alone),
        "neighbourhood": neighbourhood_bound(data, cheap),
    }
    if data.n <= SEPARATION_UP_TO and math.isfinite(parts["largest_kernel"]):
        parts["separation"] = separation_bound(data, cheap, stages)
    return parts


def neighbourhood_bound(data: PipelineData, pricing: BlockPricing) -> float:
    """The stage that holds kernel v pays v's work; for each producer u of v, u's work (u inside) or
    u's tensor entering (u outside, at least the layers v reads); and v's tensor leaving (at least
    the layers one consumer reads) or every consumer's work (all inside). The largest over v bounds
    the period for any number of stages: a bottleneck no extra stage removes (a heavy kernel with
    heavy tensors around it)."""
    entering: dict[tuple[int, int], float] = defaultdict(float)
    leaving: dict[tuple[int, int], float] = defaultdict(float)
    for layer, (u, members) in enumerate(zip(data.producers, data.consumers)):
        for v in members:
            entering[u, v] += pricing.in_price[layer]
            leaving[u, v] += pricing.out_price[layer]
    producers: dict[int, set[int]] = defaultdict(set)
    consumers: dict[int, set[int]] = defaultdict(set)
    for u, v in data.edges:
        producers[v].add(u)
        consumers[u].add(v)
    work, best = pricing.work, 0.0
    for v in range(data.n):
        bound = work[v] + sum(min(work[u], entering[u, v]) for u in producers[v])
        if consumers[v]:
            bound += min(min(leaving[v, w] for w in consumers[v]), sum(work[w] for w in consumers[v]))
        best = max(best, float(bound))
    return best


def separation_bound(data: PipelineData, pricing: BlockPricing, stages: int) -> float:
    """The transfers no plan of period T avoids. Blocks are convex, so a block holding producer u and
    consumer w holds every kernel on a path between them; where that work exceeds T, u's layer read
    by w leaves u's block and enters another in every plan of period at most T. At most K blocks of
    cost at most T then hold the work, those layers (out and in) and each model input once:
    K T >= work + inputs + sum of the layers apart at T. The bound is the largest T this refutes.
    randwire_er:nodes=32 at K = 16: 40.2 us where LB0 gives 37.8; on sparse random DAGs the paths
    of long edges hold little work, and it adds nothing (2,000 kernels at K = 8)."""
    apart = _path_work_per_layer(data, pricing.work)
    prices = pricing.out_price + pricing.in_price
    order = np.argsort(-apart, kind="stable")
    fixed = float(pricing.work.sum() + pricing.input_price.sum())
    # T below min(apart of the k-th layer, (fixed + the k dearest-apart layers' prices) / K) is refuted
    needed = (fixed + np.concatenate(([0.0], np.cumsum(prices[order])))) / stages
    reach = np.concatenate(([math.inf], apart[order]))
    return float(np.max(np.minimum(reach, needed)))


def _path_work_per_layer(data: PipelineData, work: np.ndarray) -> np.ndarray:
    """Per tensor layer, the largest work on the paths from its producer to one of its consumers
    (both ends included): what a block holding the two must hold."""
    n = data.n
    ancestors = np.zeros((n, n), dtype=bool)  # ancestors[v, u]: u is v or one of v's ancestors
    parents: dict[int, list[int]] = defaultdict(list)
    for u, v in data.edges:
        parents[v].append(u)
    for v in range(n):  # ids are topological positions: parents come first
        ancestors[v, v] = True
        for u in parents[v]:
            ancestors[v] |= ancestors[u]
    pairs = np.array(
        [(layer, u, w) for layer, (u, members) in enumerate(zip(data.producers, data.consumers)) for w in members],
        dtype=np.int64,
    ).reshape(-1, 3)
    apart = np.zeros(len(data.producers))
    for start in range(0, len(pairs), PAIRS_PER_PASS):
        layer, u, w = pairs[start : start + PAIRS_PER_PASS].T
        on_paths = ancestors[w] & ancestors[:, u].T  # descendants of u that are ancestors of w
        np.maximum.at(apart, layer, on_paths @ work)
    return apart


# ---------------------------------------------------------------------- superblock bounds
def superblock_bound(
    data: PipelineData,
    pricings: Sequence[BlockPricing],
    capacities: tuple[float, float],
    *,
    guess: bool,
    deadline: Deadline,
    floor_s: float = 0.0,
    backend: str = "highs",
    seed: int = 0,
    max_nodes: int | None = None,
) -> float | None:
    """One superblock MIP, A | B | C priced by ``pricings``, capacities (a, c) = (i - 1, K - i).

    ``guess=False`` (three-superblock): min T s.t. f(A) <= a T, f(B) <= T, f(C) <= c T.
    ``guess=True`` (B is the bottleneck): min f(B) s.t. f(A) <= a f(B), f(C) <= c f(B), f(B) exact.
    ``floor_s``: a lower bound on the optimum *of the priced problem* (the bottleneck of its best
    plan is at least that), which the MIP may assume. Returns the MIP's certified bound in seconds:
    None when the solver certified none, inf when it proved that no plan fits, by ``deadline``. Raises
    BuildStopped where building the model alone takes until ``deadline``."""
    check_backend(backend)
    builder = MipBuilder("superblocks", backend, time_unit(pricings[1]), deadline)
    m = builder.m
    x = [[m.add_var(var_type=mip.BINARY) for _ in range(data.n)] for _ in range(3)]
    for v in range(data.n):
        m += x[0][v] + x[1][v] + x[2][v] == 1
    builder.ordered(x, data)
    builder.together(x, data)
    cost = [builder.block_cost(x[s], data, pricings[s], exact=guess and s == 1) for s in range(3)]
    if guess:
        target = cost[1]
        m += target >= floor_s / builder.unit
    else:
        target = m.add_var(lb=floor_s / builder.unit)
        m += cost[1] <= target
    m += cost[0] <= capacities[0] * target
    m += cost[2] <= capacities[1] * target
    m.objective = mip.minimize(target)
    if optimize(builder, deadline, seed, max_nodes) == mip.OptimizationStatus.INFEASIBLE:
        return math.inf
    return builder.bound_s()
