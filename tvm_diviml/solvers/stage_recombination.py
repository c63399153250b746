"""Better ``stage_serial`` pipelines by price-and-branch: convex blocks priced by the stage cover's
column generation (docs/solvers.md#mtpp) just below the best period, then a set-partitioning MIP that
picks at most K of them covering every kernel once, every block within the target, their quotient
acyclic (each cycle found is cut off and the MIP solved again). Its blocks, in the quotient's
topological order, give one topological order that is then cut exactly (``slice_order``).

SliceGraph and the polish move cuts along orders and across windows of consecutive stages; a
partition mixing blocks that no single order's intervals hold is out of their reach:
randwire_er:nodes=40 at K = 16 with default options, 85.939 -> 83.955 us.
"""

from __future__ import annotations

import logging

import mip
import networkx as nx

from ..bounds.stage_cover import PRICING_NODES, StageCover
from ..plan import Plan
from ..problem import Problem
from ..simulator import simulate
from ..toolkit.deadline import Deadline
from ..toolkit.mip_backend import new_model, optimized
from ..toolkit.pipeline_model import PipelineData, candidate_devices, cheapest_pricing, stage_count
from .slicegraph import pipeline_plan, slice_order

log = logging.getLogger(__name__)
# The cover's n x n interval prices (32 orders and more) grow with the square of the kernels; past
# this many the blocks are not priced (the cover beside the solver stops at 600, one cover alone).
MOST_KERNELS = 400
MOST_PRICINGS = 48  # each adds four orders' interval prices: 290 MB on 400 kernels with these
STEP = 0.995  # each attempt asks for a period this share of the best so far
# Periods, as shares of the best so far, at which blocks are priced before each attempt: below the
# plan the LP needs more than K blocks and prices new ones; at the target alone it rarely does.
PRICED_AT = (0.95, 0.97, STEP)
ROUNDS = 2  # pricing MIPs per period priced at
MASTER_SHARE = 0.5  # of the time left, what one set-partitioning MIP may take at most


def recombine_stages(problem: Problem, plan: Plan, deadline: Deadline, seed: int = 0) -> Plan | None:
    """A pipeline of ``problem`` better than ``plan`` (its simulated period lower) made of priced
    blocks, improved again while it improves and ``deadline`` allows; None where none was found."""
    if not MOST_KERNELS >= len(problem.graph) >= 2 or problem.mode != "stage_serial" or not plan.stages:
        return None  # before any pricing: on 10,000 kernels the relaxed pipeline alone takes 0.3-0.6 s
    data, stages = PipelineData.of(problem), stage_count(problem)
    cover = StageCover(data, cheapest_pricing(problem, data), stages, seed=seed, backend="highs")
    cover.most_pricings, cover.pricing_nodes = MOST_PRICINGS, PRICING_NODES  # its time is the solver's
    index = {name: v for v, name in enumerate(data.names)}
    for stage in plan.stages:  # the plan's own blocks: the MIP can always rebuild most of it
        block = tuple(sorted(index[k] for k in stage))
        cover.columns[block] = cover.block_cost(block)
    best, found = simulate(problem, plan).value_s, None
    while not deadline.passed():
        for share in PRICED_AT:
            cover.refutes(best * share, deadline, rounds=ROUNDS)
        target = best * STEP
        blocks = _partition(data, cover.columns, target, stages, deadline)
        if blocks is None:
            break
        candidate = _sliced(problem, plan, [[data.names[v] for v in block] for block in blocks], stages)
        sim = simulate(problem, candidate)
        log.info("stage recombination: %d blocks within %.6g s, sliced to %.6g s", len(blocks), target, sim.value_s)
        if not (sim.feasible and sim.value_s < best):  # memory and co-location: the blocks do not see them
            break
        best, found = sim.value_s, candidate
    if found is not None:
        found.value_s = best
    return found


def _partition(
    data, columns: dict[tuple[int, ...], float], target: float, stages: int, deadline: Deadline
) -> list[list[int]] | None:
    """At most ``stages`` of the blocks of cost at most ``target`` partitioning the kernels, in an
    order that every edge follows, each block's ids sorted (ids follow the graph's topological order;
    None where the MIP finds none in its time)."""
    blocks = [block for block, cost in columns.items() if cost <= target]
    holders: list[list[int]] = [[] for _ in range(data.n)]
    for b, block in enumerate(blocks):
        for v in block:
            holders[v].append(b)
    if any(not held for held in holders):
        return None
    model = new_model("stage recombination", "highs")
    pick = [model.add_var(var_type=mip.BINARY, obj=1.0) for _ in blocks]
    for held in holders:
        model += mip.xsum(pick[b] for b in held) == 1
    model += mip.xsum(pick) <= stages
    while not deadline.passed():
        optimized(model, max_seconds=max(deadline.left() * MASTER_SHARE, 0.1))
        if not model.num_solutions:
            return None
        chosen = [b for b in range(len(blocks)) if pick[b].x > 0.5]
        quotient = _quotient(data, [blocks[b] for b in chosen])
        if nx.is_directed_acyclic_graph(quotient):
            return [sorted(blocks[chosen[j]]) for j in nx.topological_sort(quotient)]
        for component in nx.strongly_connected_components(quotient):
            if len(component) > 1:  # blocks that no order can run one after another: not all of them
                cycle = [chosen[j] for j, _ in nx.find_cycle(quotient.subgraph(component))]
                model += mip.xsum(pick[b] for b in cycle) <= len(cycle) - 1
    return None


def _quotient(data, blocks: list[tuple[int, ...]]) -> nx.DiGraph:
    """The graph of ``blocks`` (an edge where a tensor goes from one to another)."""
    where = {v: j for j, block in enumerate(blocks) for v in block}
    quotient = nx.DiGraph()
    quotient.add_nodes_from(range(len(blocks)))
    quotient.add_edges_from((where[u], where[w]) for u, w in data.edges if where[u] != where[w])
    return quotient


def _sliced(problem: Problem, plan: Plan, blocks: list[list[str]], stages: int) -> Plan:
    """The blocks' order (each block's kernels in the graph's topological order, as ``_partition``
    gives them) cut exactly on the plan's stage devices and any spare ones (the blocks themselves
    priced each kernel on its cheapest device)."""
    order = [k for block in blocks for k in block]
    spare = [d for d in candidate_devices(problem) if d not in plan.stage_devices]
    devices = (list(plan.stage_devices) + spare)[:stages]
    _, cuts = slice_order(problem, order, devices)
    return pipeline_plan(problem, order, devices, cuts)
