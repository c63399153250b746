"""Every segment of a topological order priced at once, on every device (numpy), for SliceGraph's
DP over cuts: a stage in the simulator's ``stage_serial`` mode, or (throughput on a host_staged
platform) in ``host_staged``. Prefix sums price the work; tensors entering and leaving a segment are
a 2-D difference array over (start, end) of price layers, integrated by two cumulative sums, so
that pricing one more order takes milliseconds (docs/solvers.md#slicegraph).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..problem import Problem
from .device_classes import identical_devices
from .pipeline_model import TensorLayers, tensor_layers

DP_ROWS = 256  # segment ends the DP takes at once: each block spans the band of its first end
GUESS_LOADS = 2.0  # an exact slicing first prices stages of up to this many average loads of work


def _leaving_entries(pos: np.ndarray, producer_pos: np.ndarray, layers: TensorLayers):
    """(x, y, w) difference entries for [x <= a < y <= last consumer of the layer]."""
    last = np.maximum.reduceat(pos[layers.consumer], layers.start)
    after, w, zero = producer_pos + 1, layers.weight, np.zeros_like(producer_pos)
    return (
        np.concatenate([zero, after, zero, after]),
        np.concatenate([after, after, last + 1, last + 1]),
        np.concatenate([w, -w, -w, w]),
    )


def _entering_entries(pos: np.ndarray, producer_pos: np.ndarray, layers: TensorLayers):
    """(x, y, w) difference entries for [a < x and a consumer of the layer lies in [x, y)]."""
    at = pos[layers.consumer]
    sort = np.lexsort((at, layers.layer))
    layer, at = layers.layer[sort], at[sort]
    previous = np.empty_like(at)
    previous[1:] = at[:-1]
    first = np.ones(len(at), dtype=bool)
    first[1:] = layer[1:] != layer[:-1]
    previous[first] = producer_pos[layer[first]]
    w = layers.weight[layer]
    return np.concatenate([previous + 1, at + 1]), np.concatenate([at + 1, at + 1]), np.concatenate([w, -w])


def _integrate_entries(
    grid: np.ndarray, entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]], starts: np.ndarray
) -> np.ndarray:
    """grid[y, x] = sum of the weights of entries at (x' <= x, y' <= y), written only for
    starts[y] <= x <= y + 1 (``starts`` nondecreasing, starts[y] <= y): the rest of ``grid`` is never
    touched, so its memory is never paged in. An entry right of its row's columns first counts
    where a later row reaches it, one left of them counts from their start: moved there, each row is
    its own entries' cumulative sum plus the row before."""
    size = len(grid)
    x, y, w = (np.concatenate(parts) for parts in zip(*entries)) if entries else (np.zeros(0, dtype=np.int64),) * 3
    y = np.maximum(y, x - 1)
    keep = (y < size) & (x < size)  # past the last segment end (a virtual consumer at the end)
    x, y, w = x[keep], y[keep], w[keep]
    x = np.maximum(x, starts[y])
    by_row = np.argsort(y, kind="stable")
    x, y, w = x[by_row], y[by_row], w[by_row]
    first = np.searchsorted(y, np.arange(size + 1))
    for row in range(size):
        low, high = starts[row], min(row + 2, size)
        out = grid[row, low:high]
        out.fill(0.0)
        if first[row + 1] > first[row]:
            np.add.at(out, x[first[row] : first[row + 1]] - low, w[first[row] : first[row + 1]])
        np.cumsum(out, out=out)
        if row:  # the row before holds columns up to row; past that it is constant
            below = min(row + 1, size)
            out[: below - low] += grid[row - 1, low:below]
            out[below - low :] += grid[row - 1, below - 1]
    return grid


@dataclass(frozen=True)
class DeviceProfile:
    """What a stage costs on one device, per kernel id; identical devices share one profile."""

    work: np.ndarray  # compute seconds plus the return of model outputs to the host (0 where infeasible)
    infeasible: np.ndarray  # bool: the device may not run the kernel
    input_price: np.ndarray  # seconds per model input, from the host
    memory_bytes: float
    send: np.ndarray  # host_staged: seconds to copy each distinct tensor size to the host (else empty)
    receive: np.ndarray  # host_staged: and from the host


