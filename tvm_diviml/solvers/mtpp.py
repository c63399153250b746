"""MTPP: the exact k-stage pipeline MIP and its MIP lower bounds (Archer, Fahrbach, Liu and Prabhu,
ICML 2024; DESIGN.md "MTPP"), extended to stages on different devices.

Stages (blocks) b = 1..K are ordered and run on distinct devices; a stage costs what the simulator's
``stage_serial`` mode charges (work on its device, each tensor entering it once, each tensor leaving
it once, model inputs from the host, model outputs back to it); the period is the dearest stage.

**Tensor layers.** A tensor costs its dearest edge, and a maximum is a sum of indicator layers: with
the producer's distinct edge sizes s_1 < ... < s_r and a price g(bytes) that grows with the bytes,
max = sum_l (g(s_l) - g(s_{l-1})) [an edge of size >= s_l counts]. Layer l of producer u has the
consumer set C_l; it *leaves* block b when u is in b and some w in C_l is not, and *enters* b when
some w in C_l is in b and u is not (w is then in a later block). One layer structure serves every
price g, so the price of a layer per block is a parameter (``BlockPricing``).

**The exact MIP** (``solve_pipeline_mip``): y[v,b,c] = 1 when kernel v is in block b and block b runs
on a device of class c (identical devices form one class, which removes their symmetry);
u[b,c] = 1 when block b runs on class c; x[v,b] = sum_c y[v,b,c]. Constraints: each kernel in one
block, y <= u, each block on at most one class, at most as many blocks on a class as it has devices,
used blocks first; prefix-monotone along edges (sum_{b' <= b} x[u,b'] >= sum_{b' <= b} x[w,b'] for an
edge u -> w); out/in indicators per layer and block (o >= x[u,b] - x[w,b], i >= x[w,b] - x[u,b]);
model inputs per block and class; weights per block within the device's memory (each weight id
once); co-location groups share blocks. Stage cost = sum p[v,c] y[v,b,c] (p: compute plus the
return of model outputs) + layer prices * indicators + input prices <= T; minimise T.
Transfers between stages are priced exactly when every link between candidate devices prices each
size alike (every preset); otherwise at the cheapest such link, so that the MIP is a relaxation: its
``objective_bound`` still bounds the optimum, its plan is re-scored by the simulator, and optimality
is claimed only when the simulator agrees with the MIP's value. Activations are not modelled (a
relaxation too); the simulator reports a plan whose activations overflow.

**Lower bounds** (``pipeline_bounds``), on the *relaxed* problem in which every kernel costs its
cheapest feasible device and every transfer its cheapest link (no plan costs less there, so every
bound of the relaxed problem bounds the real one); f below is the relaxed stage cost, which is
subadditive (merged blocks pay no more than the blocks apart):

- ``average_load`` and ``largest_kernel`` (LB0): work(V) / K and the dearest kernel (with the model
  inputs it reads);
- ``three_superblock``: for a position i, blocks 1..i-1, i and i+1..K merged into superblocks
  A | B | C with f(A) <= (i-1) T, f(B) <= T, f(C) <= (K-i) T; any plan of period T merges into one,
  so each i gives a bound and so does their maximum (any subset of positions is valid);
- ``guess_bottleneck``: the same superblocks, but B *is* the bottleneck, f(B) priced exactly:
  minimise f(B) s.t. f(A) <= (i-1) f(B), f(C) <= (K-i) f(B). Only plans whose bottleneck is block i
  merge into MIP i, so only the minimum over *all* i is valid (chain 1, 1, 10 with K = 2: i = 1 gives
  12, the optimum is 10);
- ``exact_mip``: the exact MIP's ``objective_bound``.

Each MIP may assume what is already proven (T >= a known bound), which lets it stop sooner: the
superblock MIPs only bounds of the relaxed problem (the best relaxed plan's bottleneck is at least
those), the exact MIP any bound. From every time-limited MIP only ``objective_bound`` is taken, less
a relative slack of 1e-6 for the solver's tolerances.
"""
from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

