"""The stage-cover bound on a pipeline's period (docs/solvers.md#mtpp).

A pipeline of at most K stages whose period is at most P splits the kernels into at most K convex
blocks that each cost at most P (priced at their cheapest: every transfer in and out, the work,
the model inputs read). Where even a *fractional* cover needs more than K such blocks, every plan's
period exceeds P. Unlike the superblock MIPs, which lump several stages into one block and so drop
the transfers between them, each block here pays its own: on communication-heavy graphs
(randwire_ws:nodes=64 at 16 stages) the bound rises from 0.68 to 0.76 of the best plan.

The cover LP is solved by column generation. Intervals of seeded random topological orders (every
interval of a topological order is convex) price most columns at numpy speed; a MIP over all
convex blocks prices the rest and certifies the count: for any duals y, Farley's bound
sum(y) / max{y(S) : S convex, cost(S) <= P} is at most the LP's optimum, and the MIP's proven bound
on that maximum keeps it valid when the MIP stops early. Each MIP cuts off the blocks worth too
little to matter (infeasible: refuted) and prices smoothed duals (Wentges: halfway to those of the
best ratio so far), which the degenerate LP needs. Before each MIP a local search looks for a
block worth a little more than 1 at the LP's duals: the MIPs are left the blocks it cannot find and
the proofs. The period is searched first over the interval LP alone (cheap, proving nothing, but
nothing above where it fits is refutable), from the best split of an order into K intervals down;
then, with MIP pricing, upwards from the floor, each trial where the known columns need a set
multiple of K blocks; the largest refuted P is the bound.
"""

from __future__ import annotations

import heapq
import logging
import math
import time

import mip
import numpy as np

from ..tolerances import SOLVER_SLACK
from ..toolkit.deadline import Deadline
from ..toolkit.mip_backend import new_model
from ..toolkit.pipeline_model import BlockPricing, MipBuilder, PipelineData, optimize, time_unit
from ..units import format_bytes

log = logging.getLogger(__name__)
ORDERS = 32  # random topological orders whose intervals price columns before any MIP does
AROUND = 2  # orders built around each block a MIP prices in, per end
PRICING_ROUNDS = 8  # MIP pricings per tested period before it counts as not refuted
PRICINGS = 24  # MIP pricings per bound, at most: the same work, hence the same bound, on every run
# Branch-and-bound nodes per pricing MIP where the bound must repeat run to run (at 50 its ceiling
# stayed 25% loose). Elsewhere the clock alone stops a pricing: on randwire_ws:nodes=64 at K = 16 the
# one that refuted 81.4 us proved its block the best after 22 s, past these nodes (cover alone for
# 60 s: 73.8 us with the cap, 81.4 without; six other graphs the same either way).
PRICING_NODES = 400
FIRST_RATIO = 1.45  # the first period tried is where the known columns need this many times K blocks
RATIO_STEP = 0.6  # after a refutation, the next where they need 1 + RATIO_STEP x (the last ratio - 1)
TRIAL_PRECISION = 0.01  # a trial's period need not be found more finely than this
LEAST_STEP = 0.125  # of the periods left, each trial moves up at least this share
# Each trial may take at most this share of the time left: a trial not refuted in it gives way to one
# halfway down (randwire_ws:nodes=64 at K = 32: 45.0 us was not refuted in the 42 s it took, 42.8 us
# then was in 9 s)
TRIAL_SHARE = 0.5
PRECISION = 0.002  # the bisection stops within this fraction of the period
MAX_COLUMN_ROUNDS = 500  # interval pricing rounds per LP (each adds at most one column per order)
SMOOTHING = 0.5  # the weight of the best duals so far where a pricing MIP's duals are smoothed
FLOOR_MARGIN = 0.04  # pricing MIPs cut off blocks worth less than this share below the target
NEIGHBOURS = 64  # improving neighbours of each priced block added with it, at most
# Before each pricing MIP a local search looks for a block worth SEARCH_WORTH at the LP's duals; one
# it finds goes in as a column without the MIP, which is left the blocks it cannot find and the proofs
# (on randwire_ws:nodes=12 at 8 stages and 0.99 of the optimum: 6 MIPs instead of 12, 8.6 s instead
# of 15.1). At most LOCAL_SEARCHES climbs per search (about 1 ms each on 226 kernels), each restart
# from the best block so far after one to KICK_MOVES random moves. Where the MIP then stops with no
# block and no proof, the search's best block goes in if it prices in, and the trial goes on.
LOCAL_SEARCHES = 600
KICK_MOVES = 5
SEARCH_WORTH = 1.05
# Each order's interval prices are an (n + 1)^2 array, and pricing adds 2 x AROUND orders per MIP:
# the cover runs where all of them fit in this (1,448 kernels; 10,000 would take 100 GB).
COVER_BYTES = 2 * 2**30


