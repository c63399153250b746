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


def suite_costs(models: list[str] | None = None, tune_models: tuple[str, ...] = ("resnet18", "bert_base"),
                tune_trials: int = 32) -> Iterator[Row]:
    """Cost-model accuracy on this machine's CPU, per zoo model at a small size: the sum of the
    measured kernel times against the measured whole-model run (same schedules), the roofline's
    per-kernel error after fitting it to those measurements, and untuned against tuned times."""
    import tempfile

    import numpy as np
    import tvm

    from .cost.cache import ProfileCache
    from .cost.measured import MeasureOptions, MeasuredCostModel, time_whole_model, tune_for_devices
    from .passes.interpret import transformed_weights
    from .passes.load import load_model
    from .platform import get_platform
    from .zoo import SMALL_OPTIONS

    platform = get_platform("cpu2")
    device = platform.devices[0]
    options = MeasureOptions(progress=False)
    with tempfile.TemporaryDirectory() as scratch:
        for name in models or sorted(SMALL_OPTIONS):
            loaded = load_model(name, SMALL_OPTIONS[name])
            extraction, built = loaded.extraction, loaded.built
            graph = extraction.graph
            with ProfileCache(f"{scratch}/{name}.sqlite") as cache:
                costs = MeasuredCostModel(graph, platform, extraction.mod, extraction.kernel_func, cache=cache,
                                          options=options)
            kernel_s = np.array([costs.compute_s(k, device.name) for k in graph.kernels])
            weights = transformed_weights(extraction, [w for _, w in built.params], tvm.cpu(0))
            whole = time_whole_model(extraction.mod, extraction.entry, built.sample_inputs(), weights, device, options)
            row = {"suite": "costs", "model": f"{name}:" + ",".join(f"{k}={v}" for k, v in SMALL_OPTIONS[name].items()),
                   "kernels": len(graph), "sum_kernels_s": float(kernel_s.sum()), "whole_model_s": whole.median_s,
                   "sum_over_whole": float(kernel_s.sum()) / whole.median_s}
            try:
                fit = costs.roofline_fit(device.name)
                row.update(fit_gflops=fit.peak_flops / 1e9, fit_gbps=fit.bandwidth_Bps / 1e9,
                           fit_overhead_us=fit.overhead_s * 1e6, roofline_median_err=fit.median_rel_error,
                           roofline_p90_err=fit.p90_rel_error)
            except ValueError as error:
                row["roofline_fit"] = str(error)
            if name in tune_models:
                funcs = {f: extraction.mod[f] for f in sorted(set(extraction.kernel_func.values()))}
                tuned = tune_for_devices(funcs, [device], tune_trials, f"{scratch}/{name}-ms", progress=False)[device.name]
                tuned_whole = time_whole_model(extraction.mod, extraction.entry, built.sample_inputs(), weights,
                                               device, options, tuned.database)
                row.update(tune_trials=tune_trials, tuned_whole_model_s=tuned_whole.median_s,
                           tuning_speedup=whole.median_s / tuned_whole.median_s, tuning_s=tuned.seconds)
            yield row


SUITES: dict[str, Callable[[], Iterator[Row]]] = {"simulator": suite_simulator, "extract": suite_extract,
                                                  "costs": suite_costs}


def markdown_table(rows: list[Row]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in (row.get(k) for k in keys)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
