"""SliceGraph: a pipeline of at most K stages found by slicing topological orders (Archer, Fahrbach,
Liu and Prabhu, ICML 2024), with stages on different devices.

Every valid pipeline is one topological order cut into contiguous segments, so ``slice_order``
solves one order exactly by a DP over cuts, each segment priced as the simulator's
``stage_serial`` mode charges it; ``StageCosts`` prices all segments of an order at once with
numpy (prefix sums and a 2-D difference array of tensor layers). ``SliceGraph`` searches orders and
stage devices with a biased random-key genetic algorithm seeded with program, depth-first and
breadth-first orders. On ``host_staged`` platforms the same DP solves the msr-fiddle max-load
problem (``throughput``). Segments that break memory, allowed devices or co-location cost infinity.

The DP, the pricing and the search: docs/solvers.md#slicegraph.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..bounds import lower_bound
from ..errors import DivimlInputError
from ..plan import Plan
from ..problem import Problem
from ..simulator import simulate
from ..tolerances import meets
from ..toolkit.constraints import activation_overflow
from ..toolkit.deadline import Deadline
from ..toolkit.device_classes import identical_devices
from ..toolkit.pipeline_model import TensorLayers, tensor_layers
from ..units import format_bytes
from .base import Solver

log = logging.getLogger(__name__)
# Slicings tried while activations overflow a memory: the last keeps room for all activations at once.
MEMORY_ATTEMPTS = 4


def _out_entries(pos: np.ndarray, producer_pos: np.ndarray, layers: TensorLayers):
    """(x, y, w) difference entries for [x <= a < y <= last consumer of the layer]."""
    last = np.maximum.reduceat(pos[layers.consumer], layers.start)
    after, w, zero = producer_pos + 1, layers.weight, np.zeros_like(producer_pos)
    return (
        np.concatenate([zero, after, zero, after]),
        np.concatenate([after, after, last + 1, last + 1]),
        np.concatenate([w, -w, -w, w]),
    )


def _in_entries(pos: np.ndarray, producer_pos: np.ndarray, layers: TensorLayers):
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


def _integrate(grid: np.ndarray, entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> np.ndarray:
    """grid[y, x] = sum of the weights of entries at (x' <= x, y' <= y): two cumulative sums."""
    size = len(grid)
    x, y, w = (np.concatenate(parts) for parts in zip(*entries))
    if y.max(initial=0) >= size:  # ends past the last segment (a virtual consumer at the end)
        keep = y < size
        x, y, w = x[keep], y[keep], w[keep]
    grid.fill(0.0)
    np.add.at(grid.reshape(-1), y * size + x, w)
    np.cumsum(grid, axis=1, out=grid)
    for row in range(1, size):  # numpy's cumsum down axis 0 is several times slower than this
        np.add(grid[row - 1], grid[row], out=grid[row])
    return grid


@dataclass(frozen=True)
class _Profile:
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

    def __init__(self, problem: Problem, reserve: dict[str, float] | None = None):
        """``reserve``: bytes kept free on a device for its activations (the DP counts weights only)."""
        graph, platform, costs = problem.graph, problem.platform, problem.costs
        reserve = reserve or {}
        self.problem = problem
        self.names = list(graph.topo_order)
        self.n = n = len(self.names)
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
        self.profiles = [_Profile(*description) for _, description in classes]
        self.profile_of = {device: index for index, (devices, _) in enumerate(classes) for device in devices}
        groups: dict[str, list[int]] = defaultdict(list)
        for name in self.names:
            if graph.kernels[name].colocate is not None:
                groups[graph.kernels[name].colocate].append(index[name])
        self.groups = list(groups.values())
        self._group_members = np.array([i for members in groups.values() for i in members], dtype=np.int64)
        self._group_start = np.cumsum([0] + [len(m) for m in groups.values()])[:-1]
        self._before_diagonal = np.triu(np.full((n + 1, n + 1), np.inf), k=1)  # grid[y, x] with x > y
        self._buffers: dict[object, np.ndarray] = {}

    def _buffer(self, key: object) -> np.ndarray:
        """A reused (n + 1) x (n + 1) array: fresh 8 MB arrays per order cost as much as the arithmetic."""
        if key not in self._buffers:
            self._buffers[key] = np.empty((self.n + 1, self.n + 1))
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
        self, pos: np.ndarray, leaving: TensorLayers, entering: TensorLayers, key: object = "transfers"
    ) -> np.ndarray:
        """grid[y, x]: the seconds of tensors (``leaving`` layers) leaving and (``entering`` layers)
        entering order[x:y] between stages, and inf where x > y (no segment). ``pos`` has one extra
        entry, n, for the virtual consumer past the end."""
        grid = self._buffer(key)
        entries = []
        if len(leaving.producer):
            entries.append(_out_entries(pos, pos[leaving.producer], leaving))
        if len(entering.producer):
            entries.append(_in_entries(pos, pos[entering.producer], entering))
        if entries:
            _integrate(grid, entries)
            grid += self._before_diagonal
        else:
            grid[:] = self._before_diagonal
        return grid

    def stage_grid(
        self, order: np.ndarray, pos: np.ndarray, profile_id: int, transfers: np.ndarray, forbidden_cuts: np.ndarray
    ) -> np.ndarray:
        """grid[y, x] = f(order[x:y]) on a device of profile ``profile_id`` (inf where x > y or not allowed)."""
        n, profile = self.n, self.profiles[profile_id]
        prefix = np.concatenate([[0.0], np.cumsum(profile.work[order])])
        grid = np.subtract(prefix[:, None], prefix[None, :], out=self._buffer(profile_id))
        grid += transfers
        # A model input enters every segment [x, y) that holds one of its consumers: with its
        # consumers c_1 < c_2 < ... in the order (c_0 = -1), the rectangles x in (c_{k-1}, c_k], y > c_k.
        for consumers, price in zip(self._input_consumers, profile.input_price):
            previous = -1
            for at in np.sort(pos[consumers]).tolist() if price else ():
                grid[at + 1 :, previous + 1 : at + 1] += price
                previous = at
        # The furthest end y of a segment starting at x: before the next kernel the device may not
        # run, and within its memory.
        bad = np.where(profile.infeasible[order], np.arange(n), n)
        furthest = np.append(np.minimum.accumulate(bad[::-1])[::-1], n)
        if math.isfinite(profile.memory_bytes):
            weights = np.concatenate([[0.0], np.cumsum(self.weight_bytes[order])])
            fits = np.searchsorted(weights, weights + profile.memory_bytes, side="right") - 1
            furthest = np.minimum(furthest, fits)
        if (furthest < n).any():
            grid[np.arange(n + 1)[:, None] > furthest[None, :]] = np.inf
        if forbidden_cuts.any():
            grid[forbidden_cuts, :] = np.inf
            grid[:, forbidden_cuts] = np.inf
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
    def slice(self, order: np.ndarray, stage_devices: Sequence[str]) -> tuple[float, list[int], bool]:
        """The exact DP over one order of kernel ids: (value, cuts, exact). Stage b is
        order[cuts[b]:cuts[b + 1]] on stage_devices[b] (maybe empty); value is inf when no slicing
        is feasible. ``exact``: the value is the simulator's; otherwise it is an upper bound."""
        n = self.n
        pos = np.empty(n + 1, dtype=np.int64)
        pos[order] = np.arange(n)
        pos[n] = n
        if self.host_staged:
            exact = True
        else:
            layers, exact = self.edge_layers(stage_devices)
            transfers = self.transfer_grid(pos, layers, layers)
        forbidden = self.forbidden_cuts(pos[:n])
        grids = {}
        for device in stage_devices:
            profile = self.profile_of[device]
            if profile not in grids:
                if self.host_staged:
                    transfers = self.transfer_grid(pos, *self.host_staged_layers(profile), key=("transfers", profile))
                grids[profile] = self.stage_grid(order, pos[:n], profile, transfers, forbidden)
        ends = np.arange(n + 1)
        best = np.full(n + 1, np.inf)
        best[0] = 0.0
        choice = np.empty((len(stage_devices), n + 1), dtype=np.int64)
        scratch = self._buffer("scratch")
        for b, device in enumerate(stage_devices):
            np.maximum(grids[self.profile_of[device]], best[None, :], out=scratch)
            choice[b] = scratch.argmin(axis=1)
            best = scratch[ends, choice[b]]
        cuts = [n]
        for b in reversed(range(len(stage_devices))):
            cuts.append(int(choice[b][cuts[-1]]))
        return float(best[n]), cuts[::-1], exact


