"""Pipelines in ids and MIP pieces (MTPP of Archer et al., ICML 2024, with stages on devices that may
differ): the graph's tensors as price layers, what a block of kernels costs, and the exact MIP that
chooses the stages and their devices (y[v,b,c], u[b,c], T). The bounds and the pipeline MIP solver
build on these (docs/solvers.md#mtpp).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mip
import numpy as np

from ..errors import DivimlInputError
from ..plan import Plan
from ..problem import Problem
from ..tolerances import SOLVER_SLACK
from .deadline import Deadline
from .device_classes import identical_devices
from .mip_backend import new_model, optimized, prove_exactly, proven_bound


# ---------------------------------------------------------------------- segment costs
@dataclass(frozen=True)
class TensorLayers:
    """Tensor prices as indicator layers: layer l weighs ``weight[l]``, belongs to the producer
    ``producer[l]`` and counts where one of its consumers ``consumer[start[l]:start[l + 1]]`` does."""

    producer: np.ndarray  # (L,) kernel ids
    weight: np.ndarray  # (L,) seconds
    start: np.ndarray  # (L,) offsets into consumer
    consumer: np.ndarray  # (M,) kernel ids, grouped by layer
    layer: np.ndarray  # (M,) the layer of each consumer entry


def tensor_layers(producers: Sequence[int], consumers: Sequence[int], prices: Sequence[float]) -> TensorLayers:
    """Layers for (producer, consumer, price) reads: a producer's tensor costs its dearest read."""
    reads: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for producer, consumer, price in zip(producers, consumers, prices):
        reads[producer].append((consumer, price))
    owner, weight, start, members = [], [], [], []
    for producer, edges in reads.items():
        below = 0.0
        for level in sorted({price for _, price in edges if price > 0}):
            owner.append(producer)
            weight.append(level - below)
            start.append(len(members))
            members.extend(consumer for consumer, price in edges if price >= level)
            below = level
    sizes = np.diff(np.array(start + [len(members)], dtype=np.int64))
    return TensorLayers(
        np.array(owner, dtype=np.int64),
        np.array(weight, dtype=float),
        np.array(start, dtype=np.int64),
        np.array(members, dtype=np.int64),
        np.repeat(np.arange(len(start)), sizes),
    )


# ---------------------------------------------------------------------- the problem in ids
@dataclass(frozen=True)
class PipelineData:
    """The graph by kernel id (position in ``graph.topo_order``), with its tensor layers by bytes:
    layer l of ``producers[l]`` counts where one of ``consumers[l]`` does and spans the sizes
    (``below[l]``, ``level[l]``]."""

    names: list[str]
    edges: list[tuple[int, int]]
    producers: list[int]
    consumers: list[list[int]]
    level: np.ndarray
    below: np.ndarray
    input_consumers: list[list[int]]
    input_bytes: np.ndarray
    groups: list[list[int]]  # co-location groups

    @classmethod
    def of(cls, problem: Problem) -> PipelineData:
        graph = problem.graph
        names = list(graph.topo_order)
        index = {k: i for i, k in enumerate(names)}
        edges = [(index[e.src], index[e.dst]) for e in graph.edges]
        layers = tensor_layers([s for s, _ in edges], [d for _, d in edges], [e.bytes for e in graph.edges])
        ends = list(layers.start[1:]) + [len(layers.consumer)]
        consumers = [sorted(set(layers.consumer[a:b].tolist())) for a, b in zip(layers.start, ends)]
        producers = layers.producer.tolist()
        level, below = np.zeros(len(producers)), np.zeros(len(producers))
        for layer, producer in enumerate(producers):
            below[layer] = level[layer - 1] if layer and producers[layer - 1] == producer else 0.0
            level[layer] = below[layer] + layers.weight[layer]
        inputs = [i for i in graph.inputs if i.consumers]
        groups: dict[str, list[int]] = defaultdict(list)
        for name in names:
            if graph.kernels[name].colocate is not None:
                groups[graph.kernels[name].colocate].append(index[name])
        return cls(
            names,
            edges,
            producers,
            consumers,
            level,
            below,
            [sorted({index[c] for c in i.consumers}) for i in inputs],
            np.array([i.bytes for i in inputs], dtype=float),
            list(groups.values()),
        )

    @property
    def n(self) -> int:
        return len(self.names)

    def layer_prices(self, price_of_bytes) -> np.ndarray:
        """Per layer: g(level) - g(below) for a price g(bytes) that grows with the bytes (g(0) = 0)."""
        return np.array(
            [price_of_bytes(hi) - (price_of_bytes(lo) if lo > 0 else 0.0) for lo, hi in zip(self.below, self.level)],
            dtype=float,
        )