def interval_costs(data: PipelineData, pricing: BlockPricing, order: np.ndarray) -> np.ndarray:
    """cost[a, b] of the block order[a:b] for every 0 <= a < b <= n (inf elsewhere), ``order`` a
    topological order of kernel ids: a tensor leaves the block where its producer is in it and its
    last consumer after it, and enters where its producer is before it and a consumer in it."""
    n = data.n
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    rows = np.zeros((n + 1, n + 2))  # per block start a, increments over the block end b

    def enters_by_first(consumers: np.ndarray, after: int, price: float) -> None:
        """price for blocks starting past ``after`` that reach the first consumer at or past their start."""
        starts = np.arange(after + 1, consumers[-1] + 1)
        first = consumers[np.searchsorted(consumers, starts)]
        np.add.at(rows, (starts, first + 1), price)

    for layer, (u, members) in enumerate(zip(data.producers, data.consumers)):
        at, consumers = position[u], np.sort(position[members])
        if pricing.out_price[layer] > 0:  # a <= at < b <= last consumer
            rows[: at + 1, at + 1] += pricing.out_price[layer]
            rows[: at + 1, consumers[-1] + 1] -= pricing.out_price[layer]
        if pricing.in_price[layer] > 0:
            enters_by_first(consumers, at, pricing.in_price[layer])
    for members, price in zip(data.input_consumers, pricing.input_price):
        if price > 0:
            enters_by_first(np.sort(position[members]), -1, price)
    work = np.concatenate([[0.0], np.cumsum(pricing.work[order])])
    cost = np.cumsum(rows, axis=1)[:, : n + 1] + (work[None, :] - work[:, None])
    cost[np.tril_indices(n + 1)] = np.inf
    return cost


def random_topological_orders(
    data: PipelineData, count: int, seed: int, rank: np.ndarray | None = None
) -> list[np.ndarray]:
    """``count`` topological orders of the kernel ids, each by its own seeded random priorities;
    ``rank``, if given, goes first (a ready kernel of lower rank is always taken first)."""
    rng = np.random.default_rng(seed)
    successors: list[list[int]] = [[] for _ in range(data.n)]
    waiting = np.zeros(data.n, dtype=np.int64)
    for u, v in sorted(set(data.edges)):
        successors[u].append(v)
        waiting[v] += 1
    orders = []
    for _ in range(count):
        priority, left = rng.random(data.n) + (0 if rank is None else rank), waiting.copy()
        ready = [(priority[v], v) for v in range(data.n) if not left[v]]
        heapq.heapify(ready)
        order = []
        while ready:
            _, v = heapq.heappop(ready)
            order.append(v)
            for w in successors[v]:
                left[w] -= 1
                if not left[w]:
                    heapq.heappush(ready, (priority[w], w))
        orders.append(np.array(order, dtype=np.int64))
    return orders


