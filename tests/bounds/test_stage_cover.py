"""The stage-cover bound: its interval prices against the MIP's block cost, validity against the
brute-force optimum, and the transfers between stages that the superblock relaxations drop."""

from __future__ import annotations

import itertools
import math

import mip
import networkx as nx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.app.workload import load_workload
from tvm_diviml.bounds.pipeline import pipeline_bounds
from tvm_diviml.bounds.stage_cover import (
    FLOOR_MARGIN,
    BlockCosts,
    StageCover,
    _BlockPricer,
    _Neighbourhood,
    interval_costs,
    random_topological_orders,
    stage_cover_bound,
)
from tvm_diviml.solvers import Problem, get_solver
from tvm_diviml.toolkit.deadline import Deadline
from tvm_diviml.toolkit.pipeline_model import MipBuilder, PipelineData, cheapest_pricing

from ..bruteforce import best_pipeline
from ..helpers import TOLERANCE, chain, examples, graph_of, pipeline, table, unit_platform
from ..strategies import dag_problems, pipeline_problems


def block_cost(data, pricing, inside) -> float:
    """The cost of the block ``inside`` (a mask over kernel ids) under ``pricing``."""
    return BlockCosts(data, pricing).cost(inside)


def mip_block_cost(data, pricing, inside) -> float:
    """The pipeline MIPs' price of the block ``inside``: their cost expression at fixed membership,
    every indicator as low as its constraints allow."""
    builder = MipBuilder("fixed block", "highs", 1.0)
    builder.m.add_var()  # a block without transfers has no indicator: the model still needs a column
    builder.m.objective = mip.minimize(builder.block_cost([int(bit) for bit in inside], data, pricing))
    builder.m.optimize()
    return builder.m.objective_value


@settings(max_examples=examples(20), deadline=None)
@given(dag_problems(max_kernels=7), st.integers(0, 3))
def test_interval_prices_are_the_mips_block_costs(case, seed):
    graph, platform, costs = case
    problem = pipeline(graph, platform, costs, 2)
    data = PipelineData.of(problem)
    pricing = cheapest_pricing(problem, data)
    order = random_topological_orders(data, 1, seed)[0]
    prices = interval_costs(data, pricing, order)
    for a in range(data.n):
        for b in range(a + 1, data.n + 1):
            inside = np.zeros(data.n, dtype=bool)
            inside[order[a:b]] = True
            assert math.isclose(prices[a, b], block_cost(data, pricing, inside), rel_tol=1e-12, abs_tol=1e-12)
            assert math.isclose(prices[a, b], mip_block_cost(data, pricing, inside), rel_tol=1e-6, abs_tol=1e-9)
    assert np.isinf(prices[np.tril_indices(data.n + 1)]).all()


def test_random_orders_are_topological_repeatable_and_differ():
    platform = unit_platform()
    graph = graph_of([(a, b, 0) for a, b in ("ab", "ac", "bd", "cd")])
    data = PipelineData.of(pipeline(graph, platform, table(platform, dict.fromkeys("abcd", 1.0)), 2))
    orders = random_topological_orders(data, 12, seed=5)
    for order in orders:
        position = {v: i for i, v in enumerate(order.tolist())}
        assert sorted(position) == list(range(data.n)) and all(position[u] < position[v] for u, v in data.edges)
    assert [o.tolist() for o in orders] == [o.tolist() for o in random_topological_orders(data, 12, seed=5)]
    assert len({tuple(o.tolist()) for o in orders}) == 2  # b and c swap


@settings(max_examples=examples(25), deadline=None)
@given(pipeline_problems(max_kernels=5))
def test_the_cover_never_refutes_the_optimum_and_its_bound_lies_below(problem):
    optimum = best_pipeline(problem)
    data = PipelineData.of(problem)
    pricing = cheapest_pricing(problem, data)
    cover = StageCover(data, pricing, problem.stages)
    assert not cover.refutes(optimum * (1 + TOLERANCE), Deadline.never())
    bound = stage_cover_bound(data, pricing, problem.stages, 0.0, Deadline.never())
    assert bound is None or bound <= optimum * (1 + TOLERANCE)