@dataclass(frozen=True)
class BlockPricing:
    """What one block charges, in seconds: ``work`` per kernel in it, ``out_price`` / ``in_price``
    per tensor layer that leaves / enters it, ``input_price`` per model input read in it.

    stage_serial prices every transfer on the stage; a caller may price blocks differently (in
    msr-fiddle's host_staged model a CPU block pays no transfers at all)."""

    work: np.ndarray
    out_price: np.ndarray
    in_price: np.ndarray
    input_price: np.ndarray


def candidate_devices(problem: Problem) -> list[str]:
    """Devices that may run at least one kernel: the only ones a non-empty stage can use."""
    able = {d for k in problem.graph.kernels for d in problem.feasible_devices(k)}
    return [d for d in problem.platform.device_names if d in able]


def link_prices(problem: Problem, devices: Sequence[str]) -> tuple[Callable[[float], float], bool]:
    """The cheapest link between two of ``devices`` as a price of bytes, and whether every such
    link prices every tensor of the graph alike (then it is *the* price). Kept in ``problem.memo``,
    each size priced once: the downset DPs of a pipeline's polish asked again for every window (10
    million link prices on 10,000 kernels of distinct sizes)."""
    key = ("link_prices", tuple(devices))
    if key not in problem.memo:
        pairs = [(a, b) for a in devices for b in devices if a != b]
        costs, priced = problem.costs, {}

        def cheapest(nbytes: float) -> float:
            if nbytes not in priced:
                priced[nbytes] = min((costs.transfer_s(nbytes, a, b) for a, b in pairs), default=0.0)
            return priced[nbytes]

        sizes = {e.bytes for e in problem.graph.edges}
        alike = all(len({costs.transfer_s(s, a, b) for a, b in pairs}) <= 1 for s in sizes)
        problem.memo[key] = cheapest, alike
    return problem.memo[key]


def cheapest_pricing(problem: Problem, data: PipelineData | None = None) -> BlockPricing:
    """Each kernel at its cheapest feasible device (compute plus output return), each transfer at
    the cheapest link, each model input at its cheapest way in: no stage of any plan costs less."""
    data = data or PipelineData.of(problem)
    costs, host = problem.costs, problem.platform.host
    work = np.array(
        [
            min(
                (
                    costs.compute_s(k, d) + problem.output_return_s(k, d, empty_pays_latency=True)
                    for d in problem.feasible_devices(k)
                ),
                default=math.inf,
            )
            for k in data.names
        ]
    )
    devices = candidate_devices(problem)
    transfer, _ = link_prices(problem, devices)
    tensors = data.layer_prices(transfer)
    inputs = np.array([min(costs.transfer_s(b, host, d) for d in devices) for b in data.input_bytes], dtype=float)
    return BlockPricing(work, tensors, tensors, inputs)


# ---------------------------------------------------------------------- model pieces
class BuildStopped(TimeoutError):
    """A model not built by its deadline: on 10,000 kernels python-mip takes 3 s per block's cost."""