import mip
import numpy as np

from ..errors import DivimlInputError
from ..plan import Plan
from ..simulator import simulate
from .base import Problem
from .milp import check_backend, new_model
from .slicegraph import tensor_layers

log = logging.getLogger(__name__)

SLACK = 1e-6          # relative: what a solver's feasibility tolerance may take off a MIP's bound
AGREE = 1e-5          # relative: a simulated value this close to the MIP's optimum is that optimum


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
    groups: list[list[int]]                 # co-location groups

    @classmethod
    def of(cls, problem: Problem) -> "PipelineData":
        graph = problem.graph
        names = list(graph.topo_order)
        index = {k: i for i, k in enumerate(names)}
        edges = [(index[e.src], index[e.dst]) for e in graph.edges]
        layers = tensor_layers([s for s, _ in edges], [d for _, d in edges], [e.bytes for e in graph.edges])
        ends = list(layers.start[1:]) + [len(layers.consumer)]
        consumers = [sorted(set(layers.consumer[a:b].tolist())) for a, b in zip(layers.start, ends)]
        producers = layers.producer.tolist()
        level, below = np.zeros(len(producers)), np.zeros(len(producers))
        for l, producer in enumerate(producers):
            below[l] = level[l - 1] if l and producers[l - 1] == producer else 0.0
            level[l] = below[l] + layers.weight[l]
        inputs = [i for i in graph.inputs if i.consumers]
        groups: dict[str, list[int]] = defaultdict(list)
        for name in names:
            if graph.kernels[name].colocate is not None:
                groups[graph.kernels[name].colocate].append(index[name])
        return cls(names, edges, producers, consumers, level, below,
                   [sorted({index[c] for c in i.consumers}) for i in inputs],
                   np.array([i.bytes for i in inputs], dtype=float), list(groups.values()))

    @property
    def n(self) -> int:
        return len(self.names)

    def layer_prices(self, price_of_bytes) -> np.ndarray:
        """Per layer: g(level) - g(below) for a price g(bytes) that grows with the bytes (g(0) = 0)."""
        return np.array([price_of_bytes(hi) - (price_of_bytes(lo) if lo > 0 else 0.0)
                         for lo, hi in zip(self.below, self.level)], dtype=float)


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
    link prices every tensor of the graph alike (then it is *the* price)."""
    pairs = [(a, b) for a in devices for b in devices if a != b]
    costs = problem.costs

    def cheapest(nbytes: float) -> float:
        return min((costs.transfer_s(nbytes, a, b) for a, b in pairs), default=0.0)

    sizes = {e.bytes for e in problem.graph.edges}
    alike = all(len({costs.transfer_s(s, a, b) for a, b in pairs}) <= 1 for s in sizes)
    return cheapest, alike


def _return_s(problem: Problem, kernel: str, device: str) -> float:
    """A model output goes back to the host from the stage that makes it."""
    graph = problem.graph
    if kernel not in graph.output_set:
        return 0.0
    return problem.costs.transfer_s(graph.kernels[kernel].output_bytes, device, problem.platform.host)


def cheapest_pricing(problem: Problem, data: PipelineData | None = None) -> BlockPricing:
    """Each kernel at its cheapest feasible device (compute plus output return), each transfer at
    the cheapest link, each model input at its cheapest way in: no stage of any plan costs less."""
    data = data or PipelineData.of(problem)
    costs, host = problem.costs, problem.platform.host
    work = np.array([min((costs.compute_s(k, d) + _return_s(problem, k, d) for d in problem.feasible_devices(k)),
                         default=math.inf) for k in data.names])
    devices = candidate_devices(problem)
    transfer, _ = link_prices(problem, devices)
    tensors = data.layer_prices(transfer)
    inputs = np.array([min(costs.transfer_s(b, host, d) for d in devices) for b in data.input_bytes], dtype=float)
    return BlockPricing(work, tensors, tensors, inputs)


# ---------------------------------------------------------------------- model pieces
class _Builder:
    """A python-mip model in scaled time units that remembers, for each indicator, the expressions
    it must cover, so that a warm start can set every variable (HiGHS takes 0 for the rest)."""

    def __init__(self, name: str, backend: str, unit: float):
        self.m = new_model(name, backend)
        self.unit = unit
        self.covers: list[tuple[mip.Var, list]] = []

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
        terms = [pricing.work[v] / self.unit * x[v] for v in range(data.n) if pricing.work[v]]
        for l, (u, members) in enumerate(zip(data.producers, data.consumers)):
            if pricing.out_price[l] > 0:
                leaves = self.indicator([x[u] - x[w] for w in members],
                                        [x[u], mip.xsum(1 - x[w] for w in members)] if exact else ())
                terms.append(pricing.out_price[l] / self.unit * leaves)
            if pricing.in_price[l] > 0:
                enters = self.indicator([x[w] - x[u] for w in members],
                                        [1 - x[u], mip.xsum(x[w] for w in members)] if exact else ())
                terms.append(pricing.in_price[l] / self.unit * enters)
        for members, price in zip(data.input_consumers, pricing.input_price):
            if price > 0:
                read = self.indicator([x[w] for w in members], [mip.xsum(x[w] for w in members)] if exact else ())
                terms.append(price / self.unit * read)
        return mip.xsum(terms)

    def ordered(self, x: Sequence[Sequence], data: PipelineData) -> None:
        """Prefix-monotone along every edge: no edge runs back to an earlier block (x[b][v])."""
        for b in range(len(x) - 1):
            prefix = [mip.xsum(x[a][v] for a in range(b + 1)) for v in range(data.n)]
            for u, w in data.edges:
                self.m += prefix[u] >= prefix[w]

    def together(self, x: Sequence[Sequence], data: PipelineData) -> None:
        for group in data.groups:
            for member in group[1:]:
                for block in x:
                    self.m += block[member] == block[group[0]]

    def bound_s(self) -> float | None:
        bound = self.m.objective_bound
        if bound is None or not math.isfinite(bound):
            return None
        return max(bound, 0.0) * self.unit * (1 - SLACK)


def _optimize(builder: _Builder, time_limit_s: float, seed: int) -> mip.OptimizationStatus:
    m = builder.m
    m.seed, m.threads, m.max_mip_gap, m.max_mip_gap_abs = seed, 1, 1e-9, 1e-12
    return m.optimize(max_seconds=max(time_limit_s, 0.01))


def _unit(pricing: BlockPricing) -> float:
    """Solver tolerances are absolute: count time in units of the mean kernel's work."""
    positive = pricing.work[pricing.work > 0]
    return float(positive.mean()) if len(positive) else 1.0