class StageCover:
    """The cover LP of one pipeline problem (``data`` priced by ``pricing``, at most ``stages``
    blocks), with the columns found so far kept across the periods tried."""

    def __init__(
        self,
        data: PipelineData,
        pricing: BlockPricing,
        stages: int,
        *,
        seed: int = 0,
        backend: str = "highs",
    ):
        self.data, self.pricing, self.stages = data, pricing, stages
        self.backend, self.seed = backend, seed
        self.orders = random_topological_orders(data, ORDERS, seed)
        self.costs = [interval_costs(data, pricing, order) for order in self.orders]
        self.columns: dict[tuple[int, ...], float] = {}  # block -> its cost
        self.stopped_by_time = False
        self.pricings = 0  # MIP pricings run
        self.searched = 0  # blocks found by local search instead
        self.most_pricings = PRICINGS  # past this many MIP pricings, nothing more is refuted
        self.pricing_nodes: int | None = None  # per pricing MIP; None: the deadline alone stops it
        self.block_costs = BlockCosts(data, pricing)
        self.neighbourhood = _Neighbourhood(data, self.block_costs)

    def needed(self, period_s: float, deadline: Deadline) -> float | None:
        """The blocks of cost at most ``period_s`` the cover LP needs over the columns known and the
        orders' intervals: at least what it needs over all convex blocks, so where it is at most
        ``stages`` nothing is refuted (None where the LP fails or the deadline passes)."""
        duals = self._interval_rounds(*self._cover_lp(period_s), deadline)
        return None if duals is None else float(duals.sum())

    def refutes(self, period_s: float, deadline: Deadline, rounds: int = PRICING_ROUNDS) -> bool:
        """Whether no pipeline of at most ``stages`` blocks has every block's cost at most
        ``period_s``: proven where Farley's bound on the cover LP exceeds the stage count after at
        most ``rounds`` pricing MIPs. The blocks priced are kept in ``columns``."""
        data = self.data
        model, cover, fits, add = self._cover_lp(period_s)
        pricer, duals, centre, centre_ratio, mip_rounds = None, None, None, 0.0, 0
        while mip_rounds < rounds:
            if self.pricings >= self.most_pricings:
                return False
            if duals is None:
                duals = self._interval_rounds(model, cover, fits, add, deadline)
                if duals is None or duals.sum() <= self.stages:  # the LP fits over some columns: so it does over all
                    return False
            found, searched = self._searched_block(duals, SEARCH_WORTH, fits, period_s)
            if found >= SEARCH_WORTH and not deadline.passed():
                self.searched += 1
                self._add_column(searched, duals, period_s, add)
                duals = None
                continue
            # Wentges smoothing: price between the LP's duals and those that gave the best ratio so far
            priced = duals if centre is None else SMOOTHING * centre + (1 - SMOOTHING) * duals
            pricer = pricer or _BlockPricer(data, self.pricing, period_s, self.backend)
            self.pricings += 1
            mip_rounds += 1
            # a block worth this much refutes nothing, and prices in (the LP needs more than K blocks)
            target = priced.sum() / self.stages
            began = time.perf_counter()
            block, best, ceiling = pricer.best_block(priced, target, deadline, self.seed, self.pricing_nodes)
            ratio = priced.sum() / ceiling if ceiling is not None and ceiling > 0 else 0.0
            log.debug(
                "stage cover at %.6g s: LP %.4f, priced %.4f, block %.4f, ceiling %s, ratio %.4f (%.2f s)",
                period_s,
                duals.sum(),
                priced.sum(),
                best,
                ceiling,
                ratio,
                time.perf_counter() - began,
            )
            if ratio > self.stages * (1 + SOLVER_SLACK):
                return True
            moved = ratio > centre_ratio
            if moved:
                centre, centre_ratio = priced, ratio
            if block is None:  # the MIP found none in its nodes or time: the search's best may still price in
                if searched is None or found <= 1 + 1e-6:
                    return False
                block = searched
            if duals[list(block)].sum() <= 1 + 1e-6:  # nothing the LP lacks: price again nearer the LP's duals
                if not moved:
                    centre = None
                continue
            self._add_column(block, duals, period_s, add)
            for order in self._orders_around(block):
                self.orders.append(order)
                self.costs.append(interval_costs(data, self.pricing, order))
                fits.append(self.costs[-1] <= period_s)
            duals = None
        return False

    def _add_column(self, block: tuple[int, ...], duals: np.ndarray, period_s: float, add) -> None:
        """Put ``block`` and its improving neighbours into the LP and the known columns."""
        self.columns[block] = self.block_cost(block)
        add(block)
        for neighbour in self.neighbourhood.improving(block, duals, period_s, NEIGHBOURS):
            self.columns[neighbour] = self.block_cost(neighbour)
            add(neighbour)

    def _searched_block(
        self, duals: np.ndarray, target: float, fits, period_s: float
    ) -> tuple[float, tuple[int, ...] | None]:
        """The best block under ``duals`` a local search from the orders' best intervals finds, until
        one is worth ``target``: (its value, the block)."""
        starts = sorted(
            (
                (value, order[a:b])
                for order, fit in zip(self.orders, fits)
                for value, a, b in [best_interval(order, fit, duals)]
            ),
            key=lambda start: -start[0],
        )[:ORDERS]
        rng = np.random.default_rng(self.seed + self.pricings + self.searched)
        return self.neighbourhood.search([tuple(sorted(b.tolist())) for _, b in starts], duals, period_s, target, rng)

    def interval_period(self) -> float:
        """The least period at which one of the orders splits into at most ``stages`` intervals: such
        a cover exists there, so no period above it is refuted (the bisection's top, from the problem
        alone; the whole graph as one block took the interval LP 14 of 20 s on 226 kernels)."""
        best = math.inf
        for costs in self.costs:
            least = costs[0]  # least[b]: the least largest cost of order[:b] in the intervals so far
            for _ in range(self.stages - 1):
                least = np.minimum(least, np.min(np.maximum(least[:, None], costs), axis=0))
            best = min(best, float(least[-1]))
        return best

    def _cover_lp(self, period_s: float):
        """The cover LP at ``period_s`` over the known columns that fit: (model, its cover rows, which
        intervals of each order fit, a function adding a block's column unless already in)."""
        model = new_model("stage cover", self.backend)
        cover = [model.add_constr(mip.LinExpr() == 1) for _ in range(self.data.n)]
        for v in range(self.data.n):  # artificial singletons keep the LP feasible; they count for no plan
            model.add_var(lb=0.0, obj=float(self.data.n), column=mip.Column([cover[v]], [1.0]))
        in_model: set[tuple[int, ...]] = set()

        def add(block: tuple[int, ...]) -> bool:
            if block in in_model:
                return False
            in_model.add(block)
            model.add_var(lb=0.0, obj=1.0, column=mip.Column([cover[v] for v in block], [1.0] * len(block)))
            return True

        for block, cost in self.columns.items():
            if cost <= period_s:
                add(block)
        return model, cover, [cost <= period_s for cost in self.costs], add

    def period_needing(
        self, blocks: float, low: float, high: float, deadline: Deadline, precision: float = PRECISION
    ) -> float:
        """Bisection, to ``precision`` of the period, for the largest period in (``low``, ``high``)
        where the LP over the known columns needs more than ``blocks`` blocks (``low`` where it needs
        fewer everywhere or time runs out)."""
        while high - low > precision * high and not deadline.passed():
            middle = (low + high) / 2
            needed = self.needed(middle, deadline)
            if needed is None:
                break
            low, high = (middle, high) if needed > blocks else (low, middle)
        return low

    def _orders_around(self, block: tuple[int, ...]) -> list[np.ndarray]:
        """Orders in which ``block`` is one interval, once right after its ancestors and once right
        before its descendants: their intervals price the blocks that differ from it at either end."""
        inside = np.zeros(self.data.n, dtype=bool)
        inside[list(block)] = True
        before = self.neighbourhood.before(inside) & ~inside
        after = self.neighbourhood.after(inside) & ~inside
        seed = self.seed + len(self.orders)
        return [
            *random_topological_orders(self.data, AROUND, seed, np.where(before, 0, np.where(inside, 1, 2))),
            *random_topological_orders(self.data, AROUND, seed + 1, np.where(after, 2, np.where(inside, 1, 0))),
        ]

    def _interval_rounds(self, model, cover, fits, add, deadline: Deadline) -> np.ndarray | None:
        """Solve the LP, adding the best interval block of each order while one prices in; the final
        duals (None where the LP fails or the deadline passes)."""
        for _ in range(MAX_COLUMN_ROUNDS):
            # every column is continuous: relax=True would only read and reset each column's type (on
            # 226 kernels, 6 s of every 60 the cover ran)
            if model.optimize() != mip.OptimizationStatus.OPTIMAL:
                return None
            duals = np.array([row.pi for row in cover])
            added = False
            for order, fit, costs in zip(self.orders, fits, self.costs):
                value, a, b = best_interval(order, fit, duals)
                if value > 1 + 1e-6:
                    block = tuple(sorted(order[a:b].tolist()))
                    if add(block):
                        self.columns[block] = float(costs[a, b])
                        added = True
            if not added:
                return duals
            if deadline.passed():
                self.stopped_by_time = True
                return None
        return duals

    def block_cost(self, block: tuple[int, ...]) -> float:
        """A block's cost under the pricing (the reference the interval costs agree with)."""
        inside = np.zeros(self.data.n, dtype=bool)
        inside[list(block)] = True
        return self.block_costs.cost(inside)