class MipBuilder:
    """A python-mip model in scaled time units that remembers, for each indicator, the expressions
    it must cover, so that a warm start can set every variable (HiGHS takes 0 for the rest).
    ``build_by``: adding a block's cost, order or groups past it raises BuildStopped."""

    def __init__(self, name: str, backend: str, unit: float, build_by: Deadline | None = None):
        self.m = new_model(name, backend)
        self.unit = unit
        self.covers: list[tuple[mip.Var, list]] = []
        self.build_by = build_by or Deadline.never()

    def check_time(self) -> None:
        if self.build_by.passed():
            raise BuildStopped(f"the {self.m.name} MIP was not built within its time")

    def indicator(self, lower: list, upper: list = ()) -> mip.Var:
        """A variable in [0, 1] at least every expression of ``lower`` (at most every of ``upper``)."""
        var = self.m.add_var(lb=0.0, ub=1.0)
        for expr in lower:
            self.m += var >= expr
        for expr in upper:
            self.m += var <= expr
        self.covers.append((var, lower))
        return var

    def block_cost(self, x: Sequence, data: PipelineData, pricing: BlockPricing, exact: bool = False) -> mip.LinExpr:
        """The block's cost (scaled) for membership expressions ``x[v]``. ``exact``: indicators are
        bounded from above too, so that the cost is exact even where the objective would inflate it."""
        self.check_time()
        terms = [pricing.work[v] / self.unit * x[v] for v in range(data.n) if pricing.work[v]]
        for layer, (u, members) in enumerate(zip(data.producers, data.consumers)):
            if pricing.out_price[layer] > 0:
                leaves = self.indicator(
                    [x[u] - x[w] for w in members], [x[u], mip.xsum(1 - x[w] for w in members)] if exact else ()
                )
                terms.append(pricing.out_price[layer] / self.unit * leaves)
            if pricing.in_price[layer] > 0:
                enters = self.indicator(
                    [x[w] - x[u] for w in members], [1 - x[u], mip.xsum(x[w] for w in members)] if exact else ()
                )
                terms.append(pricing.in_price[layer] / self.unit * enters)
        for members, price in zip(data.input_consumers, pricing.input_price):
            if price > 0:
                read = self.indicator([x[w] for w in members], [mip.xsum(x[w] for w in members)] if exact else ())
                terms.append(price / self.unit * read)
        return mip.xsum(terms)

    def ordered(self, x: Sequence[Sequence], data: PipelineData) -> None:
        """Prefix-monotone along every edge: no edge runs back to an earlier block (x[b][v])."""
        for b in range(len(x) - 1):
            self.check_time()
            prefix = [mip.xsum(x[a][v] for a in range(b + 1)) for v in range(data.n)]
            for u, w in data.edges:
                self.m += prefix[u] >= prefix[w]

    def together(self, x: Sequence[Sequence], data: PipelineData) -> None:
        for group in data.groups:
            for member in group[1:]:
                for block in x:
                    self.m += block[member] == block[group[0]]

    def bound_s(self) -> float | None:
        """The solver's certified bound in seconds, less its tolerance (None before it has one)."""
        bound = proven_bound(self.m, self.unit)
        return None if bound is None else bound * (1 - SOLVER_SLACK)


def optimize(
    builder: MipBuilder, deadline: Deadline, seed: int, max_nodes: int | None = None
) -> mip.OptimizationStatus:
    """Solve ``builder``'s model on one thread to the exact-solve gaps, by ``deadline`` and, if
    given, within ``max_nodes`` branch-and-bound nodes: a node limit the clock does not reach gives
    the same bound on every run, however loaded the machine."""
    prove_exactly(builder.m, seed)
    seconds = max(deadline.left(), 0.01)
    if max_nodes is None:
        return optimized(builder.m, max_seconds=seconds)
    return optimized(builder.m, max_seconds=seconds, max_nodes=max_nodes)


def time_unit(pricing: BlockPricing) -> float:
    """Solver tolerances are absolute: count time in units of the mean kernel's work."""
    positive = pricing.work[pricing.work > 0]
    return float(positive.mean()) if len(positive) else 1.0