# ---------------------------------------------------------------------- superblock bounds
def superblock_bound(data: PipelineData, pricings: Sequence[BlockPricing], capacities: tuple[float, float], *,
                     guess: bool, time_limit_s: float, floor_s: float = 0.0, backend: str = "highs",
                     seed: int = 0) -> float | None:
    """One superblock MIP, A | B | C priced by ``pricings``, capacities (a, c) = (i - 1, K - i).

    ``guess=False`` (three-superblock): min T s.t. f(A) <= a T, f(B) <= T, f(C) <= c T.
    ``guess=True`` (B is the bottleneck): min f(B) s.t. f(A) <= a f(B), f(C) <= c f(B), f(B) exact.
    ``floor_s``: a lower bound on the optimum *of the priced problem* (the bottleneck of its best
    plan is at least that), which the MIP may assume. Returns the MIP's certified bound in seconds:
    None when the solver certified none, inf when it proved that no plan fits."""
    check_backend(backend)
    builder = _Builder("superblocks", backend, _unit(pricings[1]))
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
    if _optimize(builder, time_limit_s, seed) == mip.OptimizationStatus.INFEASIBLE:
        return math.inf
    return builder.bound_s()


def pipeline_bounds(problem: Problem, time_limit_s: float = 0.0, *, backend: str = "highs", seed: int = 0,
                    superblock_positions: int = 16, exact_mip: bool = True) -> dict[str, float]:
    """Named lower bounds on the best ``stage_serial`` period with at most ``problem.stages`` stages.

    With ``time_limit_s`` = 0 only the combinatorial ones (LB0); otherwise also the MIP bounds, in
    this order, each MIP with a share of the time still left: three_superblock (at most
    ``superblock_positions`` positions, spread evenly), guess_bottleneck (all K positions) and, if
    ``exact_mip``, the exact MIP's bound. Each MIP may assume the bounds found before it: the
    superblock MIPs only those of the cheapest-priced problem itself (average_load, the dearest
    kernel at its cheapest, three_superblock), the exact MIP every one."""
    began = time.perf_counter()
    data = PipelineData.of(problem)
    devices = len(problem.platform.devices)
    stages = min(problem.stages or devices, devices)
    cheap = cheapest_pricing(problem, data)
    parts = _combinatorial_bounds(problem, data, cheap, stages)
    if time_limit_s <= 0 or not parts or not math.isfinite(parts["largest_kernel"]):
        return parts
    # Middle positions first: they tend to give the best bound, which the later MIPs may then assume.
    step = max(1, math.ceil(stages / superblock_positions))
    positions = sorted(set(range(1, stages + 1, step)) | {stages}, key=lambda i: (abs(2 * i - stages - 1), i))
    # (name, position, weight): time shares in proportion to the weights, the guesses (which add to
    # the three-superblock bound only when every one of them does) weighing least.
    runs = [("three_superblock", i, 4.0) for i in positions] + [("guess_bottleneck", i, 1.0)
                                                                for i in range(1, stages + 1)]
    runs += [("exact_mip", 0, float(len(positions)))] * exact_mip
    relaxed = max(parts["average_load"], float(cheap.work.max()), parts["neighbourhood"])
    found: dict[str, list[float]] = defaultdict(list)
    spent: dict[str, float] = defaultdict(float)
    for done, (name, i, weight) in enumerate(runs):
        relaxed = max([relaxed, *found["three_superblock"]])
        mark = time.perf_counter()
        share = (time_limit_s - (mark - began)) * weight / sum(w for *_, w in runs[done:])
        if name == "exact_mip":
            known = [*parts.values(), relaxed, min(found["guess_bottleneck"])]
            model = _PipelineModel(problem, stages, backend, max(b for b in known if math.isfinite(b)), None)
            _optimize(model.builder, share, seed)
            bound = model.builder.bound_s()
        else:
            bound = superblock_bound(data, [cheap] * 3, (i - 1, stages - i), guess=name == "guess_bottleneck",
                                     time_limit_s=share, floor_s=relaxed, backend=backend, seed=seed)
        if name == "guess_bottleneck":       # valid only as the minimum over every i: a gap keeps the floor
            found[name].append(relaxed if bound is None else max(bound, relaxed))
        elif bound is not None and math.isfinite(bound):
            found[name].append(bound)
        spent[name] += time.perf_counter() - mark
    if found["guess_bottleneck"] and math.isfinite(min(found["guess_bottleneck"])):
        parts["guess_bottleneck"] = min(found["guess_bottleneck"])
    for name in ("three_superblock", "exact_mip"):
        if found[name]:
            parts[name] = max(found[name])
    log.info("pipeline bounds in %.2f s: %s", time.perf_counter() - began,
             ", ".join(f"{k} {v:.6g}" + (f" ({spent[k]:.2f} s)" if k in spent else "") for k, v in parts.items()))
    return parts