class StageCosts:
    """Prices every segment of a topological order on each device, in the ``stage_serial`` mode or,
    for throughput on a host_staged platform, the ``host_staged`` mode.

    Kernels are numbered by their place in ``graph.topo_order``. Everything that does not depend
    on the order is computed here once; ``slice`` then takes milliseconds per order.
    """

    def __init__(self, problem: Problem, reserve: dict[str, float] | None = None, exact_memory: bool = False):
        """``reserve``: bytes kept free on a device for its activations (the DP counts weights only);
        ``exact_memory``: instead, every segment's memory as the simulator counts it (weights plus the
        peak of live activations), slower: a sweep per segment start (``_SegmentMemory``)."""
        graph, platform, costs = problem.graph, problem.platform, problem.costs
        reserve = reserve or {}
        self.problem = problem
        self.names = list(graph.topo_order)
        self.n = len(self.names)
        index = {name: i for i, name in enumerate(self.names)}
        self.successors = [[index[e.dst] for e in graph.succ[k]] for k in self.names]
        self.indegree = [len(graph.pred[k]) for k in self.names]
        self.devices = platform.device_names
        self._edge_src = [index[e.src] for e in graph.edges]
        self._edge_dst = [index[e.dst] for e in graph.edges]
        self.host_staged = problem.mode == "host_staged"
        self._byte_values, self._edge_byte = np.unique(
            np.array([e.bytes for e in graph.edges], dtype=float), return_inverse=True
        )
        # host_staged: a model output is a read by a virtual consumer past the end (id n), never in a stage
        returned = [index[k] for k in self.names if k in graph.output_set and graph.kernels[k].output_bytes > 0]
        self._returned = (
            np.array(returned, dtype=np.int64),
            np.array([graph.kernels[self.names[i]].output_bytes for i in returned], dtype=float),
        )
        self._link_prices: dict[tuple[str, str], np.ndarray] = {}
        self._edge_layers: dict[frozenset, tuple[TensorLayers, bool]] = {}
        self._profile_layers: dict[int, tuple[TensorLayers, TensorLayers]] = {}
        self._layers_by_price: dict[bytes, TensorLayers] = {}

        host = platform.host
        model_inputs = [i for i in graph.inputs if i.consumers]
        self._input_consumers = [np.array([index[c] for c in set(i.consumers)], dtype=np.int64) for i in model_inputs]
        self.weight_bytes = np.array([graph.weight_bytes([k]) for k in self.names], dtype=float)
        feasible = {k: set(problem.feasible_devices(k)) for k in self.names}

        def describe(device: str) -> tuple:
            infeasible = np.array([device not in feasible[k] for k in self.names], dtype=bool)
            work = np.array([0.0 if infeasible[i] else costs.compute_s(k, device) for i, k in enumerate(self.names)])
            pays = not self.host_staged or platform.device(device).kind != "cpu"
            if not self.host_staged:
                work += [
                    costs.transfer_s(graph.kernels[k].output_bytes, device, host) if k in graph.output_set else 0.0
                    for k in self.names
                ]
            sizes = np.concatenate([self._byte_values, self._returned[1]]) if self.host_staged else []
            capacity = platform.device(device).memory_bytes
            return (
                work,
                infeasible,
                np.array([costs.transfer_s(i.bytes, host, device) if pays else 0.0 for i in model_inputs], dtype=float),
                math.inf if capacity is None else float(capacity) - reserve.get(device, 0.0),
                np.array([costs.transfer_s(b, device, host) if pays else 0.0 for b in sizes]),
                np.array([costs.transfer_s(b, host, device) if pays else 0.0 for b in sizes]),
            )

        classes = identical_devices(self.devices, describe)
        self.profiles = [DeviceProfile(*description) for _, description in classes]
        self.profile_of = {device: index for index, (devices, _) in enumerate(classes) for device in devices}
        groups: dict[str, list[int]] = defaultdict(list)
        for name in self.names:
            if graph.kernels[name].colocate is not None:
                groups[graph.kernels[name].colocate].append(index[name])
        self.groups = list(groups.values())
        self._group_members = np.array([i for members in groups.values() for i in members], dtype=np.int64)
        self._group_start = np.cumsum([0] + [len(m) for m in groups.values()])[:-1]
        self._buffers: dict[object, np.ndarray] = {}
        self.exact_memory = exact_memory
        if exact_memory:
            self._memory = _SegmentMemory(problem, self.names)

    def _buffer(self, key: object, rows: int | None = None) -> np.ndarray:
        """A reused (rows or n + 1) x (n + 1) array: fresh 8 MB arrays per order cost as much as the arithmetic."""
        if key not in self._buffers:
            self._buffers[key] = np.empty((rows or self.n + 1, self.n + 1))
        return self._buffers[key]

    # ------------------------------------------------------------------ transfers
    def _link_price(self, src: str, dst: str) -> np.ndarray:
        """Seconds to send each distinct edge size over one link."""
        if (src, dst) not in self._link_prices:
            self._link_prices[(src, dst)] = np.array(
                [self.problem.costs.transfer_s(b, src, dst) for b in self._byte_values], dtype=float
            )
        return self._link_prices[(src, dst)]

    def edge_layers(self, stage_devices: Sequence[str]) -> tuple[TensorLayers, bool]:
        """Tensor layers priced at the dearest link between two stage devices, and whether every
        such link prices alike (then the DP is exact)."""
        key = frozenset(stage_devices)
        if key not in self._edge_layers:
            prices = [self._link_price(a, b) for a in key for b in key if a != b]
            dearest = np.max(prices, axis=0) if prices else np.zeros(len(self._byte_values))
            exact = all(np.array_equal(p, dearest) for p in prices)
            edge_price = dearest[self._edge_byte] if len(self._edge_src) else np.zeros(0)
            cache = edge_price.tobytes()
            if cache not in self._layers_by_price:
                self._layers_by_price[cache] = tensor_layers(self._edge_src, self._edge_dst, edge_price.tolist())
            self._edge_layers[key] = (self._layers_by_price[cache], exact)
        return self._edge_layers[key]

    # ------------------------------------------------------------------ segment grids
    def host_staged_layers(self, profile_id: int) -> tuple[TensorLayers, TensorLayers]:
        """(leaving, entering) tensor layers priced as host_staged charges a device of this profile."""
        if profile_id not in self._profile_layers:
            profile, (returned, _) = self.profiles[profile_id], self._returned
            size_id = np.concatenate([self._edge_byte, len(self._byte_values) + np.arange(len(returned))])
            leaving = tensor_layers(
                self._edge_src + returned.tolist(),
                self._edge_dst + [self.n] * len(returned),
                profile.send[size_id.astype(np.int64)].tolist(),
            )
            entering = tensor_layers(self._edge_src, self._edge_dst, profile.receive[self._edge_byte].tolist())
            self._profile_layers[profile_id] = (leaving, entering)
        return self._profile_layers[profile_id]

    def transfer_grid(
        self,
        pos: np.ndarray,
        leaving: TensorLayers,
        entering: TensorLayers,
        starts: np.ndarray,
        key: object = "transfers",
    ) -> np.ndarray:
        """grid[y, x]: the seconds of tensors (``leaving`` layers) leaving and (``entering`` layers)
        entering order[x:y] between stages, for starts[y] <= x <= y. ``pos`` has one extra entry, n,
        for the virtual consumer past the end."""
        grid = self._buffer(key)
        entries = []
        if len(leaving.producer):
            entries.append(_leaving_entries(pos, pos[leaving.producer], leaving))
        if len(entering.producer):
            entries.append(_entering_entries(pos, pos[entering.producer], entering))
        return _integrate_entries(grid, entries, starts)

    def least_starts(self, order: np.ndarray, profile_id: int, upper: float) -> tuple[np.ndarray, np.ndarray | None]:
        """starts[y]: the first x from which order[x:y] may be a stage on a device of this profile:
        within its reach (before the next kernel it may not run, within its memory) and, where
        ``upper`` is finite, with work at most ``upper`` (a dearer stage cannot be in a slicing of
        period ``upper`` or less). Nondecreasing in y; also, where the exact memory of segments is not
        nondecreasing in their start (then ``starts`` ignores it), the mask of segments it refuses."""
        n, profile = self.n, self.profiles[profile_id]
        prefix = np.concatenate([[0.0], np.cumsum(profile.work[order])])
        ends = np.arange(n + 1)
        starts = np.zeros(n + 1, dtype=np.int64)
        if math.isfinite(upper):  # a relative slack for the rounding of the grids' sums
            starts = np.searchsorted(prefix, prefix - upper * (1 + 1e-9), side="left")
        # The furthest end y of a segment starting at x: before the next kernel the device may not
        # run, and within its memory.
        bad = np.where(profile.infeasible[order], ends[:n], n)
        furthest = np.append(np.minimum.accumulate(bad[::-1])[::-1], n)
        if math.isfinite(profile.memory_bytes) and self.exact_memory:
            furthest = np.minimum(furthest, self._memory.furthest_fitting(order, profile.memory_bytes))
        elif math.isfinite(profile.memory_bytes):
            weights = np.concatenate([[0.0], np.cumsum(self.weight_bytes[order])])
            fits = np.searchsorted(weights, weights + profile.memory_bytes, side="right") - 1
            furthest = np.maximum(np.minimum(furthest, fits), ends)  # an empty stage always fits
        if (np.diff(furthest) >= 0).all():  # x reaches y where furthest[x] >= y
            return np.maximum(starts, np.searchsorted(furthest, ends, side="left")), None
        return starts, ends[:, None] > furthest[None, :]

    def stage_grid(
        self,
        order: np.ndarray,
        pos: np.ndarray,
        profile_id: int,
        transfers: np.ndarray,
        forbidden_cuts: np.ndarray,
        starts: tuple[np.ndarray, np.ndarray | None],
        band: np.ndarray,
    ) -> np.ndarray:
        """grid[y, x] = f(order[x:y]) on a device of profile ``profile_id``, written only where the DP
        reads it (``slice``: rows in blocks of DP_ROWS, each from column ``band`` at its first row):
        inf where x > y or not allowed (before ``starts``, from ``least_starts``)."""
        n, profile = self.n, self.profiles[profile_id]
        prefix = np.concatenate([[0.0], np.cumsum(profile.work[order])])
        grid = self._buffer(profile_id)
        first, refused = starts
        cut_forbidden = forbidden_cuts.any()
        for y in range(n + 1):  # on 10,000 kernels the square is 800 MB: the band is a fifth of it
            top = y - y % DP_ROWS
            row, left, x, right = grid[y], band[top], first[y], min(n + 1, top + DP_ROWS)
            row[left:x] = np.inf
            np.subtract(prefix[y], prefix[x : y + 1], out=row[x : y + 1])
            row[x : y + 1] += transfers[y, x : y + 1]
            row[y + 1 : right] = np.inf
            if cut_forbidden:  # no stage may start or end inside a co-location group
                row[left:right][forbidden_cuts[left:right] | forbidden_cuts[y]] = np.inf
        # A model input enters every segment [x, y) that holds one of its consumers: with its
        # consumers c_1 < c_2 < ... in the order (c_0 = -1), the rectangles x in (c_{k-1}, c_k], y > c_k,
        # cut off at the rows whose first column read lies past them.
        ends = np.arange(n + 1)
        window = band[ends - ends % DP_ROWS]
        for consumers, price in zip(self._input_consumers, profile.input_price):
            previous = -1
            for at in np.sort(pos[consumers]).tolist() if price else ():
                grid[at + 1 : np.searchsorted(window, at, side="right"), previous + 1 : at + 1] += price
                previous = at
        if refused is not None:
            grid[refused] = np.inf
        return grid

    def forbidden_cuts(self, pos: np.ndarray) -> np.ndarray:
        """Cut positions that would split a co-location group (a cut at x ends a stage before order[x])."""
        forbidden = np.zeros(self.n + 2, dtype=np.int64)
        if len(self._group_members):
            at = pos[self._group_members]
            np.add.at(forbidden, np.minimum.reduceat(at, self._group_start) + 1, 1)
            np.add.at(forbidden, np.maximum.reduceat(at, self._group_start) + 1, -1)
        return np.cumsum(forbidden)[: self.n + 1] > 0

    # ------------------------------------------------------------------ the DP
    def slice(
        self, order: np.ndarray, stage_devices: Sequence[str], upper: float = math.inf
    ) -> tuple[float, list[int], bool]:
        """The exact DP over one order of kernel ids: (value, cuts, exact). Stage b is
        order[cuts[b]:cuts[b + 1]] on stage_devices[b] (maybe empty); value is inf when no slicing
        is feasible. ``exact``: the value is the simulator's; otherwise it is an upper bound.
        ``upper``: stages whose work exceeds it are not priced (on 10,000 kernels at K = 8 a fifth of
        the segments are left): where the value is at most ``upper`` it is the order's optimum; above,
        it is a slicing's value and the optimum exceeds ``upper`` too. Without ``upper`` the DP first
        tries ``GUESS_LOADS`` times the least average load: the arrays' memory is paged in only where
        written (6 s per 800 MB on this machine), and the optimum is almost always within it."""
        if math.isinf(upper):
            least = np.minimum.reduce([self.profiles[self.profile_of[d]].work for d in stage_devices])
            guess = GUESS_LOADS * float(least.sum()) / len(stage_devices)
            value, cuts, exact = self._slice(order, stage_devices, guess)
            if value <= guess:
                return value, cuts, exact
        return self._slice(order, stage_devices, upper)

    def _slice(self, order: np.ndarray, stage_devices: Sequence[str], upper: float) -> tuple[float, list[int], bool]:
        n = self.n
        pos = np.empty(n + 1, dtype=np.int64)
        pos[order] = np.arange(n)
        pos[n] = n
        profiles = list(dict.fromkeys(self.profile_of[device] for device in stage_devices))
        starts = {profile: self.least_starts(order, profile, upper) for profile in profiles}
        band = np.minimum.reduce([first for first, _ in starts.values()])
        if self.host_staged:
            exact = True
        else:
            layers, exact = self.edge_layers(stage_devices)
            transfers = self.transfer_grid(pos, layers, layers, band)
        forbidden = self.forbidden_cuts(pos[:n])
        grids = {}
        for profile in profiles:
            if self.host_staged:
                leaving, entering = self.host_staged_layers(profile)
                transfers = self.transfer_grid(pos, leaving, entering, starts[profile][0], key=("transfers", profile))
            grids[profile] = self.stage_grid(order, pos[:n], profile, transfers, forbidden, starts[profile], band)
        best = np.full(n + 1, np.inf)
        best[0] = 0.0
        choice = np.empty((len(stage_devices), n + 1), dtype=np.int64)
        scratch = self._buffer("scratch", rows=DP_ROWS)
        for b, device in enumerate(stage_devices):
            grid, reached = grids[self.profile_of[device]], np.empty(n + 1)
            for top in range(0, n + 1, DP_ROWS):  # rows top..bottom - 1 read columns band[top]..bottom - 1
                bottom = min(n + 1, top + DP_ROWS)
                left, rows = band[top], np.arange(bottom - top)
                block = np.maximum(
                    grid[top:bottom, left:bottom], best[left:bottom], out=scratch[: len(rows), : bottom - left]
                )
                at = block.argmin(axis=1)
                choice[b, top:bottom] = left + at
                reached[top:bottom] = block[rows, at]
            best = reached
        cuts = [n]
        for b in reversed(range(len(stage_devices))):
            cuts.append(int(choice[b][cuts[-1]]))
        return float(best[n]), cuts[::-1], exact