def slice_order(problem: Problem, order: Sequence[str], stage_devices: Sequence[str]) -> tuple[float, list[int]]:
    """Cut one topological ``order`` (kernel names) into at most len(stage_devices) contiguous stages,
    stage b on ``stage_devices[b]``, minimising the slowest stage: (value, cuts), stage b being
    order[cuts[b]:cuts[b + 1]] (empty stages allowed). Exact when the links between the stage
    devices price alike; otherwise value is an upper bound on the simulated period."""
    graph = problem.graph
    unknown = [k for k in order if k not in graph.kernels]
    if unknown:
        raise DivimlInputError(f"order names unknown kernel '{unknown[0]}'", field="order")
    if len(order) != len(graph) or len(set(order)) != len(order):
        raise DivimlInputError("order must list every kernel of the graph exactly once", field="order")
    position = {k: i for i, k in enumerate(order)}
    backward = next((e for e in graph.edges if position[e.src] > position[e.dst]), None)
    if backward is not None:
        raise DivimlInputError(
            f"order puts '{backward.dst}' before its input '{backward.src}'",
            field="order",
            hint="give a topological order",
        )
    _check_stage_devices(problem, stage_devices)
    costs = StageCosts(problem)
    index = {k: i for i, k in enumerate(costs.names)}
    value, cuts, _ = costs.slice(np.array([index[k] for k in order], dtype=np.int64), stage_devices)
    return value, cuts