@settings(max_examples=examples(20), deadline=None)
@given(dag_problems(max_kernels=7), st.integers(1, 4))
def test_the_interval_period_is_the_best_split_of_an_order_into_k_intervals(case, stages):
    problem = pipeline(*case, 2)
    data = PipelineData.of(problem)
    pricing = cheapest_pricing(problem, data)
    cover = StageCover(data, pricing, stages)
    best = math.inf
    for order in cover.orders:
        for cuts in itertools.chain.from_iterable(
            itertools.combinations(range(1, data.n), k) for k in range(min(stages, data.n))
        ):
            ends = [0, *cuts, data.n]
            blocks = [np.isin(np.arange(data.n), order[a:b]) for a, b in zip(ends, ends[1:])]
            best = min(best, max(block_cost(data, pricing, inside) for inside in blocks))
    assert math.isclose(cover.interval_period(), best, rel_tol=1e-9)
    # a cover of that many blocks exists there, so the LP over the known columns needs no more
    assert cover.needed(best * (1 + 1e-9), Deadline.never()) <= stages + 1e-6


def test_each_stage_pays_its_own_transfers_where_the_superblocks_lump_them():
    # Eight 1 s kernels in a chain, 5 s per cut: a middle stage pays 10 s of transfers and an end
    # stage 5, so the best of 5 stages is all in one (8 s). A superblock of two stages pays one cut:
    # [k0] | [k1..k7] as two lumped stages costs 6 | 12 <= 2 x 6.
    graph, platform, costs = chain(8, devices="ABCDE")
    problem = pipeline(graph, platform, costs, 5)
    assert pipeline_bounds(problem, Deadline.after(30))["downsets"] == 8.0  # the DP's optimum
    lumped = pipeline_bounds(problem, Deadline.after(30), downsets=False, stage_cover=False)
    assert lumped["three_superblock"] < 7.0 and lumped["guess_bottleneck"] < 7.0
    parts = pipeline_bounds(problem, Deadline.after(30), downsets=False)
    assert 7.5 <= parts["stage_cover"] <= 8.0


def test_the_same_problem_gets_the_same_bound_and_a_past_deadline_none():
    graph, platform, costs = chain(8)
    problem = pipeline(graph, platform, costs, 3)
    data = PipelineData.of(problem)
    pricing = cheapest_pricing(problem, data)
    runs = [stage_cover_bound(data, pricing, 3, 2.0, Deadline.never(), 9.0) for _ in range(2)]
    assert runs[0] == runs[1] and runs[0] is not None
    stats: dict = {}
    passed = Deadline.after(0.0)
    assert stage_cover_bound(data, pricing, 3, 2.0, passed, 9.0, stats=stats) is None and stats["stopped_by_time"]
    assert stage_cover_bound(data, pricing, 3, 9.0, Deadline.never(), 9.0) is None  # nothing between the two


def test_pricings_stop_at_a_node_limit_only_where_the_bound_must_repeat(monkeypatch):
    import tvm_diviml.bounds.stage_cover as stage_cover

    limits = []

    def recording(builder, deadline, seed, max_nodes=None):
        limits.append(max_nodes)
        return optimize(builder, deadline, seed, max_nodes)

    optimize = stage_cover.optimize
    monkeypatch.setattr(stage_cover, "optimize", recording)
    graph, platform, costs = chain(8)
    problem = pipeline(graph, platform, costs, 3)
    data = PipelineData.of(problem)
    pricing = cheapest_pricing(problem, data)
    by_clock = stage_cover_bound(data, pricing, 3, 2.0, Deadline.never(), 9.0)
    assert limits and set(limits) == {None}
    limits.clear()
    by_nodes = stage_cover_bound(data, pricing, 3, 2.0, Deadline.never(), 9.0, repeatable=True)
    assert limits and set(limits) == {stage_cover.PRICING_NODES}
    assert by_nodes == by_clock  # eight kernels: both prove every block the best
    limits.clear()
    pipeline_bounds(problem, Deadline.after(30), downsets=False, max_nodes=50)
    assert limits and stage_cover.PRICING_NODES in limits


def test_a_cover_whose_orders_would_not_fit_in_memory_is_not_run(monkeypatch, caplog):
    import tvm_diviml.bounds.stage_cover as stage_cover

    graph, platform, costs = chain(8)
    data = PipelineData.of(pipeline(graph, platform, costs, 3))
    pricing = cheapest_pricing(pipeline(graph, platform, costs, 3), data)
    needs = (stage_cover.ORDERS + 2 * stage_cover.AROUND * stage_cover.PRICINGS) * 8 * 9**2
    monkeypatch.setattr(stage_cover, "COVER_BYTES", needs)
    assert stage_cover_bound(data, pricing, 3, 2.0, Deadline.never(), 9.0) is not None
    monkeypatch.setattr(stage_cover, "COVER_BYTES", needs - 1)
    with caplog.at_level("INFO", logger="tvm_diviml.bounds.stage_cover"):
        assert stage_cover_bound(data, pricing, 3, 2.0, Deadline.never(), 9.0) is None
    assert "not run on 8 kernels" in caplog.text