class _SegmentMemory:
    """The simulator's memory of a stage (``simulator.memory_per_device``: its distinct weights plus the
    peak of live activations, the stage's kernels run in the graph's topological order), for every
    segment of an order that starts at a given place, by one sweep that grows the segment a kernel at
    a time. Live bytes are kept per topological position: a tensor's interval only grows as kernels
    join, so each join adds bytes over the positions its intervals gained."""

    def __init__(self, problem: Problem, names: list[str]):
        graph = problem.graph
        index = {name: i for i, name in enumerate(names)}
        self.n = len(names)
        self.output_bytes = np.array([graph.kernels[k].output_bytes for k in names], dtype=float)
        self.is_output = [k in graph.output_set for k in names]
        self.sources = [sorted({index[e.src] for e in graph.pred[k]}) for k in names]
        self.weights = [graph.kernels[k].weights for k in names]
        self.weight_size = graph.weights
        consumed: list[list[int]] = [[] for _ in names]
        for at, graph_input in enumerate(graph.inputs):
            for consumer in set(graph_input.consumers):
                consumed[index[consumer]].append(at)
        self.inputs_of = consumed
        self.input_bytes = [i.bytes for i in graph.inputs]
        self.total = sum(graph.weights.values()) + float(self.output_bytes.sum()) + sum(self.input_bytes)

    def furthest_fitting(self, order: np.ndarray, capacity: float) -> np.ndarray:
        """furthest[x] for x in 0..n: the largest y such that order[x:y] fits within ``capacity``
        (never below x: an empty stage always fits)."""
        n = self.n
        if capacity >= self.total:
            return np.full(n + 1, n)
        furthest = np.arange(n + 1)
        order = [int(k) for k in order]
        for x in range(n):
            furthest[x] = x + self._fitting_length(order[x:], capacity)
        return furthest

    def _fitting_length(self, rest: list[int], capacity: float) -> int:
        """How many kernels of ``rest``, from its start, fit together."""
        live = np.zeros(self.n)
        inside: set[int] = set()
        outputs: list[int] = []
        span: dict[object, list[int]] = {}  # tensor -> [first, last] position it is live over
        seen_weights: set[str] = set()
        weight_bytes = peak = 0.0
        low, high = self.n, -1

        def cover(tensor: object, first: int, last: int, size: float) -> float:
            """Grow ``tensor``'s interval to hold [first, last]; the peak over the positions it gained."""
            old = span.get(tensor)
            if old is None:
                span[tensor] = [first, last]
                live[first : last + 1] += size
                return float(live[first : last + 1].max())
            gained = 0.0
            if first < old[0]:
                live[first : old[0]] += size
                gained = float(live[first : old[0]].max())
            if last > old[1]:
                live[old[1] + 1 : last + 1] += size
                gained = max(gained, float(live[old[1] + 1 : last + 1].max()))
            old[0], old[1] = min(old[0], first), max(old[1], last)
            return gained

        for length, kernel in enumerate(rest):
            inside.add(kernel)
            low, high = min(low, kernel), max(high, kernel)
            for wid in self.weights[kernel]:
                if wid not in seen_weights:
                    seen_weights.add(wid)
                    weight_bytes += self.weight_size[wid]
            peak = max(peak, cover(kernel, kernel, kernel, self.output_bytes[kernel]))
            for src in self.sources[kernel]:
                first = src if src in inside else kernel
                peak = max(peak, cover(src, first, kernel, self.output_bytes[src]))
            for at in self.inputs_of[kernel]:
                peak = max(peak, cover(("input", at), kernel, kernel, self.input_bytes[at]))
            if self.is_output[kernel]:
                outputs.append(kernel)
            for member in outputs:  # model outputs stay live to the stage's last kernel
                if span[member][1] < high:
                    peak = max(peak, cover(member, member, high, self.output_bytes[member]))
            if weight_bytes + peak > capacity:
                return length
        return len(rest)
