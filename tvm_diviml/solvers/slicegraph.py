"""SliceGraph: a pipeline of at most K stages found by slicing topological orders (Archer, Fahrbach,
Liu and Prabhu, ICML 2024), with stages on different devices.

Every valid pipeline is one topological order cut into contiguous segments, so ``slice_order``
solves one order exactly by a DP over cuts, each segment priced as the simulator's
``stage_serial`` mode charges it; ``StageCosts`` (``toolkit/stage_costs.py``) prices all segments
of an order at once with numpy. ``SliceGraph`` searches orders and
stage devices with a biased random-key genetic algorithm seeded with program, depth-first and
breadth-first orders. On ``host_staged`` platforms the same DP solves the msr-fiddle max-load
problem (``throughput``). Segments that break memory, allowed devices or co-location cost infinity.

The DP, the pricing and the search: docs/solvers.md#slicegraph.
"""

from __future__ import annotations

import heapq
import logging
import math
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
from ..toolkit.incumbents import Incumbents
from ..toolkit.stage_costs import StageCosts
from ..units import format_bytes
from .base import Solver

log = logging.getLogger(__name__)
# Slicings tried with room reserved for the activations an earlier slicing overflowed with, before
# slicing with every segment's memory counted exactly (slower), which graphs this small do at once.
MEMORY_ATTEMPTS = 3
EXACT_MEMORY_KERNELS = 64
# A decode prices only stages of work up to this times the best period so far: orders within it are
# sliced exactly, those past it get a slicing's value (at least the optimum's, which is past it too).
BAND_SLACK = 1.25


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
    inputs = ("watch",)

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

    def place(self, problem: Problem, deadline: Deadline, *, watch: Incumbents | None = None) -> Plan:
        """The best slicing the search finds (each generation's improvement offered to ``watch``)."""
        platform = problem.platform
        stages = (problem.stages if problem.objective == "pipeline" else None) or len(platform.devices)
        bound = lower_bound(problem)
        reserve: dict[str, float] = {}
        exact = len(problem.graph) <= EXACT_MEMORY_KERNELS
        for attempt in range(MEMORY_ATTEMPTS + 1):
            costs = StageCosts(problem, reserve, exact_memory=exact)
            # a retry searches for half the limit again, within the deadline
            search_until = deadline if attempt == 0 else deadline.within(self.time_limit_s / 2)
            best, searched = self._search(costs, problem, stages, bound, search_until, watch)
            if not math.isfinite(best.value) and exact:
                self._refuse(stages, searched)
            overflow = None
            if math.isfinite(best.value):
                order = [costs.names[i] for i in best.order]
                plan = pipeline_plan(problem, order, best.stage_devices, best.cuts)
                sim = simulate(problem, plan)
                overflow = activation_overflow(problem, plan, sim)
                if not overflow or exact:
                    break
            if overflow is None or attempt + 1 >= MEMORY_ATTEMPTS:
                # the reserves are a guess that did not work out: count every segment's memory exactly
                log.info("slicegraph: slicing again with each stage's memory counted exactly")
                exact = True
                continue
            # weights fit (the DP checked them): the activations took the rest; keep room for them
            for device, peak in overflow.items():
                reserve[device] = max(reserve.get(device, 0.0), peak)
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
                "exact_memory": exact,
            }
        )
        log.info(
            "slicegraph: %d stages, period %.6g s (bound %.6g s), %d generations, %d decodes (%s)",
            len(plan.stages),
            sim.value_s,
            bound,
            searched["generations"],
            searched["decodes"],
            searched["stopped"],
        )
        return plan

    @staticmethod
    def _refuse(stages: int, searched: dict) -> None:
        stopped = ", stopped by the time limit" if searched["stopped"] == "time_limit" else ""
        raise DivimlInputError(
            f"found no slicing into at most {stages} stages whose every stage fits its device's memory "
            f"and keeps co-location groups together ({searched['decodes']} orders tried{stopped})",
            field="stages",
            hint="allow more stages or devices, use devices with more memory, or give a longer --time-limit",
        )

    def _search(
        self,
        costs: StageCosts,
        problem: Problem,
        stages: int,
        bound: float,
        deadline: Deadline,
        watch: Incumbents | None,
    ) -> tuple[_Decoded, dict]:
        """The BRKGA until ``deadline``: the best decoded chromosome, and how the search went
        (generations, decodes, what stopped it). The first population's best and each generation's
        improvement are offered to ``watch`` (where its memory fits, the simulator says)."""
        rng = np.random.default_rng(self.seed)
        decodes = 0
        best: _Decoded | None = None

        def decode(keys: np.ndarray) -> float:
            nonlocal decodes, best
            decodes += 1
            order = order_by_keys(costs.successors, costs.indegree, keys[: costs.n].tolist(), costs.groups)
            devices = [costs.devices[d] for d in np.argsort(keys[costs.n :], kind="stable")[:stages]]
            upper = math.inf if best is None else best.value * BAND_SLACK  # exact near the best, cheaper far off
            value, cuts, exact = costs.slice(np.array(order, dtype=np.int64), devices, upper)
            if best is None or value < best.value:
                best = _Decoded(value, order, devices, cuts, exact)
            return value

        population, scores = self._first_population(costs, problem, stages, rng), []
        for keys in population:  # seeds first; on large graphs a decode takes seconds
            if scores and deadline.passed():
                break
            scores.append(decode(keys))
        population, fitness = population[: len(scores)], np.array(scores)
        stopped, generation = "generations", 0
        improved_at, best_so_far = 0, math.inf
        while generation < self.generations:
            if best.value < best_so_far:
                improved_at, best_so_far = generation, best.value
                if watch is not None and math.isfinite(best.value):
                    order = [costs.names[i] for i in best.order]
                    watch.offer(pipeline_plan(problem, order, best.stage_devices, best.cuts), "slicegraph: search")
            if meets(best.value, bound):
                stopped = "lower_bound"
                break
            if generation - improved_at >= self.stall_generations:
                stopped = "stalled"
                break
            if deadline.passed():
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
                if deadline.passed():
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