class BlockCosts:
    """What any block costs under ``pricing``, its tensor layers held as flat arrays so that one
    block is priced in one numpy pass (the cover prices thousands)."""

    def __init__(self, data: PipelineData, pricing: BlockPricing):
        self.pricing = pricing
        self.counts = np.array([len(c) for c in data.consumers], dtype=np.int64)
        self.members = np.array([v for c in data.consumers for v in c], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        self.producers = np.asarray(data.producers, dtype=np.int64)
        self.inputs = [np.asarray(m, dtype=np.int64) for m in data.input_consumers]

    def cost(self, inside: np.ndarray) -> float:
        """The cost of the block ``inside`` (a mask over kernel ids): its work, each layer that leaves
        it (producer inside, a consumer outside) or enters it (the reverse), each model input read."""
        cost = float(self.pricing.work[inside].sum())
        if len(self.producers):  # every layer has a consumer
            held = np.add.reduceat(inside[self.members].astype(np.int64), self.starts)
            producer_in = inside[self.producers]
            cost += float(self.pricing.out_price[producer_in & (held < self.counts)].sum())
            cost += float(self.pricing.in_price[~producer_in & (held > 0)].sum())
        for members, price in zip(self.inputs, self.pricing.input_price):
            cost += price * bool(inside[members].any())
        return cost


class _Neighbourhood:
    """Convex blocks one kernel away from a given one, each priced in one numpy pass. A MIP prices one
    block per call, and on degenerate duals the LP takes block after block without moving; the
    improving neighbours of the MIP's block, and of the best of those in turn, add many at once."""

    def __init__(self, data: PipelineData, costs: BlockCosts):
        self.data, self.costs = data, costs
        self.successors: list[list[int]] = [[] for _ in range(data.n)]
        self.predecessors: list[list[int]] = [[] for _ in range(data.n)]
        for u, w in set(data.edges):
            self.successors[u].append(w)
            self.predecessors[w].append(u)
        # descendants[v]: v and every kernel a path from v reaches (ids follow a topological order); a
        # search's moves ask it for every block they try
        self.descendants = np.eye(data.n, dtype=bool)
        for v in reversed(range(data.n)):
            for w in self.successors[v]:
                self.descendants[v] |= self.descendants[w]

    def after(self, inside: np.ndarray) -> np.ndarray:
        """The kernels the mask ``inside`` reaches by paths, itself included."""
        return self.descendants[inside].any(axis=0)

    def before(self, inside: np.ndarray) -> np.ndarray:
        """The kernels from which a path reaches the mask ``inside``, itself included."""
        return self.descendants[:, inside].any(axis=1)

    def improving(self, block: tuple[int, ...], duals: np.ndarray, period_s: float, most: int) -> list[tuple[int, ...]]:
        """Up to ``most`` blocks worth more than 1 under ``duals`` and costing at most ``period_s``:
        the neighbours of ``block`` (one kernel added or removed, still convex), then of the best of
        them, while the best gains."""
        inside = np.zeros(self.data.n, dtype=bool)
        inside[list(block)] = True
        value, found, seen = float(duals[inside].sum()), [], {block}
        while len(found) < most:
            best = None
            for v, add in self._moves(inside):
                inside[v] = add
                candidate = tuple(np.flatnonzero(inside).tolist())
                worth = float(duals[inside].sum())
                if candidate not in seen and worth > 1 + 1e-6 and self.costs.cost(inside) <= period_s:
                    seen.add(candidate)
                    found.append(candidate)
                    if best is None or worth > best[0]:
                        best = (worth, v, add)
                inside[v] = not add
            if best is None or best[0] <= value + 1e-9:
                break
            value, v, add = best
            inside[v] = add
        return found[:most]

    def search(
        self, starts: list[tuple[int, ...]], duals: np.ndarray, period_s: float, target: float, rng: np.random.Generator
    ) -> tuple[float, tuple[int, ...] | None]:
        """The best block found within ``period_s`` under ``duals`` (value, block): each start climbed,
        then the best so far kicked by a few random moves and climbed again, ``LOCAL_SEARCHES`` in all
        or until a block is worth ``target``."""
        best: tuple[float, tuple[int, ...] | None] = (-math.inf, None)
        current = best
        for searches in range(LOCAL_SEARCHES):
            if searches < len(starts):
                start = starts[searches]
            elif current[1] is not None:
                start = self._kicked(current[1], period_s, rng)
            else:
                break
            found = self._climbed(start, duals, period_s)
            if found[0] >= current[0] - 1e-9:
                current = found
            if found[0] > best[0]:
                best = found
            if best[0] >= target:
                break
        return best

    def _climbed(self, block: tuple[int, ...], duals: np.ndarray, period_s: float) -> tuple[float, tuple[int, ...]]:
        """``block`` moved (a kernel added or removed, else one swapped for another) while a move
        within ``period_s`` gains under ``duals``: (its value, the block)."""
        inside = np.zeros(self.data.n, dtype=bool)
        inside[list(block)] = True
        value = float(duals[inside].sum())
        while True:
            moves = list(self._moves(inside))
            best = self._best_move(inside, duals, period_s, value, moves)
            for v, add in moves if best is None else ():
                if not add:  # swap v out for a kernel that the block without v may take
                    inside[v] = False
                    swap = self._best_move(inside, duals, period_s, value, list(self._moves(inside)), (v, False))
                    inside[v] = True
                    if swap is not None and (best is None or swap[0] > best[0]):
                        best = swap
            if best is None:
                return value, tuple(np.flatnonzero(inside).tolist())
            value = best[0]
            for v, add in best[1]:
                inside[v] = add

    def _best_move(self, inside, duals, period_s, value, moves, made=None) -> tuple[float, list] | None:
        """The move of ``moves`` that gains most over ``value`` under ``duals`` and keeps the block
        within ``period_s`` (after ``made``, a move already made on ``inside``, not to be undone):
        (the value after it, the moves to make)."""
        best = None
        for v, add in moves:
            if made is not None and v == made[0]:
                continue
            inside[v] = add
            worth = float(duals[inside].sum())
            if worth > value + 1e-9 and (best is None or worth > best[0]) and self.costs.cost(inside) <= period_s:
                best = (worth, ([made] if made else []) + [(v, add)])
            inside[v] = not add
        return best

    def _kicked(self, block: tuple[int, ...], period_s: float, rng: np.random.Generator) -> tuple[int, ...]:
        """``block`` after one to ``KICK_MOVES`` random moves that keep it convex, non-empty and within ``period_s``."""
        inside = np.zeros(self.data.n, dtype=bool)
        inside[list(block)] = True
        for _ in range(int(rng.integers(1, KICK_MOVES + 1))):
            moves = list(self._moves(inside))
            for i in rng.permutation(len(moves)):
                v, add = moves[i]
                inside[v] = add
                if inside.any() and self.costs.cost(inside) <= period_s:
                    break
                inside[v] = not add
        return tuple(np.flatnonzero(inside).tolist())

    def _moves(self, inside: np.ndarray):
        """(kernel, True) for each neighbour whose addition keeps the block convex, (kernel, False) for
        each member whose removal does. The block is convex: a path between two members stays inside."""
        after, before = self.after(inside), self.before(inside)
        members = np.flatnonzero(inside).tolist()
        for v in members if len(members) > 1 else ():
            if not any(inside[p] for p in self.predecessors[v]) or not any(inside[q] for q in self.successors[v]):
                yield v, False
        frontier = {w for v in members for w in self.successors[v] + self.predecessors[v]}
        for v in sorted(frontier - set(members)):
            # a path from the block into v, or from v into the block, through an outsider breaks convexity
            if all(inside[p] or not after[p] for p in self.predecessors[v]) and all(
                inside[q] or not before[q] for q in self.successors[v]
            ):
                yield v, True


def best_interval(order: np.ndarray, fit: np.ndarray, duals: np.ndarray) -> tuple[float, int, int]:
    """(value, a, b): the interval order[a:b] of greatest value under ``duals`` among those that fit."""
    prefix = np.concatenate([[0.0], np.cumsum(duals[order])])
    value = np.where(fit, prefix[None, :] - prefix[:, None], -np.inf)
    a, b = np.unravel_index(int(np.argmax(value)), value.shape)
    return float(value[a, b]), int(a), int(b)


class _BlockPricer:
    """max y(S) over convex blocks S of cost at most P: three ordered blocks (before, S, after)."""

    def __init__(self, data: PipelineData, pricing: BlockPricing, period_s: float, backend: str):
        self.builder = MipBuilder("stage cover pricing", backend, time_unit(pricing))
        model = self.builder.m
        x = [[model.add_var(var_type=mip.BINARY) for _ in range(data.n)] for _ in range(3)]
        for v in range(data.n):
            model += x[0][v] + x[1][v] + x[2][v] == 1
        self.builder.ordered(x, data)
        model += self.builder.block_cost(x[1], data, pricing) <= period_s / self.builder.unit
        self.inside = x[1]
        self.floor: mip.Constr | None = None

    def best_block(
        self, duals: np.ndarray, target: float, deadline: Deadline, seed: int, max_nodes: int | None
    ) -> tuple[tuple[int, ...] | None, float, float | None]:
        """The best block under ``duals``, or with HiGHS the first found worth at least ``target``:
        (the block or None, its value, the proven ceiling on any block's value; None where the MIP
        proved none). Past the target a block refutes nothing, so proving it the best is wasted;
        below ``target`` x (1 - FLOOR_MARGIN) it refutes the period whatever it is worth, so such
        blocks are cut off: where every block is, infeasibility is the proof (at the target itself,
        that proof did not finish where the best block lay 0.0006 below)."""
        model = self.builder.m
        value = mip.xsum(float(y) * x for y, x in zip(duals, self.inside) if y)
        model.objective = mip.minimize(-value)  # its proven lower bound caps y(S) from above
        if self.floor is not None:
            model.remove(self.floor)
        floor = target * (1 - FLOOR_MARGIN)
        self.floor = model.add_constr(value >= floor)
        if model.solver_name.upper() == "HIGHS":  # HiGHS's own option; python-mip has no name for it
            model.solver._set_double_option_value("objective_target", -target)
        status = optimize(self.builder, deadline, seed, max_nodes)
        if status == mip.OptimizationStatus.INFEASIBLE:
            return None, 0.0, floor
        bound = model.objective_bound
        if bound is None or not math.isfinite(bound):
            return None, 0.0, None
        ceiling = max(-bound + abs(bound) * SOLVER_SLACK + 1e-9, floor)
        if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
            return None, 0.0, ceiling
        block = tuple(v for v, x in enumerate(self.inside) if x.x is not None and x.x > 0.5)
        return (block or None), -model.objective_value, ceiling


def stage_cover_bound(
    data: PipelineData,
    pricing: BlockPricing,
    stages: int,
    floor_s: float,
    deadline: Deadline,
    ceiling_s: float | None = None,
    *,
    seed: int = 0,
    backend: str = "highs",
    stats: dict | None = None,
    repeatable: bool = False,
) -> float | None:
    """The largest period in (``floor_s``, ``ceiling_s``) the cover LP refutes within ``PRICINGS``
    MIP pricings (None where it refutes none before ``deadline``). ``floor_s``: a bound already known;
    ``ceiling_s``: any cost no bound can pass; the search starts below it and below the least period
    of a split of the cover's orders into intervals, not below a plan's period, so that the bound
    depends on the problem alone and not on how good a time-limited plan turned out. ``stats``, if
    given, receives whether the clock stopped an LP (``stopped_by_time``). ``repeatable``: each pricing
    MIP stops at ``PRICING_NODES`` nodes too, so that the bound is the same on every run unless the
    deadline comes first."""
    if stats is not None:
        stats["stopped_by_time"] = False
    if not data.n or not math.isfinite(floor_s) or (ceiling_s is not None and ceiling_s <= floor_s):
        return None
    needs = (ORDERS + 2 * AROUND * PRICINGS) * 8 * (data.n + 1) ** 2
    if needs > COVER_BYTES:
        log.info("stage cover: not run on %d kernels (its orders' prices would take %s)", data.n, format_bytes(needs))
        return None
    cover = StageCover(data, pricing, stages, seed=seed, backend=backend)
    cover.pricing_nodes = PRICING_NODES if repeatable else None
    # Above the least period the known columns cover with K blocks nothing is refuted: a tight
    # ceiling, found without a MIP.
    top = min(cover.interval_period(), math.inf if ceiling_s is None else ceiling_s)
    low, high = floor_s, cover.period_needing(stages, floor_s, top, deadline)
    # Trials from below, each where the known columns need `ratio` x K blocks: a MIP's first
    # ceilings sit about FIRST_RATIO above the best block, so that is where a refutation is cheap
    # (one pricing on 226 kernels where the period 1.3x below the top took more than eight).
    ratio, proven = FIRST_RATIO, None
    trial = max(
        cover.period_needing(ratio * stages, low, high, deadline, TRIAL_PRECISION), low + (high - low) * LEAST_STEP
    )
    while high - low > PRECISION * high and cover.pricings < cover.most_pricings and not deadline.passed():
        if cover.refutes(trial, deadline.within(deadline.left() * TRIAL_SHARE)):
            low = proven = trial
            ratio = 1 + (ratio - 1) * RATIO_STEP
            trial = max(
                cover.period_needing(ratio * stages, low, high, deadline, TRIAL_PRECISION),
                low + (high - low) * LEAST_STEP,
            )
        else:
            high = trial
            trial = (low + high) / 2
    if stats is not None:
        stats["stopped_by_time"] = cover.stopped_by_time or deadline.passed()
    if proven is not None:
        log.info("stage cover: no pipeline of %d stages has a period of %.6g s or less", stages, proven)
    return None if proven is None else float(proven * (1 - SOLVER_SLACK))