def _check_stage_devices(problem: Problem, stage_devices: Sequence[str]) -> None:
    if not stage_devices:
        raise DivimlInputError("a pipeline needs at least one stage device", field="stage_devices")
    for device in stage_devices:
        problem.platform.device(device)
    if len(set(stage_devices)) != len(stage_devices):
        raise DivimlInputError(
            f"stage devices repeat: {', '.join(stage_devices)}",
            field="stage_devices",
            hint="each stage runs on a device of its own",
        )


def pipeline_plan(problem: Problem, order: Sequence[str], stage_devices: Sequence[str], cuts: Sequence[int]) -> Plan:
    """The Plan of a sliced order in the problem's mode (``stage_serial`` for pipelines, ``host_staged``
    for throughput on a host_staged platform); empty stages are dropped."""
    kept = [b for b in range(len(stage_devices)) if cuts[b] < cuts[b + 1]]
    stages = [list(order[cuts[b] : cuts[b + 1]]) for b in kept]
    devices = [stage_devices[b] for b in kept]
    assignment = {kernel: device for stage, device in zip(stages, devices) for kernel in stage}
    return Plan(
        {k: assignment[k] for k in problem.graph.kernels},
        objective=problem.objective,
        mode=problem.mode,
        stages=stages,
        stage_devices=devices,
    )


# ---------------------------------------------------------------------- orders
def order_by_keys(
    successors: list[list[int]], indegree: list[int], keys: Sequence[float], groups: Sequence[Sequence[int]] = ()
) -> list[int]:
    """Kahn's topological sort that always takes the ready kernel of smallest key.

    Co-location ``groups`` are kept together where the graph allows, since no cut may fall inside a
    group's span: a grouped kernel without inputs (a weight, in the msr-fiddle operator graphs) is
    placed right before its first consumer instead of whenever its key says, and once one kernel
    of a group is placed, its group-mates go next as soon as they are ready."""
    n = len(indegree)
    remaining = list(indegree)
    group_of = [-1] * n
    for index, members in enumerate(groups):
        if len(members) > 1:
            for v in members:
                group_of[v] = index
    deferred_before: dict[int, list[int]] = defaultdict(list)  # consumer -> its deferred inputs
    deferred = [group_of[v] >= 0 and indegree[v] == 0 and bool(successors[v]) for v in range(n)]
    for v in range(n):
        if deferred[v]:
            for w in successors[v]:
                remaining[w] -= 1
                deferred_before[w].append(v)
    started = [False] * len(groups)
    placed = [False] * n
    ready = [(keys[v], v) for v in range(n) if remaining[v] == 0 and not deferred[v]]
    heapq.heapify(ready)
    order = []

    def place(v: int) -> None:
        placed[v] = True
        order.append(v)
        for w in () if deferred[v] else successors[v]:  # a deferred input was counted at the start
            remaining[w] -= 1
            if remaining[w] == 0:
                heapq.heappush(ready, (-1.0 if group_of[w] >= 0 and started[group_of[w]] else keys[w], w))
        group = group_of[v]
        if group >= 0 and not started[group]:
            started[group] = True
            for mate in groups[group]:
                if not placed[mate] and not deferred[mate] and remaining[mate] == 0:
                    heapq.heappush(ready, (-1.0, mate))

    while ready:
        _, v = heapq.heappop(ready)
        if placed[v]:
            continue  # pushed again when its group started
        for u in sorted(deferred_before.get(v, ()), key=lambda u: keys[u]):
            if not placed[u]:
                place(u)
        place(v)
    return order


