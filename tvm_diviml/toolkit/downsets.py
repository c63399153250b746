"""The DP over downsets (ideals) that the ``downsets`` solver and the pipeline bounds share: max load
on ``host_staged`` platforms (Tarnawski et al., NeurIPS 2020, "Efficient Algorithms for Device
Placement of DNN Graph Operators") and the period of a ``stage_serial`` pipeline (MTPP, Archer et
al., ICML 2024), over the whole graph or a window of a pipeline's stages.

Each device takes a contiguous set of kernels and the sets are ordered, so a plan is a chain of
downsets; a DP over downsets and counts of identical devices used minimises the largest load,
pricing each pair of downsets in O(frontier width) with numpy. Co-location groups, memory and
allowed devices restrict which sets are feasible. A bound on the answer prunes the pairs and is
raised until the DP proves nothing skipped helps. For pipelines the DP prices no set above what any
plan pays for it, so its value is a certified lower bound as well as (when the simulator agrees) the
optimum.

The recurrence, the pricing and the pruning: docs/solvers.md#downsets.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..errors import DivimlInputError
from ..plan import Plan
from ..problem import Problem
from ..simulator import simulate
from ..tolerances import within_slack
from .deadline import Deadline
from .device_classes import identical_devices
from .pipeline_model import candidate_devices, link_prices, stage_work

log = logging.getLogger(__name__)
_PROGRESS_EVERY_S = 10.0
MAX_DP_CELLS = 20_000_000  # ideals x device-count states: the DP's tables take 17 bytes a cell
# The ideals' arrays (each ideal's members, and how many readers of each tensor it holds) take about
# 2n + 6 (tensors + inputs) bytes an ideal: 150,000 ideals of llama:layers=588 (10,000 kernels) would
# take 13 GB. No more ideals are enumerated than fit in this.
IDEAL_BYTES = 2 * 2**30
# (ideal, sub-ideal) pairs the DP prices a second, taken low so that a pass begun ends in time on a
# busy machine: 7.8e6 measured here quiet at K = 8 with two device classes, 3.5e6 busy at K = 2
PAIRS_PER_S = 3e6
SAMPLE_EVERY = 64  # ideals: the pair count of a pass is estimated from every 64th
NO_DEADLINE = Deadline.never()  # the default: the DP runs to its end


class TooManyIdeals(Exception):
    """The DAG has more (group-closed) ideals than the cap."""


class DpStopped(TimeoutError):
    """The DP stopped for the clock. ``plan``: the split of a pass that ended without proof (its bound
    too low), as a plan, where one did (``downset_plan`` sets it); else None."""

    def __init__(self, message: str, partition: Partition | None = None):
        super().__init__(message)
        self.partition = partition
        self.plan: Plan | None = None


# ---------------------------------------------------------------------- the ideals
@dataclass
class Ideals:
    """The group-closed ideals of a DAG, each after all of its sub-ideals (the empty ideal first, all
    kernels last).

    Kernels are numbered 0..n-1 in ``graph.topo_order``. Tensors (the columns of the per-tensor
    arrays) are numbered 0..L-1 as the caller's ``tensors`` (a producer and its consumers; one per
    kernel, or one per price layer); model inputs are virtual tensors L..L+g-1 that every ideal holds
    (they come from the host); index L+g is a padding column that nothing reads.
    """

    members: np.ndarray  # (N, n) bool
    packed: np.ndarray  # (N, words) the members as bits: J ⊆ I iff no bit of J lies outside I
    consumers_inside: np.ndarray  # (N, L+g+1) D[J, t] per tensor t
    frontier: np.ndarray  # (N, width) tensors held in J (or inputs) with a consumer outside J, padded
    frontier_inside: np.ndarray  # (N, width) D[J, t] of those tensors
    degree: np.ndarray  # (L+g+1,) each tensor's consumers, those no ideal holds (index n) among them

    def __len__(self) -> int:
        return len(self.members)

    def take(self, order: np.ndarray) -> Ideals:
        return Ideals(
            self.members[order],
            self.packed[order],
            self.consumers_inside[order],
            self.frontier[order],
            self.frontier_inside[order],
            self.degree,
        )


def enumerate_ideals(
    predecessors: list[list[int]], successors: list[list[int]], groups: list[list[int]], max_ideals: int
) -> list[int]:
    """Every ideal (as a bitmask over kernel ids) that holds each group whole or not at all.

    Breadth-first from the empty ideal: add one kernel whose predecessors are all in, then close
    under predecessors and groups. Every such closed ideal K ⊋ I is reached: its smallest new kernel's
    closure lies inside K. Raises TooManyIdeals past ``max_ideals``, at once where (no groups) one
    level of the graph already has more subsets: 10 s saved on 10,000 kernels.
    """
    n = len(predecessors)
    widest = 0 if groups else widest_level(predecessors)
    if widest >= max_ideals.bit_length():  # 2 ** widest > max_ideals
        raise TooManyIdeals(f"more than {max_ideals} ideals ({widest} kernels with no path between any two)")
    ancestors = [0] * n
    for v in range(n):  # ids follow a topological order
        mask = 1 << v
        for p in predecessors[v]:
            mask |= ancestors[p]
        ancestors[v] = mask
    closure_of = list(ancestors)  # the smallest group-closed ideal holding v
    group_mask = {}
    for members in groups:
        mask = sum(1 << m for m in members)
        for m in members:
            group_mask[m] = mask
    grouped = sum(1 << m for m in group_mask)  # only a grouped kernel's closure grows past its ancestors
    for v in range(n) if groups else ():
        grown, done = ancestors[v], 0
        while grown != done:
            fresh, done = grown & ~done, grown
            for u in _bits(fresh & grouped):
                for m in _bits(group_mask[u]):
                    grown |= ancestors[m]
        closure_of[v] = grown
    pred_mask = [sum(1 << p for p in set(predecessors[v])) for v in range(n)]

    seen = {0: 0}
    found = [0]
    queue = [(0, frozenset(v for v in range(n) if not predecessors[v]))]
    head = 0
    while head < len(queue):
        ideal, ready = queue[head]
        head += 1
        for v in ready:
            bigger = ideal | closure_of[v]  # a union of group-closed ideals is one
            if bigger in seen:
                continue
            if len(found) >= max_ideals:
                raise TooManyIdeals(f"more than {max_ideals} ideals")
            seen[bigger] = len(found)
            found.append(bigger)
            added = bigger & ~ideal
            nxt = set(ready)
            for u in _bits(added):
                nxt.discard(u)
                for w in successors[u]:
                    if not (bigger >> w) & 1 and not pred_mask[w] & ~bigger:
                        nxt.add(w)
            queue.append((bigger, frozenset(nxt)))
    return found


def widest_level(predecessors: list[list[int]]) -> int:
    """The most kernels at one depth (longest path from a source; ids in topological order): no
    path joins two of them, so each subset's down-closure is another ideal."""
    depth = [0] * len(predecessors)
    for v, preds in enumerate(predecessors):
        depth[v] = 1 + max((depth[p] for p in preds), default=-1)
    return int(np.bincount(depth).max()) if depth else 0


