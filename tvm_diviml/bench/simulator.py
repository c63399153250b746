"""The ``simulator`` suite: how the simulator's time grows with the graph, in every cost mode."""

from __future__ import annotations

import random
from collections.abc import Iterator

from tvm_diviml.problem import Problem

from ..cost.roofline import RooflineCostModel
from ..plan import Plan
from ..presets import get_platform
from ..simulator import simulate
from ..synthetic import random_dag
from .common import best_time
from .suite import Row

KERNELS = 10_000  # the larger graph; the smaller has a tenth of it
REPEATS = 3  # runs per mode and size, the fastest counts
PLATFORM = "paper-node"


def suite_simulator(kernels: int = KERNELS, repeats: int = REPEATS) -> Iterator[Row]:
    """The simulator in every cost mode at kernels/10 and kernels (linear in graph size)."""
    platform = get_platform(PLATFORM)
    devices = platform.device_names
    for size in (kernels // 10, kernels):
        graph = random_dag(size, seed=0, edge_probability=3.0 / size)
        costs = RooflineCostModel(graph, platform)
        rng = random.Random(0)
        assignment = {k: rng.choice(devices) for k in graph.kernels}
        order = graph.topo_order
        stages = [order[i * size // 3 : (i + 1) * size // 3] for i in range(3)]
        staged = {k: devices[i] for i, stage in enumerate(stages) for k in stage}
        plans = {
            "latency": (Plan(assignment), False),
            "latency+contention": (Plan(assignment), True),
            "period_overlap": (Plan(assignment, objective="throughput", mode="period_overlap"), False),
            "stage_serial": (
                Plan(staged, objective="pipeline", mode="stage_serial", stages=stages, stage_devices=devices),
                False,
            ),
            "host_staged": (Plan(assignment, objective="throughput", mode="host_staged"), False),
        }
        for mode, (plan, contention) in plans.items():

            def run(plan=plan, contention=contention, graph=graph, costs=costs):
                return simulate(Problem(graph, platform, costs), plan, link_contention=contention)

            seconds = best_time(run, repeats)
            yield {"suite": "simulator", "mode": mode, "kernels": size, "edges": len(graph.edges), "time_s": seconds}