def stage_count(problem: Problem) -> int:
    """The stages a pipeline problem asks for (default: one per device), refused beyond the devices."""
    devices = len(problem.platform.devices)
    stages = problem.stages or devices
    if not 1 <= stages <= devices:
        raise DivimlInputError(
            f"{stages} stages need {stages} devices, platform '{problem.platform.name}' has {devices}",
            field="stages",
            hint=f"use --stages between 1 and {devices}, or a larger platform",
        )
    return stages


# ---------------------------------------------------------------------- the exact MIP
@dataclass(frozen=True)
class DeviceClass:
    """Identical devices (same work, feasibility, input and output prices, memory): one MIP choice."""

    devices: list[str]
    pricing: BlockPricing
    feasible: np.ndarray  # bool per kernel id
    memory_bytes: float


def stage_work(problem: Problem, names: Sequence[str], device: str) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel of ``names`` on ``device``: what a ``stage_serial`` stage pays for it besides
    transfers (compute plus its model output's return, an empty one at the link's latency; 0 where it
    may not run there), and whether it may run there. The whole graph's are kept in ``problem.memo``:
    a pipeline's polish asks for the kernels of every window it re-cuts."""
    key = ("stage_work", device)
    if "kernel_position" not in problem.memo:
        problem.memo["kernel_position"] = {k: v for v, k in enumerate(problem.graph.kernels)}
    if key not in problem.memo:
        kernels = list(problem.graph.kernels)
        feasible = np.array([device in problem.feasible_devices(k) for k in kernels], dtype=bool)
        work = np.array(
            [
                problem.costs.compute_s(k, device) + problem.output_return_s(k, device, empty_pays_latency=True)
                if feasible[v]
                else 0.0
                for v, k in enumerate(kernels)
            ]
        )
        problem.memo[key] = work, feasible
    (work, feasible), position = problem.memo[key], problem.memo["kernel_position"]
    at = np.array([position[k] for k in names], dtype=np.int64)
    return work[at], feasible[at]


def device_classes(problem: Problem, data: PipelineData, tensors: np.ndarray) -> list[DeviceClass]:
    """The candidate devices grouped into classes the pipeline MIP cannot tell apart."""
    costs, host = problem.costs, problem.platform.host

    def describe(device: str) -> tuple:
        work, feasible = stage_work(problem, data.names, device)
        inputs = np.array([costs.transfer_s(b, host, device) for b in data.input_bytes], dtype=float)
        capacity = problem.platform.device(device).memory_bytes
        return work, feasible, inputs, math.inf if capacity is None else float(capacity)

    return [
        DeviceClass(devices, BlockPricing(work, tensors, tensors, inputs), feasible, memory)
        for devices, (work, feasible, inputs, memory) in identical_devices(candidate_devices(problem), describe)
    ]