def _combinatorial_bounds(problem: Problem, data: PipelineData, cheap: BlockPricing, stages: int) -> dict[str, float]:
    """LB0: the work at its cheapest over the stages, and the dearest kernel with the model inputs it
    reads, each on its cheapest device (inf where a kernel can run nowhere)."""
    if not data.n:
        return {}
    host, costs = problem.platform.host, problem.costs
    reads = [[b for b, members in zip(data.input_bytes, data.input_consumers) if v in members] for v in range(data.n)]
    alone = [min((costs.compute_s(k, d) + _return_s(problem, k, d) + sum(costs.transfer_s(b, host, d) for b in reads[v])
                  for d in problem.feasible_devices(k)), default=math.inf) for v, k in enumerate(data.names)]
    return {"average_load": float(cheap.work.sum()) / stages, "largest_kernel": max(alone),
            "neighbourhood": neighbourhood_bound(data, cheap)}


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


def _stage_count(problem: Problem) -> int:
    devices = len(problem.platform.devices)
    stages = problem.stages or devices
    if not 1 <= stages <= devices:
        raise DivimlInputError(f"{stages} stages need {stages} devices, platform '{problem.platform.name}' has "
                               f"{devices}", field="stages",
                               hint=f"use --stages between 1 and {devices}, or a larger platform")
    return stages


