"""How long the simulator takes on large graphs, in every cost mode (DESIGN: linear in graph size).

    python benchmarks/simulator_speed.py [--kernels 10000] [--repeats 3]

Prints the best of ``repeats`` wall-clock times per mode; ratios between sizes show the scaling.
"""
from __future__ import annotations

import argparse
import random
import time

from tvm_diviml.cost.roofline import RooflineCostModel
from tvm_diviml.plan import Plan
from tvm_diviml.platform import get_platform
from tvm_diviml.simulator import simulate
from tvm_diviml.synthetic import random_dag


def time_modes(kernels: int, repeats: int, seed: int = 0) -> dict[str, float]:
    graph = random_dag(kernels, seed=seed, edge_probability=3.0 / kernels)
    platform = get_platform("paper-node")
    costs = RooflineCostModel(graph, platform)
    rng = random.Random(seed)
    assignment = {k: rng.choice(platform.device_names) for k in graph.kernels}
    order = graph.topo_order
    cut = [order[i * len(order) // 3:(i + 1) * len(order) // 3] for i in range(3)]
    stage_assignment = {k: platform.device_names[i] for i, stage in enumerate(cut) for k in stage}
    plans = {
        "latency": (Plan(assignment), {}),
        "latency+contention": (Plan(assignment), {"link_contention": True}),
        "period_overlap": (Plan(assignment, objective="throughput", mode="period_overlap"), {}),
        "stage_serial": (Plan(stage_assignment, objective="pipeline", mode="stage_serial", stages=cut,
                              stage_devices=platform.device_names), {}),
        "host_staged": (Plan(assignment, objective="throughput", mode="host_staged"), {}),
    }
    results = {}
    for name, (plan, options) in plans.items():
        best = float("inf")
        for _ in range(repeats):
            began = time.perf_counter()
            simulate(graph, platform, costs, plan, **options)
            best = min(best, time.perf_counter() - began)
        results[name] = best
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    small = time_modes(args.kernels // 10, args.repeats)
    large = time_modes(args.kernels, args.repeats)
    print(f"{'mode':<22}{args.kernels // 10:>10} kernels{args.kernels:>10} kernels{'ratio':>8}")
    for mode in large:
        print(f"{mode:<22}{small[mode] * 1e3:>14.1f} ms{large[mode] * 1e3:>14.1f} ms{large[mode] / small[mode]:>8.1f}")


if __name__ == "__main__":
    main()