def _bits(mask: int):
    """The set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def build_ideals(
    predecessors: list[list[int]],
    successors: list[list[int]],
    groups: list[list[int]],
    tensors: list[tuple[int, list[int]]],
    input_consumers: list[list[int]],
    max_ideals: int,
    family: list[int] | None = None,
    deadline: Deadline = NO_DEADLINE,
) -> Ideals:
    """Enumerate the group-closed ideals and the arrays the DP reads; ``tensors``: (producer, consumers),
    where a consumer n (one past the kernels) is one that no ideal holds: the tensor always leaves.
    ``family``: ideals (bitmasks) to take instead of every one; those that split a group are dropped,
    the empty and the full ideal added (the DP then finds the best chain within the family).
    TimeoutError past ``deadline``: a family of 10,000 ideals of 10,000 kernels takes 7-9 s here."""
    n, g, L = len(predecessors), len(input_consumers), len(tensors)
    fitting = IDEAL_BYTES // (2 * n + 6 * (L + g + 1))
    if fitting < max_ideals:
        try:
            return build_ideals(predecessors, successors, groups, tensors, input_consumers, fitting, family, deadline)
        except TooManyIdeals as many:
            raise TooManyIdeals(
                f"{many}: the most whose arrays fit in {IDEAL_BYTES / 2**30:g} GiB ({n} kernels)"
            ) from None
    if family is None:
        masks = enumerate_ideals(predecessors, successors, groups, max_ideals)
    else:
        group_masks = [sum(1 << m for m in members) for members in groups]
        whole = {mask for mask in family if all(mask & gm in (0, gm) for gm in group_masks)}
        masks = sorted(whole | {0, (1 << n) - 1}, key=int.bit_count)
        if len(masks) > max_ideals:
            raise TooManyIdeals(f"a family of more than {max_ideals} ideals")
    width_bytes = (n + 7) // 8
    packed = np.frombuffer(b"".join(m.to_bytes(width_bytes, "little") for m in masks), dtype=np.uint8)
    members = np.unpackbits(packed.reshape(len(masks), width_bytes), axis=1, count=n, bitorder="little").astype(bool)
    order = np.argsort(members.sum(axis=1), kind="stable")  # sub-ideals first
    members = members[order]
    words = np.zeros((len(members), -(-n // 64) * 8), dtype=np.uint8)
    words[:, :width_bytes] = packed.reshape(len(masks), width_bytes)[order]
    packed_words = words.view(np.uint64)
    # D[J, t] for tensors and inputs (padding column last, always 0)
    reads = [(t, w) for t, (_, consumers) in enumerate(tensors) for w in set(consumers)]
    reads += [(L + i, w) for i, consumers in enumerate(input_consumers) for w in set(consumers)]
    source = np.array([t for t, _ in reads], dtype=np.int64)
    reader = np.array([w for _, w in reads], dtype=np.int64)
    consumers_inside = np.zeros((len(members), L + g + 1), dtype=np.int32)
    readable = np.concatenate([members, np.zeros((len(members), 1), dtype=bool)], axis=1)
    for column in np.unique(source):
        if deadline.passed():
            raise TimeoutError("the deadline passed while the ideals' arrays were built")
        consumers_inside[:, column] = readable[:, reader[source == column]].sum(axis=1)
    degree = np.bincount(source, minlength=L + g + 1)
    producers = np.array([u for u, _ in tensors], dtype=np.int64)
    holds = np.concatenate(
        [members[:, producers], np.ones((len(members), g), dtype=bool), np.zeros((len(members), 1), dtype=bool)],
        axis=1,
    )
    on_frontier = holds & (consumers_inside < degree[None, :])
    width = max(int(on_frontier.sum(axis=1).max(initial=0)), 1)
    frontier = np.full((len(members), width), L + g, dtype=np.int32)
    rows, cols = np.nonzero(on_frontier)
    slot = np.arange(len(rows)) - np.searchsorted(rows, rows)
    frontier[rows, slot] = cols
    frontier_inside = np.take_along_axis(consumers_inside, frontier, axis=1)
    return Ideals(members, packed_words, consumers_inside, frontier, frontier_inside, degree)


# ---------------------------------------------------------------------- device classes
@dataclass
class DeviceClass:
    """Identical devices: one price list per kernel (and per model input) for all of them."""

    devices: list[str]
    work: np.ndarray  # (n,) compute plus the always-paid return of a model output; 0 where infeasible
    infeasible: np.ndarray  # (n,) bool
    leave: np.ndarray  # (L+g+1,) extra seconds when the tensor leaves the set
    enter: np.ndarray  # (L+g+1,) seconds when the tensor enters the set
    memory_bytes: float


Tensors = list[tuple[int, list[int]]]  # (producer, consumers) by kernel id: the DP's priced tensors
Pricing = tuple[list[DeviceClass], bool, Tensors, list[list[int]]]  # classes, exact, tensors, input readers


def device_classes(problem: Problem, names: list[str], devices: list[str] | None = None) -> Pricing:
    """Group the devices that price everything alike; whether the prices are exact; the tensors they
    price, and the kernels that read each input (model inputs, then for pipelines over part of the
    graph, the tensors that enter it)."""
    if problem.mode == "stage_serial":
        return stage_serial_classes(problem, names, devices)
    return host_staged_classes(problem, names)


def host_staged_classes(problem: Problem, names: list[str]) -> Pricing:
    """``host_staged`` prices: every tensor through host memory, one tensor per kernel; exact where each
    kernel sends one size of tensor on all its edges (otherwise its largest, an upper bound)."""
    graph, platform, costs = problem.graph, problem.platform, problem.costs
    host = platform.host
    inputs = [i for i in graph.inputs if i.consumers]
    sent = [max((e.bytes for e in graph.succ[k]), default=0.0) for k in names]
    exact = all(len({e.bytes for e in graph.succ[k]}) <= 1 for k in names)
    returned = [graph.kernels[k].output_bytes if k in graph.output_set else 0.0 for k in names]
    able = [d for d in platform.device_names if any(d in problem.feasible_devices(k) for k in names)]

    def describe(device: str) -> tuple:  # a device no kernel may use takes only the empty set
        feasible = np.array([device in problem.feasible_devices(k) for k in names], dtype=bool)
        pays = platform.device(device).kind != "cpu"
        base = np.array([costs.transfer_s(r, device, host) if pays and r > 0 else 0.0 for r in returned])
        full = np.array([costs.transfer_s(max(s, r), device, host) if pays else 0.0 for s, r in zip(sent, returned)])
        enter = [costs.transfer_s(s, host, device) if pays else 0.0 for s in sent]
        enter += [costs.transfer_s(i.bytes, host, device) if pays else 0.0 for i in inputs]
        work = np.array([costs.compute_s(k, device) if feasible[i] else 0.0 for i, k in enumerate(names)]) + base
        capacity = platform.device(device).memory_bytes
        return (
            work,
            ~feasible,
            np.concatenate([full - base, np.zeros(len(inputs) + 1)]),
            np.array(enter + [0.0]),
            math.inf if capacity is None else float(capacity),
        )

    index = {k: i for i, k in enumerate(names)}
    tensors = [(u, [index[e.dst] for e in graph.succ[k]]) for u, k in enumerate(names)]
    classes = [DeviceClass(devices, *description) for devices, description in identical_devices(able, describe)]
    return classes, exact, tensors, [[index[c] for c in i.consumers] for i in inputs]


def stage_serial_classes(problem: Problem, names: list[str], devices: list[str] | None = None) -> Pricing:
    """``stage_serial`` prices that no plan undercuts: a stage pays its kernels' compute and model-output
    returns, each tensor leaving it and each tensor or model input entering it, at the cheapest link
    between two devices. A producer's tensor is a layer per edge size (docs/solvers.md#tensor-layers),
    so it costs its dearest edge that crosses. Exact (and the DP's value the optimum) where every link
    prices each size alike.

    ``names`` may be part of the graph, closed under paths (the kernels of some consecutive stages),
    placed on ``devices``: a tensor read outside it always leaves (consumer n), and a tensor from
    outside enters wherever it is read, priced like a model input."""
    graph, platform, costs = problem.graph, problem.platform, problem.costs
    host = platform.host
    index = {k: i for i, k in enumerate(names)}
    inputs = [i for i in graph.inputs if any(c in index for c in i.consumers)]
    devices = devices or candidate_devices(problem)
    cheapest_link, links_alike = link_prices(problem, candidate_devices(problem))

    def layers(edges) -> list[tuple[list[int], float]]:
        """(consumers, price) per edge size: the tensor costs its dearest crossing edge."""
        out, below = [], 0.0
        for size in sorted({e.bytes for e in edges}):
            out.append(([index.get(e.dst, len(names)) for e in edges if e.bytes >= size], cheapest_link(size) - below))
            below = cheapest_link(size)
        return out

    tensors, tensor = [], []
    for u, k in enumerate(names):
        for consumers, price in layers(graph.succ[k]):
            tensors.append((u, consumers))
            tensor.append(price)
    entering = [
        layer
        for k in graph.topo_order
        if k not in index
        for layer in layers([e for e in graph.succ[k] if e.dst in index])
    ]
    readers = [[index[c] for c in i.consumers if c in index] for i in inputs] + [c for c, _ in entering]

    def describe(device: str) -> tuple:
        work, feasible = stage_work(problem, names, device)
        enter = tensor + [costs.transfer_s(i.bytes, host, device) for i in inputs] + [p for _, p in entering] + [0.0]
        capacity = platform.device(device).memory_bytes
        return (
            work,
            ~feasible,
            np.array(tensor + [0.0] * (len(readers) + 1)),
            np.array(enter),
            math.inf if capacity is None else float(capacity),
        )

    classes = [DeviceClass(d, *description) for d, description in identical_devices(devices, describe)]
    return classes, links_alike, tensors, readers


# ---------------------------------------------------------------------- the DP
@dataclass
class Partition:
    """The DP's answer: its period and the ordered kernel sets with the device class of each."""

    value_s: float
    sets: list[tuple[np.ndarray, int]]  # (kernel ids, class index), first set first


def by_cheapest_work(ideals: Ideals, classes: list[DeviceClass]) -> tuple[Ideals, np.ndarray, float]:
    """The ideals sorted by their work at each kernel's cheapest class, in integer quanta (exact sums,
    so a sub-ideal never sorts after its superset; ties go by size), with those sums and the quantum.

    A set S = I \\ J costs at least quantum * (key[I] - key[J]) on any device, so the DP may skip every
    J whose key lies further below I's than a known bound on the answer."""
    work = np.stack([np.where(c.infeasible, np.inf, c.work) for c in classes]).min(axis=0)
    work = np.where(np.isfinite(work), work, 0.0)
    quantum = work.sum() / 2**40 or 1.0
    key = ideals.members @ np.floor(work / quantum).astype(np.int64)
    order = np.lexsort((ideals.members.sum(axis=1), key))
    return ideals.take(order), key[order], quantum


def max_load_dp(
    ideals: Ideals,
    classes: list[DeviceClass],
    weight_bytes: np.ndarray,
    *,
    key: np.ndarray,
    quantum: float,
    bound_s: float = math.inf,
    deadline: Deadline = NO_DEADLINE,
    max_sets: int | None = None,
) -> Partition:
    """The DP over ``ideals`` (ordered by ``by_cheapest_work``). Sets whose cheapest work exceeds
    ``bound_s`` are skipped, so the value is exact when it is at most ``bound_s``. At most
    ``max_sets`` sets (all devices where None). Raises TimeoutError once ``deadline`` passes."""
    counts = [len(c.devices) for c in classes]
    shape = tuple(k + 1 for k in counts)
    states = int(np.prod(shape))
    grid = np.indices(shape).reshape(len(shape), -1)  # (classes, states)
    strides = [int(np.prod(shape[c + 1 :])) for c in range(len(shape))]
    target = [np.flatnonzero(grid[c] >= 1) for c in range(len(shape))]
    source = [t - strides[c] for c, t in enumerate(target)]
    prices = _SetPrices.of(ideals, classes, weight_bytes)
    N = len(ideals)
    reach = int(bound_s / quantum) if bound_s / quantum < key[-1] else None
    words = [np.ascontiguousarray(ideals.packed[:, w]) for w in range(ideals.packed.shape[1])]

    dp = np.full((N, states), np.inf)
    dp[0, 0] = 0.0
    came_from = np.full((N, states), -1, dtype=np.int64)
    via = np.full((N, states), -1, dtype=np.int8)
    began = last_report = time.perf_counter()
    for i in range(1, N):
        if deadline.passed():
            raise TimeoutError(f"downset DP stopped at ideal {i} of {N}")
        now = time.perf_counter()
        if now - last_report > _PROGRESS_EVERY_S:
            log.info("downsets: %d of %d ideals after %.0f s", i, N, now - began)
            last_report = now
        lowest = int(np.searchsorted(key, key[i] - reach)) if reach is not None else 0
        sub = lowest + np.flatnonzero(_outside(words, ideals.packed[i], lowest, i) == 0)
        if not len(sub):
            continue
        dp_sub = np.take(dp, sub, axis=0)  # np.take: several times faster than fancy indexing here
        for c, load in enumerate(prices.loads(ideals, i, sub)):
            candidates = np.maximum(np.take(dp_sub, source[c], axis=1), load[:, None])  # (m, targets)
            pick = candidates.argmin(axis=0)
            value = candidates[pick, np.arange(len(pick))]
            better = value < dp[i, target[c]]
            where = target[c][better]
            dp[i, where] = value[better]
            came_from[i, where] = sub[pick[better]]
            via[i, where] = c
    final = N - 1
    allowed = dp[final] if max_sets is None else np.where(grid.sum(axis=0) <= max_sets, dp[final], np.inf)
    state = int(allowed.argmin())
    value = float(dp[final, state])
    sets = []
    i = final
    while i != 0 and math.isfinite(value):
        j, c = int(came_from[i, state]), int(via[i, state])
        sets.append((np.flatnonzero(ideals.members[i] & ~ideals.members[j]), c))
        i, state = j, state - strides[c]
    return Partition(value, sets[::-1])


@dataclass
class _SetPrices:
    """What a set I \\ J costs each device class, from tables over the ideals (the DP's inner step)."""

    work: np.ndarray  # (k, N) each ideal's work per class
    bad: np.ndarray  # (k, N) each ideal's kernels the class may not run
    memory: np.ndarray  # (N,) each ideal's weight bytes
    leave: np.ndarray  # (k, P) per class and tensor
    enter: np.ndarray  # (k, P)
    leaving: np.ndarray  # (k, N) the tensors leaving each ideal
    pays: bool  # whether any tensor costs anything to move
    own: list[np.ndarray]  # per class, the tensor columns it prices unlike class 0
    apart: dict[int, tuple]  # class: its own columns, whether each is on a frontier, its consumers inside
    capacity: np.ndarray  # (k,) memory bytes

    @classmethod
    def of(cls, ideals: Ideals, classes: list[DeviceClass], weight_bytes: np.ndarray) -> _SetPrices:
        members = ideals.members
        leave = np.stack([c.leave for c in classes])
        enter = np.stack([c.enter for c in classes])
        # a class prices the frontier as class 0 does but on a few columns (a device's own host link):
        # price class 0's once per pair, and those columns apart
        width = ideals.frontier.shape[1]
        own = [np.flatnonzero((enter[c] != enter[0]) | (leave[c] != leave[0])) for c in range(len(classes))]
        return cls(
            work=np.stack([members @ c.work for c in classes]),
            bad=np.stack([members @ c.infeasible.astype(np.int64) for c in classes]),
            memory=members @ weight_bytes,
            leave=leave,
            enter=enter,
            leaving=np.stack([leave[c][ideals.frontier].sum(axis=1) for c in range(len(classes))]),
            pays=bool(leave.any() or enter.any()),
            own=own,
            apart={
                c: (columns, (ideals.frontier[:, :, None] == columns).any(axis=1), ideals.consumers_inside[:, columns])
                for c, columns in enumerate(own)
                if 0 < len(columns) <= width
            },
            capacity=np.array([c.memory_bytes for c in classes]),
        )

    def loads(self, ideals: Ideals, i: int, sub: np.ndarray) -> list[np.ndarray]:
        """Per class, the cost of ideal ``i`` less each sub-ideal in ``sub`` (inf where the class may
        not take that set: a kernel it may not run, or past its memory)."""
        work, bad, memory, enter, leave, apart = self.work, self.bad, self.memory, self.enter, self.leave, self.apart
        nodes = np.take(ideals.frontier, sub, axis=0)  # (m, width)
        inside_now = ideals.consumers_inside[i]
        gains = np.take(inside_now, nodes) > np.take(ideals.frontier_inside, sub, axis=0)
        stays = inside_now < ideals.degree  # a tensor of J's frontier with a reader outside I stays on it
        shared = _frontier_prices(enter[0], leave[0], nodes, gains, stays) if self.pays else 0.0
        loads = []
        for c in range(len(work)):
            load = work[c, i] - np.take(work[c], sub) + self.leaving[c, i]
            if c in apart:
                columns, on_frontier, inside = apart[c]
                held = np.take(on_frontier, sub, axis=0)
                gained = held & (inside[i] > np.take(inside, sub, axis=0))
                stayed = held & stays[columns]
                load += shared + gained @ (enter[c, columns] - enter[0, columns])
                load -= stayed @ (leave[c, columns] - leave[0, columns])
            elif c == 0 or not len(self.own[c]):
                load += shared
            else:
                load += _frontier_prices(enter[c], leave[c], nodes, gains, stays)
            if bad[c, -1]:
                load[bad[c, i] > np.take(bad[c], sub)] = np.inf
            if memory[-1] > self.capacity[c]:
                load[memory[i] - np.take(memory, sub) > self.capacity[c]] = np.inf
            loads.append(load)
        return loads


def _outside(words: list[np.ndarray], row: np.ndarray, lowest: int, end: int) -> np.ndarray:
    """Per ideal lowest..end-1, its kernels outside the ideal ``row`` (packed bits; 0 where a subset),
    one contiguous word column at a time: much faster than a 2-D test on few words."""
    outside = np.zeros(end - lowest, dtype=np.uint64)
    for column, held in zip(words, row):
        if ~held:
            outside |= column[lowest:end] & ~held
    return outside


def _frontier_prices(
    enter: np.ndarray, leave: np.ndarray, nodes: np.ndarray, gains: np.ndarray, stays: np.ndarray
) -> np.ndarray:
    """Per sub-ideal J (a row of ``nodes``, its frontier): the tensors of J's frontier that enter the set
    (``gains``) less those that stay on the frontier (``stays``, per tensor), which the ideal's own
    ``leaving`` counted: one gather from a two-row price table, summed by a matrix product."""
    stay_price = np.where(stays, leave, 0.0)
    table = np.concatenate([-stay_price, enter - stay_price])
    return np.take(table, nodes + len(enter) * gains) @ np.ones(nodes.shape[1])


# ---------------------------------------------------------------------- one problem, ready for the DP
@dataclass
class MaxLoadInstance:
    """A problem (or a window of a pipeline) turned into what the DP reads: kernels in topological
    order, the ideals (sorted by ``by_cheapest_work``), the device classes, each kernel's weight bytes
    and the most sets."""

    names: list[str]
    ideals: Ideals
    key: np.ndarray
    quantum: float
    classes: list[DeviceClass]
    prices_exact: bool
    weight_bytes: np.ndarray
    max_sets: int  # pipelines: the stages asked for

    @classmethod
    def of(
        cls,
        problem: Problem,
        max_ideals: int,
        kernels: set[str] | None = None,
        devices: list[str] | None = None,
        max_sets: int | None = None,
        family: list[int] | None = None,
        deadline: Deadline = NO_DEADLINE,
    ) -> MaxLoadInstance:
        """The whole problem, or (pipelines) only ``kernels``, closed under paths, as at most
        ``max_sets`` stages on ``devices`` with the rest of the graph where it is; over every ideal,
        or over ``family`` (bitmasks over the kernels in topological order: ``build_ideals``, which
        raises TimeoutError past ``deadline``)."""
        graph = problem.graph
        names = [k for k in graph.topo_order if kernels is None or k in kernels]
        index = {k: i for i, k in enumerate(names)}
        predecessors = [[index[e.src] for e in graph.pred[k] if e.src in index] for k in names]
        successors = [[index[e.dst] for e in graph.succ[k] if e.dst in index] for k in names]
        classes, prices_exact, tensors, inputs = device_classes(problem, names, devices)
        grouped: dict[str, list[int]] = defaultdict(list)
        for k in names:
            if graph.kernels[k].colocate is not None:
                grouped[graph.kernels[k].colocate].append(index[k])
        groups = [m for m in grouped.values() if len(m) > 1]
        ideals = build_ideals(predecessors, successors, groups, tensors, inputs, max_ideals, family, deadline)
        cells = len(ideals) * math.prod(len(c.devices) + 1 for c in classes)
        if cells > MAX_DP_CELLS:
            raise TooManyIdeals(
                f"{len(ideals)} ideals x {cells // len(ideals)} device counts: a DP table of more than "
                f"{MAX_DP_CELLS} cells"
            )
        ideals, key, quantum = by_cheapest_work(ideals, classes)
        if problem.mode == "stage_serial":  # a shared weight split among its users: no set is refused wrongly
            users: dict[str, int] = defaultdict(int)
            for k in names:
                for w in graph.kernels[k].weights:
                    users[w] += 1
            weight_bytes = np.array(
                [sum(graph.weights.get(w, 0.0) / users[w] for w in graph.kernels[k].weights) for k in names]
            )
        else:
            weight_bytes = np.array([graph.weight_bytes([k]) for k in names], dtype=float)
        sets = min(max_sets or problem.stages or len(names), sum(len(c.devices) for c in classes))
        return cls(names, ideals, key, quantum, classes, prices_exact, weight_bytes, sets)

    def dp(self, bound_s: float = math.inf, deadline: Deadline = NO_DEADLINE) -> Partition:
        return max_load_dp(
            self.ideals,
            self.classes,
            self.weight_bytes,
            key=self.key,
            quantum=self.quantum,
            bound_s=bound_s,
            deadline=deadline,
            max_sets=self.max_sets,
        )

    def stages_of(self, split: Partition) -> tuple[list[list[str]], list[str]]:
        """The DP's sets as stages of kernel names, each on the next unused device of its class."""
        used = {c: 0 for c in range(len(self.classes))}
        stages, devices = [], []
        for kernel_ids, c in split.sets:
            devices.append(self.classes[c].devices[used[c]])
            used[c] += 1
            stages.append([self.names[i] for i in kernel_ids])
        return stages, devices

    def pairs_within(self, bound_s: float, every: int = SAMPLE_EVERY) -> int:
        """About how many (ideal, sub-ideal) pairs a DP pass at ``bound_s`` prices, its time being
        their pricing: the sub-ideals within reach of every ``every``-th ideal, counted."""
        key, packed = self.key, self.ideals.packed
        reach = bound_s / self.quantum
        words = [np.ascontiguousarray(packed[:, w]) for w in range(packed.shape[1])]
        counted = 0
        for i in range(every - 1, len(key), every):
            lowest = int(np.searchsorted(key, key[i] - reach)) if reach < key[-1] else 0
            counted += int(np.count_nonzero(_outside(words, packed[i], lowest, i) == 0))
        return counted * every

    def search(self, deadline: Deadline = NO_DEADLINE, upper_s: float = math.inf) -> tuple[Partition, int]:
        """The DP with a guessed bound on the answer (sets whose cheapest work exceeds it are skipped),
        raised until the DP's value lies within it (then no skipped set could have helped): start at
        1.25 x the average-load bound and grow by 1.5 (or to the value found, if less) each time.
        ``upper_s``, a known plan's period, where it lies within that first growth, is the first bound
        instead: one pass at it (whose value no plan's undercuts) saves a pass that would fail. With a
        ``deadline``, a pass whose pairs (``pairs_within``) would take past it at ``PAIRS_PER_S`` is
        not begun: DpStopped at once, with the last finished pass's split."""
        total = self.quantum * self.key[-1]
        bound = 1.25 * total / self.max_sets
        if upper_s <= 1.5 * bound:
            bound = upper_s
        passes, found = 0, None
        while True:
            if math.isfinite(deadline.at):  # refuse at once a pass that cannot end in time
                pairs = self.pairs_within(bound)
                if pairs / PAIRS_PER_S > deadline.left():
                    raise DpStopped(
                        f"the DP would price about {pairs:.3g} pairs of ideals, "
                        f"{pairs / PAIRS_PER_S:.0f} s at {PAIRS_PER_S:.2g} a second: past the time limit",
                        found,
                    )
            try:
                split = self.dp(bound, deadline)
            except TimeoutError as stop:
                raise DpStopped(str(stop), found) from None
            passes += 1
            if split.value_s <= bound or bound >= total:
                return split, passes
            found = split if math.isfinite(split.value_s) else found
            log.info("downsets: pass %d with bound %.6g s found %.6g s; again", passes, bound, split.value_s)
            bound = min(split.value_s, 1.5 * bound)


# ---------------------------------------------------------------------- the solver


def downset_plan(
    problem: Problem, max_ideals: int, deadline: Deadline = NO_DEADLINE, upper_s: float = math.inf
) -> Plan:
    """The DP's plan (solver ``downsets``), scored by the simulator. For pipelines ``lower_bound_s`` is the
    DP's value, and ``infeasible`` says why, where the plan breaks what the DP relaxes.
    ``upper_s``: a known plan's value, which spares the DP a pass (``MaxLoadInstance.search``).
    Raises TooManyIdeals past ``max_ideals``, DpStopped (a TimeoutError) past ``deadline``, with the
    plan of a finished pass that proved nothing, if any."""
    began = time.perf_counter()
    graph = problem.graph
    instance = MaxLoadInstance.of(problem, max_ideals)
    classes = instance.classes
    log.info(
        "downsets: %d kernels, %d group-closed ideals, device classes %s",
        len(graph),
        len(instance.ideals),
        ", ".join(f"{len(c.devices)} x {c.devices[0]}" for c in classes),
    )
    try:
        split, passes = instance.search(deadline, upper_s)
    except DpStopped as stop:
        if stop.partition is not None:
            stop.plan = _plan_of(problem, instance, stop.partition)
            stop.plan.method, stop.plan.attrs["ideals"] = "downset DP, stopped", len(instance.ideals)
        raise
    if not math.isfinite(split.value_s):
        raise DivimlInputError(
            "no ordered split into contiguous sets keeps every kernel on a device it may run "
            "on, within memory, with co-location groups whole",
            field="platform",
            hint="allow more devices, or devices with more memory",
        )
    plan = _plan_of(problem, instance, split)
    sim = simulate(problem, plan)
    plan.method = "downset DP"
    plan.attrs.update({"ideals": len(instance.ideals), "dp_passes": passes})
    plan.attrs.update({"dp_value_s": split.value_s, "prices_exact": instance.prices_exact})
    if problem.mode == "stage_serial":  # the DP relaxes the simulator: its value bounds every plan
        plan.lower_bound_s = min(split.value_s, sim.value_s)
        plan.optimal = sim.feasible and within_slack(sim.value_s, split.value_s)
        if not sim.feasible:
            plan.infeasible = "the DP's plan " + "; ".join(sim.problems)
    else:
        memory_exact = all(math.isinf(c.memory_bytes) for c in classes) or _memory_is_additive(graph)
        plan.optimal = instance.prices_exact and memory_exact and sim.feasible
        plan.optimal_among = "ordered splits into contiguous sets (Tarnawski et al.)"
        plan.attrs["memory_exact"] = memory_exact
    log.info(
        "downsets: %s %.6g s over %d sets, %d ideals, %.2f s (exact DP%s)",
        "period" if problem.mode == "stage_serial" else "max load",
        sim.value_s,
        len(plan.stages),
        len(instance.ideals),
        time.perf_counter() - began,
        "" if plan.optimal else ", not proven optimal",
    )
    return plan


def _plan_of(problem: Problem, instance: MaxLoadInstance, split: Partition) -> Plan:
    """The DP's split as a plan of the whole graph, its value the simulator's."""
    stages, stage_devices = instance.stages_of(split)
    assignment = {k: d for stage, d in zip(stages, stage_devices) for k in stage}
    plan = Plan(
        {k: assignment[k] for k in problem.graph.kernels},
        objective=problem.objective,
        mode=problem.mode,
        stages=stages,
        stage_devices=stage_devices,
        solver="downsets",
    )
    plan.value_s = simulate(problem, plan).value_s
    return plan


def _memory_is_additive(graph) -> bool:
    """The simulator's memory equals the sum of each kernel's weights: no weight is shared and no
    activation takes room (the msr-fiddle case)."""
    users: dict[str, int] = defaultdict(int)
    for kernel in graph.kernels.values():
        for w in kernel.weights:
            users[w] += 1
    return (
        all(n == 1 for n in users.values())
        and all(k.output_bytes == 0 for k in graph.kernels.values())
        and all(i.bytes == 0 for i in graph.inputs)
    )