# ---------------------------------------------------------------------- the exact MIP
@dataclass(frozen=True)
class _DeviceClass:
    """Identical devices (same work, feasibility, input and output prices, memory): one MIP choice."""

    devices: list[str]
    pricing: BlockPricing
    feasible: np.ndarray          # bool per kernel id
    memory_bytes: float


def _device_classes(problem: Problem, data: PipelineData, tensors: np.ndarray) -> list[_DeviceClass]:
    costs, host = problem.costs, problem.platform.host
    feasible_on = {k: set(problem.feasible_devices(k)) for k in data.names}
    found: dict[tuple, _DeviceClass] = {}
    for device in candidate_devices(problem):
        feasible = np.array([device in feasible_on[k] for k in data.names])
        work = np.array([costs.compute_s(k, device) + _return_s(problem, k, device) if feasible[v] else 0.0
                         for v, k in enumerate(data.names)])
        inputs = np.array([costs.transfer_s(b, host, device) for b in data.input_bytes], dtype=float)
        capacity = problem.platform.device(device).memory_bytes
        memory = math.inf if capacity is None else float(capacity)
        key = (work.tobytes(), feasible.tobytes(), inputs.tobytes(), memory)
        if key in found:
            found[key].devices.append(device)
        else:
            found[key] = _DeviceClass([device], BlockPricing(work, tensors, tensors, inputs), feasible, memory)
    return list(found.values())


class _PipelineModel:
    """The exact MIP (module docstring): y[v,b,c], u[b,c], indicators, T."""

    def __init__(self, problem: Problem, stages: int, backend: str, floor_s: float, ceiling_s: float | None):
        self.problem = problem
        self.data = data = PipelineData.of(problem)
        devices = candidate_devices(problem)
        transfer, self.links_exact = link_prices(problem, devices)
        tensors = data.layer_prices(transfer)
        self.classes = classes = _device_classes(problem, data, tensors)
        self.stages = stages
        self.builder = builder = _Builder("pipeline", backend, _unit(cheapest_pricing(problem, data)))
        m, unit = builder.m, builder.unit
        K, C = stages, range(len(classes))
        self.u = [[m.add_var(var_type=mip.BINARY) for _ in C] for _ in range(K)]
        self.y = [[{v: m.add_var(var_type=mip.BINARY) for v in range(data.n) if classes[c].feasible[v]} for c in C]
                  for _ in range(K)]
        x = [[mip.xsum(self.y[b][c][v] for c in C if v in self.y[b][c]) for v in range(data.n)] for b in range(K)]
        for v in range(data.n):
            m += mip.xsum(x[b][v] for b in range(K)) == 1
        for b in range(K):
            m += mip.xsum(self.u[b]) <= 1
            if b:                                   # used blocks first: an empty block costs nothing anywhere
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
        return Plan({k: assignment[k] for k in self.problem.graph.kernels}, objective="pipeline",
                    mode="stage_serial", stages=stages, stage_devices=devices)