def convex_blocks(data):
    """Every non-empty convex kernel set of a small graph, as masks (brute force)."""
    reach = np.eye(data.n, dtype=bool)
    for u, w in sorted(data.edges, reverse=True):  # ids are topological: later rows are complete first
        reach[u] |= reach[w]
    for bits in range(1, 2**data.n):
        inside = np.array([(bits >> v) & 1 for v in range(data.n)], dtype=bool)
        between = reach[inside].any(axis=0) & reach[:, inside].any(axis=1)
        if not (between & ~inside).any():
            yield inside


def random_duals(data, seed):
    return np.random.default_rng(seed).choice([0.0, 0.25, 0.5, 0.75], size=data.n)


@settings(max_examples=examples(20), deadline=None)
@given(dag_problems(max_kernels=7), st.integers(0, 2**7 - 1))
def test_the_search_reaches_what_paths_reach(case, bits):
    """The search's convexity checks read one reachability matrix: it must hold every path."""
    problem = pipeline(*case, 2)
    data = PipelineData.of(problem)
    neighbourhood = _Neighbourhood(data, BlockCosts(data, cheapest_pricing(problem, data)))
    graph = nx.DiGraph(data.edges)
    graph.add_nodes_from(range(data.n))
    inside = np.array([(bits >> v) & 1 for v in range(data.n)], dtype=bool)
    members = set(np.flatnonzero(inside).tolist())
    descendants = members.union(*(nx.descendants(graph, v) for v in members))
    ancestors = members.union(*(nx.ancestors(graph, v) for v in members))
    assert set(np.flatnonzero(neighbourhood.after(inside)).tolist()) == descendants
    assert set(np.flatnonzero(neighbourhood.before(inside)).tolist()) == ancestors


@settings(max_examples=examples(20), deadline=None)
@given(dag_problems(max_kernels=7), st.integers(0, 50), st.floats(0.2, 1.0))
def test_the_pricing_mip_finds_a_block_worth_the_target_or_proves_none_is(case, seed, share):
    problem = pipeline(*case, 2)
    data = PipelineData.of(problem)
    pricing = cheapest_pricing(problem, data)
    period = share * block_cost(data, pricing, np.ones(data.n, dtype=bool))
    duals = random_duals(data, seed)
    fitting = [inside for inside in convex_blocks(data) if block_cost(data, pricing, inside) <= period]
    best = max((float(duals[inside].sum()) for inside in fitting), default=0.0)
    for target in (t for t in (0.5 * best, best, 1.1 * best + 0.1) if t > 0):  # the cover's targets exceed 1
        block, value, ceiling = _BlockPricer(data, pricing, period, "highs").best_block(
            duals, target, Deadline.after(60), 0, None
        )
        assert ceiling is not None and ceiling >= best * (1 - 1e-6)  # a valid cap on every block's value
        if best < target * (1 - FLOOR_MARGIN):  # proven below the target: the period is refuted
            assert block is None and ceiling < target
        if best >= target * (1 + 1e-6):
            assert block is not None and value >= target * (1 - 1e-6)
        if block is not None:
            inside = np.zeros(data.n, dtype=bool)
            inside[list(block)] = True
            assert any((inside == other).all() for other in fitting)
            assert math.isclose(value, float(duals[inside].sum()), rel_tol=1e-6, abs_tol=1e-9)


@settings(max_examples=examples(20), deadline=None)
@given(dag_problems(max_kernels=7), st.integers(0, 50), st.floats(0.2, 1.0), st.integers(0, 3))
def test_the_neighbours_of_a_block_are_convex_improving_blocks_within_the_period(case, seed, share, start):
    graph, platform, costs = case
    problem = pipeline(graph, platform, costs, 2)
    data = PipelineData.of(problem)
    pricing = cheapest_pricing(problem, data)
    period = share * block_cost(data, pricing, np.ones(data.n, dtype=bool))
    duals = random_duals(data, seed) * 2
    blocks = list(convex_blocks(data))
    neighbourhood = _Neighbourhood(data, BlockCosts(data, pricing))
    first = tuple(np.flatnonzero(blocks[start % len(blocks)]).tolist())
    found = neighbourhood.improving(first, duals, period, most=64)
    convex = {tuple(np.flatnonzero(inside).tolist()) for inside in blocks}
    assert len(set(found)) == len(found) and first not in found
    for block in found:
        inside = np.zeros(data.n, dtype=bool)
        inside[list(block)] = True
        assert block in convex and duals[inside].sum() > 1 and block_cost(data, pricing, inside) <= period
    if found:  # the climb starts with the neighbours of the first block: one kernel in or out
        assert len(set(found[0]) ^ set(first)) == 1