class PipelineModel:
    """The exact MIP (module docstring): y[v,b,c], u[b,c], indicators, T."""

    def __init__(
        self,
        problem: Problem,
        stages: int,
        backend: str,
        floor_s: float,
        ceiling_s: float | None,
        build_by: Deadline | None = None,
    ):
        self.problem = problem
        self.data = data = PipelineData.of(problem)
        devices = candidate_devices(problem)
        transfer, self.links_exact = link_prices(problem, devices)
        tensors = data.layer_prices(transfer)
        self.classes = classes = device_classes(problem, data, tensors)
        self.stages = stages
        unit = time_unit(cheapest_pricing(problem, data))
        self.builder = builder = MipBuilder("pipeline", backend, unit, build_by)
        m, unit = builder.m, builder.unit
        K, C = stages, range(len(classes))
        self.u = [[m.add_var(var_type=mip.BINARY) for _ in C] for _ in range(K)]
        self.y = [
            [{v: m.add_var(var_type=mip.BINARY) for v in range(data.n) if classes[c].feasible[v]} for c in C]
            for _ in range(K)
        ]
        x = [[mip.xsum(self.y[b][c][v] for c in C if v in self.y[b][c]) for v in range(data.n)] for b in range(K)]
        for v in range(data.n):
            m += mip.xsum(x[b][v] for b in range(K)) == 1
        for b in range(K):
            m += mip.xsum(self.u[b]) <= 1
            if b:  # used blocks first: an empty block costs nothing anywhere
                m += mip.xsum(self.u[b]) <= mip.xsum(self.u[b - 1])
            for c in C:
                for var in self.y[b][c].values():
                    m += var <= self.u[b][c]
        for c in C:
            m += mip.xsum(self.u[b][c] for b in range(K)) <= len(classes[c].devices)
        builder.ordered(x, data)
        builder.together(x, data)
        self.T = m.add_var(lb=floor_s / unit, ub=mip.INF if ceiling_s is None else max(ceiling_s, floor_s) / unit)
        self.cost = []
        transfers_only = BlockPricing(np.zeros(data.n), tensors, tensors, np.zeros(len(data.input_bytes)))
        for b in range(K):
            cost = builder.block_cost(x[b], data, transfers_only)
            for c in C:
                pricing, y = classes[c].pricing, self.y[b][c]
                cost += mip.xsum(pricing.work[v] / unit * var for v, var in y.items() if pricing.work[v])
                for members, price in zip(data.input_consumers, pricing.input_price):
                    readers = [y[w] for w in members if w in y]
                    if price > 0 and readers:
                        cost += price / unit * builder.indicator(readers)
                self._memory(b, c)
            m += cost <= self.T
            self.cost.append(cost)
        m.objective = mip.minimize(self.T)

    def _memory(self, b: int, c: int) -> None:
        """Each weight id once per block within the class's memory, where the class could overflow."""
        graph, capacity, y = self.problem.graph, self.classes[c].memory_bytes, self.y[b][c]
        if graph.weight_bytes(self.data.names[v] for v in y) <= capacity:
            return
        users: dict[str, list[mip.Var]] = defaultdict(list)
        for v, var in y.items():
            for weight in graph.kernels[self.data.names[v]].weights:
                users[weight].append(var)
        held = [graph.weights.get(w, 0.0) * self.builder.indicator(vars_) for w, vars_ in users.items()]
        self.builder.m += mip.xsum(held) <= capacity * self.u[b][c]

    def warm_start(self, plan: Plan) -> None:
        """Offer ``plan`` (stages on devices) as the incumbent: every variable set."""
        class_of = {d: c for c, cls in enumerate(self.classes) for d in cls.devices}
        index = {k: v for v, k in enumerate(self.data.names)}
        value: dict[mip.Var, float] = {}
        for b, (stage, device) in enumerate(zip(plan.stages, plan.stage_devices)):
            c = class_of[device]
            value[self.u[b][c]] = 1.0
            for kernel in stage:
                value[self.y[b][c][index[kernel]]] = 1.0

        def evaluate(expr) -> float:
            if isinstance(expr, mip.Var):
                return value.get(expr, 0.0)
            return expr.const + sum(coef * value.get(var, 0.0) for var, coef in expr.expr.items())

        for var, lower in self.builder.covers:
            value[var] = max([0.0, *(evaluate(e) for e in lower)])
        value[self.T] = max(self.T.lb, *(evaluate(cost) for cost in self.cost))
        self.builder.m.start = list(value.items())

    def plan(self) -> Plan:
        """The incumbent as a stage_serial plan: empty blocks dropped, each class's devices in turn."""
        free = {c: list(cls.devices) for c, cls in enumerate(self.classes)}
        stages, devices = [], []
        for b in range(self.stages):
            for c in range(len(self.classes)):
                kernels = [self.data.names[v] for v, var in self.y[b][c].items() if var.x >= 0.5]
                if kernels:
                    stages.append(kernels)
                    devices.append(free[c].pop(0))
        assignment = {k: d for stage, d in zip(stages, devices) for k in stage}
        return Plan(
            {k: assignment[k] for k in self.problem.graph.kernels},
            objective="pipeline",
            mode="stage_serial",
            stages=stages,
            stage_devices=devices,
        )