def solve_pipeline_mip(problem: Problem, *, time_limit_s: float, backend: str = "highs", seed: int = 0,
                       warm_start: Plan | None = None, floor_s: float = 0.0) -> Plan:
    """The exact MTPP MIP with stage devices chosen too; a Plan in mode ``stage_serial``.

    ``value_s`` is the simulator's value, ``lower_bound_s`` the MIP's certified bound (never above
    the value), ``optimal`` only when the MIP proved its optimum and the simulator agrees with it.
    ``warm_start``: a pipeline plan (SliceGraph's) offered as the incumbent and returned if the MIP
    finds nothing better. ``floor_s``: a known lower bound on the optimum (the cheap bounds are
    always assumed), which sharpens the MIP's own bound."""
    from ..bounds import lower_bound         # bounds imports this module

    began = time.perf_counter()
    if problem.objective != "pipeline":
        raise DivimlInputError(f"the pipeline MIP places for objective 'pipeline', not '{problem.objective}'",
                               field="objective", hint="use --objective pipeline --stages K")
    stages = _stage_count(problem)
    if not problem.graph.kernels:
        raise DivimlInputError("the graph has no kernels to place", field="MODEL")
    problem.validate()
    graph, platform, costs = problem.graph, problem.platform, problem.costs
    incumbent_s = None
    if warm_start is not None:
        if warm_start.mode != "stage_serial" or len(warm_start.stages or ()) > stages:
            raise DivimlInputError(f"the warm start must be a stage_serial plan of at most {stages} stages",
                                   field="warm_start")
        sim = simulate(graph, platform, costs, warm_start)
        if sim.feasible:
            incumbent_s = sim.value_s
        else:
            log.warning("the warm start breaks a constraint (%s); solving without it", "; ".join(sim.problems))
            warm_start = None
    model = _PipelineModel(problem, stages, backend, max(floor_s, lower_bound(problem)), incumbent_s)
    if warm_start is not None:
        model.warm_start(warm_start)
    status = _optimize(model.builder, time_limit_s, seed)
    bound = model.builder.bound_s()
    solved = status in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE)
    plan = model.plan() if solved else None
    claim = model.builder.m.objective_value * model.builder.unit if solved else math.inf
    sim = simulate(graph, platform, costs, plan) if plan is not None else None
    # The warm start wins ties, and whenever the MIP's plan overflows a memory with its activations.
    weaker = None
    if warm_start is not None and (sim is None or not sim.feasible or incumbent_s <= sim.value_s):
        if sim is not None and not sim.feasible:
            weaker = ("the pipeline MIP's own plan overflows a memory with its activations (it counts weights "
                      "only): the plan is its warm start's")
        plan = warm_start.copy()
        sim = simulate(graph, platform, costs, plan)
    if plan is None:
        raise DivimlInputError("the pipeline MIP found no plan within its time limit", field="time_limit",
                               hint="raise --time-limit, or use --solver slicegraph")
    if not sim.feasible:
        log.warning("the pipeline MIP's plan breaks a constraint the MIP does not model: %s", "; ".join(sim.problems))
    plan.solver, plan.value_s = "milp", sim.value_s
    plan.lower_bound_s = None if bound is None else min(bound, sim.value_s)
    plan.optimal = (status == mip.OptimizationStatus.OPTIMAL and sim.feasible
                    and sim.value_s <= claim * (1 + AGREE) + 1e-12)
    plan.solve_s = time.perf_counter() - began
    plan.attrs.update({"mip_status": status.name.lower(), "mip_objective_s": claim, "links_exact": model.links_exact,
                       "mip_backend": backend})
    if weaker:
        plan.attrs["weaker_method"] = weaker
    log.info("pipeline MIP: %d stages, period %.6g s, bound %s, %s in %.2f s", len(plan.stages), sim.value_s,
             plan.lower_bound_s, status.name, plan.solve_s)
    return plan
