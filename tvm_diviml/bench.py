"""Benchmark suites behind ``diviml bench``: each yields rows (dicts) measured in one run.

Speed targets live here, never in unit tests; ratios are measured side by side in one run.
"""
from __future__ import annotations

import random
import time
from typing import Callable, Iterator

Row = dict


def _best_time(action: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - began)
    return best


def suite_simulator(kernels: int = 10_000, repeats: int = 3) -> Iterator[Row]:
    """The simulator in every cost mode at kernels/10 and kernels (DESIGN: linear in graph size)."""
    from .cost.roofline import RooflineCostModel
    from .plan import Plan
    from .platform import get_platform
    from .simulator import simulate
    from .synthetic import random_dag

    platform = get_platform("paper-node")
    devices = platform.device_names
    for size in (kernels // 10, kernels):
        graph = random_dag(size, seed=0, edge_probability=3.0 / size)
        costs = RooflineCostModel(graph, platform)
        rng = random.Random(0)
        assignment = {k: rng.choice(devices) for k in graph.kernels}
        order = graph.topo_order
        stages = [order[i * size // 3:(i + 1) * size // 3] for i in range(3)]
        staged = {k: devices[i] for i, stage in enumerate(stages) for k in stage}
        plans = {
            "latency": (Plan(assignment), False),
            "latency+contention": (Plan(assignment), True),
            "period_overlap": (Plan(assignment, objective="throughput", mode="period_overlap"), False),
            "stage_serial": (Plan(staged, objective="pipeline", mode="stage_serial", stages=stages,
                                  stage_devices=devices), False),
            "host_staged": (Plan(assignment, objective="throughput", mode="host_staged"), False),
        }
        for mode, (plan, contention) in plans.items():
            def run(plan=plan, contention=contention, graph=graph, costs=costs):
                return simulate(graph, platform, costs, plan, link_contention=contention)
            seconds = _best_time(run, repeats)
            yield {"suite": "simulator", "mode": mode, "kernels": size, "edges": len(graph.edges), "time_s": seconds}


def suite_extract(models: list[str] | None = None) -> Iterator[Row]:
    """Extraction time and kernel count per zoo model at its default size."""
    from .passes.load import load_model
    from .zoo import zoo_names

    for name in models or zoo_names():
        loaded = load_model(name, {})
        graph = loaded.extraction.graph
        yield {"suite": "extract", "model": name, "kernels": len(graph), "edges": len(graph.edges),
               "primfuncs": len({k.attrs["primfunc_hash"] for k in graph.kernels.values()}),
               "gflops": sum(k.flops for k in graph.kernels.values()) / 1e9,
               "weights_mb": sum(graph.weights.values()) / 1e6, "time_s": loaded.extract_s}


SUITES: dict[str, Callable[[], Iterator[Row]]] = {"simulator": suite_simulator, "extract": suite_extract}


def markdown_table(rows: list[Row]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in (row.get(k) for k in keys)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