def traversal_order(successors: list[list[int]], indegree: list[int], depth_first: bool) -> list[int]:
    """Kahn's sort with a stack (depth-first: follow one branch down) or a queue (breadth-first)."""
    remaining = list(indegree)
    ready = deque(v for v in range(len(remaining)) if remaining[v] == 0)
    order = []
    while ready:
        v = ready.pop() if depth_first else ready.popleft()
        order.append(v)
        for w in reversed(successors[v]) if depth_first else successors[v]:
            remaining[w] -= 1
            if remaining[w] == 0:
                ready.append(w)
    return order


# ---------------------------------------------------------------------- the solver
def _all_activation_bytes(graph) -> float:
    """Every tensor of the model live at once: more than any device's activation peak can be."""
    return sum(k.output_bytes for k in graph.kernels.values()) + sum(i.bytes for i in graph.inputs)


@dataclass
class _Decoded:
    value: float
    order: list[int]
    stage_devices: list[str]
    cuts: list[int]
    exact: bool


class SliceGraph(Solver):
    """BRKGA over topological orders and device orders, each decoded by the exact slicing DP.

    Options: ``population`` chromosomes, the best ``elite_fraction`` kept, ``mutant_fraction`` new
    random ones per generation, the rest children that take each key from their elite parent with
    probability ``inheritance_bias``; it stops after ``stall_generations`` generations without a
    better plan, at most ``generations`` generations, within ``time_limit_s`` seconds, or at the
    lower bound. Deterministic for a seed as long as the time limit does not cut the search short
    (``plan.attrs["stopped"]`` says what ended it).
    """

    name = "slicegraph"
    objectives = ("pipeline", "throughput")  # throughput only on host_staged platforms
    modes = ("stage_serial", "host_staged")

    def __init__(
        self,
        *,
        time_limit_s: float = 60.0,
        seed: int = 0,
        population: int = 48,
        elite_fraction: float = 0.2,
        mutant_fraction: float = 0.15,
        inheritance_bias: float = 0.7,
        generations: int = 300,
        stall_generations: int = 40,
    ):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        if population < 3:
            raise DivimlInputError("population must be at least 3", field="population")
        if not 0 < elite_fraction < 1 or not 0 <= mutant_fraction < 1 or elite_fraction + mutant_fraction >= 1:
            raise DivimlInputError(
                "need 0 < elite_fraction, 0 <= mutant_fraction and elite_fraction + mutant_fraction < 1",
                field="elite_fraction",
                hint="for example 0.2 and 0.15, so that some children are bred",
            )
        if not 0.5 <= inheritance_bias <= 1:
            raise DivimlInputError(
                "inheritance_bias must lie in [0.5, 1]",
                field="inheritance_bias",
                hint="the chance that a child takes a key from its elite parent",
            )
        if generations < 0 or stall_generations < 1:
            raise DivimlInputError(
                "generations cannot be negative and stall_generations must be at least 1", field="generations"
            )
        self.population = population
        self.elites = max(1, round(elite_fraction * population))
        self.mutants = min(population - self.elites - 1, round(mutant_fraction * population))
        self.inheritance_bias = inheritance_bias
        self.generations, self.stall_generations = generations, stall_generations

    def place(self, problem: Problem, deadline: Deadline) -> Plan:
        platform = problem.platform
        stages = (problem.stages if problem.objective == "pipeline" else None) or len(platform.devices)
        bound = lower_bound(problem)
        reserve: dict[str, float] = {}
        for attempt in range(MEMORY_ATTEMPTS):
            costs = StageCosts(problem, reserve)
            # a retry (activations overflowed a memory) searches for half the limit again, within the deadline
            search_until = deadline if attempt == 0 else deadline.within(self.time_limit_s / 2)
            best, searched = self._search(costs, problem, stages, bound, search_until.at)
            if not math.isfinite(best.value):
                raise DivimlInputError(
                    "no slicing into stages lets every kernel run within its device's memory "
                    "and keeps co-location groups together" + (" (with room for the activations)" if reserve else ""),
                    field="stages",
                    hint="allow more devices, or use devices with more memory",
                )
            order = [costs.names[i] for i in best.order]
            plan = pipeline_plan(problem, order, best.stage_devices, best.cuts)
            sim = simulate(problem, plan)
            overflow = activation_overflow(problem, plan, sim)
            if not overflow:
                break
            # weights fit (the DP checked them): the activations took the rest; keep room for them and
            # slice again, at the last try room for every activation of the model at once
            for device, peak in overflow.items():
                reserve[device] = (
                    max(reserve.get(device, 0.0), peak)
                    if attempt < MEMORY_ATTEMPTS - 2
                    else _all_activation_bytes(problem.graph)
                )
                log.info(
                    "slicegraph: activations on '%s' need %s beyond its weights; slicing again",
                    device,
                    format_bytes(peak),
                )
        plan.solver, plan.value_s = self.name, sim.value_s
        plan.optimal = sim.feasible and meets(sim.value_s, bound)
        plan.attrs.update(
            {
                "dp_value_s": best.value,
                "dp_exact": best.exact,
                **searched,
                "population": self.population,
                "memory_attempts": attempt + 1,
            }
        )
        log.info(
            "slicegraph: %d stages, period %.6g s (bound %.6g s), %d generations, %d decodes in %.2f s (%s)",
            len(plan.stages),
            sim.value_s,
            bound,
            searched["generations"],
            searched["decodes"],
            searched["stopped"],
        )
        return plan

    def _search(
        self, costs: StageCosts, problem: Problem, stages: int, bound: float, deadline: float
    ) -> tuple[_Decoded, dict]:
        """The BRKGA until ``deadline`` (perf_counter seconds): the best decoded chromosome, and how
        the search went (generations, decodes, what stopped it)."""
        rng = np.random.default_rng(self.seed)
        decodes = 0
        best: _Decoded | None = None

        def decode(keys: np.ndarray) -> float:
            nonlocal decodes, best
            decodes += 1
            order = order_by_keys(costs.successors, costs.indegree, keys[: costs.n].tolist(), costs.groups)
            devices = [costs.devices[d] for d in np.argsort(keys[costs.n :], kind="stable")[:stages]]
            value, cuts, exact = costs.slice(np.array(order, dtype=np.int64), devices)
            if best is None or value < best.value:
                best = _Decoded(value, order, devices, cuts, exact)
            return value

        def out_of_time() -> bool:
            return time.perf_counter() > deadline

        population = self._first_population(costs, problem, stages, rng)
        fitness = np.array([decode(keys) for keys in population])
        stopped, generation = "generations", 0
        improved_at, best_so_far = 0, best.value
        while generation < self.generations:
            if best.value < best_so_far:
                improved_at, best_so_far = generation, best.value
            if meets(best.value, bound):
                stopped = "lower_bound"
                break
            if generation - improved_at >= self.stall_generations:
                stopped = "stalled"
                break
            if out_of_time():
                stopped = "time_limit"
                break
            ranked = np.argsort(fitness, kind="stable")
            population, fitness = population[ranked], fitness[ranked]
            children = self.population - self.elites - self.mutants
            elite = population[rng.integers(self.elites, size=children)]
            other = population[self.elites + rng.integers(self.population - self.elites, size=children)]
            inherit = rng.random(elite.shape) < self.inheritance_bias
            newcomers = np.vstack([np.where(inherit, elite, other), rng.random((self.mutants, population.shape[1]))])
            scores = []
            for keys in newcomers:
                if out_of_time():
                    break
                scores.append(decode(keys))
            population = np.vstack([population[: self.elites], newcomers[: len(scores)]])
            fitness = np.concatenate([fitness[: self.elites], scores])
            generation += 1
        return best, {"generations": generation, "decodes": decodes, "stopped": stopped}

    def _first_population(
        self, costs: StageCosts, problem: Problem, stages: int, rng: np.random.Generator
    ) -> np.ndarray:
        """Seeds (program, depth-first, breadth-first orders x three device orders), then random keys."""
        n, devices = costs.n, costs.devices
        orders = [
            list(range(n)),
            traversal_order(costs.successors, costs.indegree, True),
            traversal_order(costs.successors, costs.indegree, False),
        ]
        speed = [
            (
                int(costs.profiles[costs.profile_of[d]].infeasible.sum()),
                float(costs.profiles[costs.profile_of[d]].work.sum()),
                i,
            )
            for i, d in enumerate(devices)
        ]
        fastest = [i for *_, i in sorted(speed)]
        host = devices.index(problem.platform.host)
        others = [i for i in fastest if i != host]
        device_orders = list(
            dict.fromkeys(
                tuple(o) for o in (fastest, [host] + others, others[: stages - 1] + [host] + others[stages - 1 :])
            )
        )
        seeds = []
        for order in orders:
            for device_order in device_orders:
                keys = np.empty(n + len(devices))
                keys[order] = np.arange(n) / max(n, 1)
                keys[n + np.array(device_order)] = np.arange(len(devices)) / len(devices)
                seeds.append(keys)
        seeds = seeds[: self.population]
        return np.vstack(seeds + [rng.random((self.population - len(seeds), n + len(devices)))])