@settings(max_examples=examples(20), deadline=None)
@given(dag_problems(max_kernels=7), st.integers(0, 50), st.floats(0.2, 1.0), st.integers(0, 7))
def test_the_local_search_climbs_from_its_starts_to_convex_blocks_within_the_period(case, seed, share, start):
    problem = pipeline(*case, 2)
    data = PipelineData.of(problem)
    pricing = cheapest_pricing(problem, data)
    period = share * block_cost(data, pricing, np.ones(data.n, dtype=bool))
    duals = random_duals(data, seed) * 2
    fitting = [inside for inside in convex_blocks(data) if block_cost(data, pricing, inside) <= period]
    neighbourhood = _Neighbourhood(data, BlockCosts(data, pricing))
    starts = [tuple(np.flatnonzero(fitting[(start + i) % len(fitting)]).tolist()) for i in range(2)] if fitting else []
    runs = [neighbourhood.search(starts, duals, period, math.inf, np.random.default_rng(seed)) for _ in range(2)]
    assert runs[0] == runs[1]  # its random restarts follow the seed
    value, block = runs[0]
    if not starts:
        assert block is None
        return
    inside = np.zeros(data.n, dtype=bool)
    inside[list(block)] = True
    assert any((inside == other).all() for other in fitting)
    assert math.isclose(value, float(duals[inside].sum()), rel_tol=1e-12)
    assert value >= max(float(duals[list(s)].sum()) for s in starts) - 1e-12
    assert value <= max(float(duals[other].sum()) for other in fitting) + 1e-12


def small_randwire():
    """randwire_er:nodes=10 (32 kernels) on gpu4 as 4 stages: its data, pricing and the DP's optimum."""
    workload = load_workload("randwire_er:nodes=10,stages=1,seed=3", "gpu4", "roofline")
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="pipeline", stages=4)
    data = PipelineData.of(problem)
    return data, cheapest_pricing(problem, data), get_solver("downsets").solve(problem).value_s


def test_the_cover_leaves_its_pricing_mips_the_blocks_the_local_search_cannot_find(monkeypatch):
    import tvm_diviml.bounds.stage_cover as stage_cover

    data, pricing, optimum = small_randwire()
    covers = []
    for searches in (stage_cover.LOCAL_SEARCHES, 0):
        monkeypatch.setattr(stage_cover, "LOCAL_SEARCHES", searches)
        cover = StageCover(data, pricing, 4)
        assert cover.refutes(0.99 * optimum, Deadline.never(), rounds=50)
        assert not cover.refutes(optimum * (1 + TOLERANCE), Deadline.never(), rounds=50)
        covers.append(cover)
    searching, alone = covers
    assert searching.searched > 0 and alone.searched == 0
    assert searching.pricings < alone.pricings


def test_a_pricing_mip_that_finds_nothing_ends_the_trial_only_where_the_search_has_nothing_either(monkeypatch):
    import tvm_diviml.bounds.stage_cover as stage_cover

    data, pricing, optimum = small_randwire()
    asked = []

    def nothing_found(self, duals, target, deadline, seed, max_nodes):
        asked.append(target)
        return None, 0.0, None  # stopped before any block or proof

    monkeypatch.setattr(stage_cover._BlockPricer, "best_block", nothing_found)
    monkeypatch.setattr(stage_cover, "SEARCH_WORTH", math.inf)  # every pricing goes to the MIP
    calls, default = {}, stage_cover.LOCAL_SEARCHES
    for searches in (default, 0):
        monkeypatch.setattr(stage_cover, "LOCAL_SEARCHES", searches)
        asked.clear()
        assert not StageCover(data, pricing, 4).refutes(0.99 * optimum, Deadline.never(), rounds=5)
        calls[searches] = len(asked)
    assert calls[0] == 1 and calls[default] > 1  # the search's blocks kept the trial going
