"""Benchmark suites behind ``diviml bench``: each yields rows (dicts) measured in one run.

Speed targets live here, never in unit tests; ratios are measured side by side in one run.
"""
from __future__ import annotations

import logging
import math
import os
import random
import time
from typing import Callable, Iterator

Row = dict

log = logging.getLogger(__name__)


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
    from .presets import get_platform
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
    measured kernel times, alone and as calibrated inside the model (``calibrate_in_context``: the
    placed single-device build timed whole, a separate run, less the runner's Python work around the
    call, ``runner_overhead_s``), against the measured whole-model run (the lowered module by TVM's
    default pipeline and ``time_evaluator``, same schedules), the roofline's
    per-kernel error after fitting it to those measurements, and untuned against tuned times."""
    import tempfile

    import numpy as np
    import tvm

    from .cost.cache import ProfileCache
    from .cost.measured import MeasureOptions, MeasuredCostModel, time_whole_model, tune_for_devices
    from .passes.interpret import transformed_weights
    from .passes.load import load_model
    from .passes.run import calibrate_in_context, runner_overhead_s
    from .presets import get_platform
    from .modelspec import format_model_spec
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
                calibrate_in_context(costs, built, extraction)
                in_context_s = sum(costs.compute_s(k, device.name) for k in graph.kernels)
            runner_s = runner_overhead_s(built, extraction, platform, device)
            weights = transformed_weights(extraction, [w for _, w in built.params], tvm.cpu(0))
            whole = time_whole_model(extraction.mod, extraction.entry, built.sample_inputs(), weights, device, options)
            row = {"suite": "costs", "model": format_model_spec(name, SMALL_OPTIONS[name]),
                   "kernels": len(graph), "sum_kernels_s": float(kernel_s.sum()), "whole_model_s": whole.median_s,
                   "sum_over_whole": float(kernel_s.sum()) / whole.median_s, "runner_overhead_s": runner_s,
                   "in_context_over_whole": (in_context_s - runner_s) / whole.median_s}
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

LATENCY_SOLVERS = ("fastest_single_device", "greedy", "heft", "split", "milp", "cpsat")
EXACT_SOLVERS = ("milp", "cpsat")
MSR_FIDDLE_LATENCY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data",
                                  "msr-fiddle", "latency-inputs")
LATENCY_RATIOS = ("split_over_best", "split_over_heft", "split_over_greedy", "split_time_over_milp",
                  "speedup_over_single")


def latency_workloads(quick: bool, msr_fiddle_dir: str) -> list[tuple[str, str]]:
    """(group, MODEL) rows of the latency suite; msr-fiddle files only where their folder exists."""
    import glob

    fiddle = sorted(glob.glob(os.path.join(msr_fiddle_dir, "*", "*.json")))
    if not fiddle:
        log.warning("latency suite: no msr-fiddle files under %s; their rows are skipped", msr_fiddle_dir)
    if quick:
        return ([("random", f"random:kernels={n},seed=0") for n in (6, 8)]
                + [("msr-fiddle", path) for path in sorted(fiddle, key=os.path.getsize)[:1]])
    return ([("random", f"random:kernels={n},seed={seed}") for n in (12, 16, 20, 24, 32) for seed in (0, 1, 2)]
            + [("msr-fiddle", path) for path in fiddle]
            + [("zoo", name) for name in ("resnet50", "inception_v3", "bert_base", "gpt2", "mobilenet_v2")]
            + [("randwire", f"randwire_{kind}:nodes={nodes},seed={seed}")
               for kind in ("ws", "er", "ba") for nodes in (8, 16, 32) for seed in (0, 1, 2)])


def suite_latency(time_limit_s: float = 60.0, exact_up_to: int = 80, solvers: list[str] | None = None,
                  quick: bool = False, msr_fiddle_dir: str = MSR_FIDDLE_LATENCY) -> Iterator[Row]:
    """Every latency solver side by side on random DAGs, msr-fiddle graphs, zoo models and random-wired
    networks, each judged against the row's best lower bound; one geometric-mean row per group at the end.

    The exact solvers (``EXACT_SOLVERS``) skip graphs of more than ``exact_up_to`` kernels. Measured with
    60 s: on the 74-79-kernel randwire graphs CP-SAT proved 4 of 9 optima and raised the bound by 19-50%
    (MILP proved 1); both build a 290-kernel model in seconds, but a minute of search there rarely beats
    HEFT, and 783 kernels on 16 devices would need 3.5 million big-M rows."""
    from tqdm import tqdm

    from .errors import DivimlInputError
    from .solvers import SOLVERS

    if solvers is None:
        solvers = [name for name in LATENCY_SOLVERS if name in SOLVERS]
        if "cpsat" not in SOLVERS:
            log.warning("latency suite: solver cpsat is not available; its columns are left out")
    for name in solvers:
        if name not in SOLVERS:
            raise DivimlInputError(f"unknown solver '{name}'", field="solvers", hint=f"available: {', '.join(SOLVERS)}")
    rows = []
    progress = tqdm(latency_workloads(quick, msr_fiddle_dir), desc="latency suite", unit="row", leave=False)
    for group, model in progress:
        progress.set_postfix_str(os.path.basename(model))
        row = _latency_row(group, model, solvers, time_limit_s, exact_up_to, msr_fiddle_dir)
        rows.append(row)
        yield row
    yield from latency_summaries(rows)


def latency_summaries(rows: list[Row]) -> list[Row]:
    """Per group, a row with the same columns holding the geometric mean of each ratio column."""
    from statistics import geometric_mean

    summaries = []
    for group in dict.fromkeys(row["group"] for row in rows):
        members = [row for row in rows if row["group"] == group]
        summary = {**dict.fromkeys(members[0]), "suite": "latency", "group": group,
                   "model": f"geomean of {len(members)} rows", "notes": "summary"}
        for key in LATENCY_RATIOS:
            present = [row[key] for row in members if row[key] is not None]
            summary[key] = geometric_mean(present) if present else None
        summaries.append(summary)
    return summaries


def _latency_row(group: str, model: str, solvers: list[str], time_limit_s: float, exact_up_to: int,
                 msr_fiddle_dir: str) -> Row:
    """One workload: every solver's simulated latency, time and proof, against the best lower bound."""
    from .bounds import lower_bounds
    from .solvers import Problem
    from .workload import load_workload

    fiddle = group == "msr-fiddle"            # carries its own devices and costs
    workload = load_workload(model, None if fiddle else "paper-node", None if fiddle else "roofline")
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="latency")
    graph = problem.graph
    bounds = lower_bounds(problem)
    results: dict[str, tuple[float, float, bool]] = {}
    notes = []
    skipped = [name for name in solvers if name in EXACT_SOLVERS and len(graph) > exact_up_to]
    if skipped:
        notes.append(f"{', '.join(skipped)} skipped ({len(graph)} kernels > {exact_up_to})")
    for name in solvers:
        if name in skipped:
            continue
        plan, seconds = _timed_solve(name, problem, time_limit_s, notes)
        if plan is None:
            continue
        if plan.lower_bound_s is not None:
            bounds[name] = plan.lower_bound_s
        results[name] = (plan.value_s, seconds, plan.optimal)
    bound_from = max(bounds, key=bounds.__getitem__)
    bound = bounds[bound_from]
    values = {name: result[0] for name, result in results.items()}
    best_solver = min(values, key=values.__getitem__, default=None)
    best = values.get(best_solver)
    row = {"suite": "latency", "group": group, "model": os.path.relpath(model, msr_fiddle_dir) if fiddle else model,
           "kernels": len(graph), "edges": len(graph.edges), "devices": len(problem.platform.devices),
           "lower_bound_s": bound, "bound_from": bound_from, "best_value_s": best, "best_solver": best_solver}
    for name in solvers:
        value, seconds, optimal = results.get(name, (None, None, None))
        row.update({f"{name}_value_s": value, f"{name}_solve_s": seconds, f"{name}_optimal": optimal,
                    f"{name}_gap": value / bound - 1.0 if value is not None and bound > 0 else None})

    def ratio(numerator: float | None, denominator: float | None) -> float | None:
        return numerator / denominator if numerator is not None and denominator else None

    split = values.get("split")
    row.update(split_over_best=ratio(split, best), split_over_heft=ratio(split, values.get("heft")),
               split_over_greedy=ratio(split, values.get("greedy")),
               split_time_over_milp=ratio(row.get("split_solve_s"), row.get("milp_solve_s")),
               speedup_over_single=ratio(values.get("fastest_single_device"), best), notes="; ".join(notes))
    return row


PIPELINE_STAGES = (2, 4, 8, 16, 32, 64)
# Archer et al. (ICML 2024), geometric mean of lower bound / best partition over 369 production models.
PAPER_PIPELINE_RATIOS = {2: 0.9901, 4: 0.9737, 8: 0.9588, 16: 0.9452, 32: 0.8749, 64: 0.7874}
MSR_FIDDLE_OPERATORS = os.path.join(os.path.dirname(MSR_FIDDLE_LATENCY), "throughput-inputs", "OperatorGraphs")


def pipeline_workloads(quick: bool, msr_fiddle_dir: str) -> list[tuple[str, str, str]]:
    """(group, MODEL, granularity) rows of the pipeline suite; msr-fiddle files where their folder exists."""
    import glob

    fiddle = sorted(glob.glob(os.path.join(msr_fiddle_dir, "*_inference.json")))
    if not fiddle:
        log.warning("pipeline suite: no msr-fiddle files under %s; their rows are skipped", msr_fiddle_dir)
    if quick:
        return [("random", "random:kernels=16,seed=0", "fused"), ("zoo-operator", "resnet18", "operator")]
    return ([("zoo-fused", name, "fused") for name in ("resnet50", "inception_v3", "bert_base:layers=4",
                                                       "gpt2:layers=4")]
            + [("zoo-operator", name, "operator") for name in ("resnet50", "mobilenet_v2", "bert_base:layers=4")]
            + [("randwire", f"randwire_ws:nodes={nodes},stages=1,seed=0", "fused") for nodes in (12, 32, 64, 88)]
            + [("msr-fiddle", path, "fused") for path in fiddle])


def fiddle_accelerators(graph, fiddle_costs, count: int):
    """An msr-fiddle graph on ``count`` identical accelerators priced by its own profile (accelerator
    latency where supported, CPU latency elsewhere; each tensor's transfer its file's ``cost``): the
    pipeline problem of Archer et al. on their data. Their memory and CPU-only marks are dropped."""
    from dataclasses import replace

    from .cost.table import TableCostModel
    from .graph import OpGraph
    from .msr_fiddle import HOST_BANDWIDTH_BPS
    from .platform import Device, Link, Platform

    devices = [Device(f"acc{i}", {"kind": "cuda"}, f"cuda:{i}") for i in range(count)]
    links = {(a.name, b.name): Link(a.name, b.name, 0.0, float(HOST_BANDWIDTH_BPS))
             for a in devices for b in devices if a.name != b.name}
    platform = Platform(f"msr-fiddle acc{count}", devices, links)
    accelerator = next((d.name for d in fiddle_costs.platform.devices if d.kind != "cpu"), None)
    rows = {}
    for kernel in graph.kernels:
        seconds = fiddle_costs.compute_s(kernel, accelerator) if accelerator else math.inf
        if math.isinf(seconds):
            seconds = min(fiddle_costs.compute_s(kernel, d) for d in fiddle_costs.platform.device_names)
        rows[kernel] = {d.name: seconds for d in devices}
    free = OpGraph([replace(k, allowed_devices=None) for k in graph.kernels.values()], graph.edges,
                   inputs=graph.inputs, outputs=graph.outputs, weights={w: 0.0 for w in graph.weights},
                   name=graph.name, attrs=graph.attrs)
    return free, platform, TableCostModel(platform, rows)


def suite_pipeline(time_limit_s: float = 10.0, bound_time_limit_s: float = 10.0, quick: bool = False,
                   stages: tuple[int, ...] = PIPELINE_STAGES, mip_up_to: int = 20_000,
                   msr_fiddle_dir: str = MSR_FIDDLE_OPERATORS) -> Iterator[Row]:
    """SliceGraph against the best lower bound on ``gpuK`` (K identical GPUs, roofline costs) for every K
    in ``stages`` with K <= kernels / 4: zoo models at fused and operator granularity, random-wired
    networks, and the msr-fiddle operator graphs on K accelerators priced by their own profiles.

    Per row: SliceGraph (``time_limit_s``); the exact MIP warm-started from its plan (``time_limit_s``),
    whose plan, when better, is the best partition found and whose proven bound counts; the three-
    superblock and guess-the-bottleneck relaxations (``bound_time_limit_s`` in all); LB0 and the LP
    bound. The MIPs run only where kernels x K <= ``mip_up_to`` (beyond, their models take longer to
    build than to help). One summary row per K: the geometric mean of bound / best beside the paper's."""
    from tqdm import tqdm

    from .bounds import lower_bounds
    from .cost.roofline import RooflineCostModel
    from .presets import gpu_k
    from .solvers import Problem, get_solver
    from .solvers.mtpp import pipeline_bounds, solve_pipeline_mip

    from .workload import load_graph

    rows = []
    progress = tqdm(pipeline_workloads(quick, msr_fiddle_dir), desc="pipeline suite", unit="graph", leave=False)
    for group, model, granularity in progress:
        progress.set_postfix_str(os.path.basename(model))
        found = load_graph(model, granularity=granularity)
        for count in (k for k in stages if k <= len(found.graph) / 4):
            if found.costs is not None:
                graph, platform, costs = fiddle_accelerators(found.graph, found.costs, count)
            else:
                graph, platform = found.graph, gpu_k(count)
                costs = RooflineCostModel(graph, platform)
            problem = Problem(graph, platform, costs, objective="pipeline", stages=count)
            sliced = get_solver("slicegraph", time_limit_s=time_limit_s).solve(problem)
            bounds = lower_bounds(problem)
            best, mip_s, notes = sliced.value_s, None, ""
            if len(graph) * count <= mip_up_to:
                began = time.perf_counter()
                exact = solve_pipeline_mip(problem, time_limit_s=time_limit_s, warm_start=sliced)
                mip_s = time.perf_counter() - began
                best = min(best, exact.value_s)
                if exact.lower_bound_s is not None:
                    bounds["exact_mip"] = exact.lower_bound_s
                began = time.perf_counter()
                bounds.update(pipeline_bounds(problem, bound_time_limit_s, exact_mip=False))
                bound_s = time.perf_counter() - began
            else:
                bound_s, notes = 0.0, f"MIPs skipped: {len(graph)} kernels x {count} stages > {mip_up_to}"
            best_from = max(bounds, key=bounds.__getitem__)
            row = {"suite": "pipeline", "group": group, "granularity": granularity,
                   "model": os.path.basename(model) if found.costs is not None else model,
                   "kernels": len(graph), "stages": count, "slicegraph_value_s": sliced.value_s,
                   "slicegraph_s": sliced.solve_s, "stopped": sliced.attrs.get("stopped"), "best_value_s": best,
                   "mip_s": mip_s, "lower_bound_s": bounds[best_from], "bound_from": best_from, "bound_s": bound_s,
                   "ratio": bounds[best_from] / best if best > 0 else 1.0,
                   "slicegraph_ratio": bounds[best_from] / sliced.value_s if sliced.value_s > 0 else 1.0,
                   **{f"bound_{name}_s": seconds for name, seconds in bounds.items()}, "notes": notes}
            rows.append(row)
            yield row
    yield from pipeline_summaries(rows)


def pipeline_summaries(rows: list[Row]) -> list[Row]:
    """Per K: the geometric mean of bound / value over every graph, the paper's figure beside it, and
    SliceGraph's slowest run on graphs of at most 256 kernels."""
    from statistics import geometric_mean

    summaries = []
    for count in sorted({row["stages"] for row in rows}):
        members = [row for row in rows if row["stages"] == count]
        small = [row["slicegraph_s"] for row in members if row["kernels"] <= 256]
        summaries.append({"suite": "pipeline", "group": "summary", "stages": count, "graphs": len(members),
                          "ratio_geomean": geometric_mean([max(row["ratio"], 1e-12) for row in members]),
                          "slicegraph_ratio_geomean": geometric_mean([max(row["slicegraph_ratio"], 1e-12)
                                                                      for row in members]),
                          "paper_ratio": PAPER_PIPELINE_RATIOS.get(count),
                          "ratio_min": min(row["ratio"] for row in members),
                          "slicegraph_max_s_up_to_256_kernels": max(small, default=None)})
    return summaries


MSR_FIDDLE_DIR = os.path.dirname(MSR_FIDDLE_LATENCY)


def suite_msr_fiddle(time_limit_s: float = 300.0, slicegraph_time_limit_s: float = 60.0, max_ideals: int = 50_000,
                     quick: bool = False, msr_fiddle_dir: str = MSR_FIDDLE_DIR) -> Iterator[Row]:
    """The msr-fiddle max-load problem (Tarnawski et al. 2020, mode host_staged) on every
    ``throughput-inputs/*/*_inference.json``: the downset DP (exact where the ideals fit under
    ``max_ideals`` and ``time_limit_s``; SliceGraph otherwise), SliceGraph on its own, our best lower
    bound (bounds.lower_bound, raised to the DP optimum where exact: that optimum bounds every ordered
    contiguous split) and the gap; then each ``human-experts/*_inference_expert.json`` split scored by
    the same simulator beside ours, matched to the graph file that has exactly its node ids. ``quick``:
    the two smallest graphs, SliceGraph for 2 s."""
    import glob

    from .bounds import lower_bound
    from .jsonio import read_json
    from .msr_fiddle import read_expert_split, read_msr_fiddle
    from .simulator import simulate
    from .solvers import Problem, get_solver

    files = sorted(glob.glob(os.path.join(msr_fiddle_dir, "throughput-inputs", "*", "*_inference.json")))
    if not files:
        log.warning("msr-fiddle suite: no files under %s; skipped", msr_fiddle_dir)
        return
    if quick:
        files = sorted(files, key=lambda path: len(read_json(path)["nodes"]))[:2]
        slicegraph_time_limit_s = min(slicegraph_time_limit_s, 2.0)
    ours: dict[frozenset, tuple[str, float, object]] = {}       # node ids -> (file, our best value, graph data)
    for path in files:
        name = os.path.relpath(path, os.path.join(msr_fiddle_dir, "throughput-inputs"))
        data = read_json(path)
        graph, platform, costs = read_msr_fiddle(data, name)
        problem = Problem(graph, platform, costs, objective="throughput")
        downsets = get_solver("downsets", time_limit_s=time_limit_s, max_ideals=max_ideals,
                              fallback_options={"time_limit_s": slicegraph_time_limit_s}).solve(problem)
        slicegraph = get_solver("slicegraph", time_limit_s=slicegraph_time_limit_s).solve(problem)
        exact = downsets.attrs["method"] == "downset DP" and downsets.optimal
        bound = lower_bound(problem)
        best_bound = max(bound, downsets.value_s) if exact else bound
        best = min(downsets.value_s, slicegraph.value_s)
        ours[frozenset(str(n["id"]) for n in data["nodes"])] = (name, best, (graph, platform, costs))
        yield {"suite": "msr-fiddle", "model": name, "kernels": len(graph), "accelerators": int(data["maxFPGAs"]),
               "cpus": int(data["maxCPUs"]), "ideals": downsets.attrs.get("ideals"), "dp_exact": exact,
               "downsets_value_s": downsets.value_s, "downsets_s": downsets.solve_s,
               "downsets_method": downsets.attrs["method"], "fallback_reason": downsets.attrs.get("fallback_reason"),
               "slicegraph_value_s": slicegraph.value_s,
               "slicegraph_s": slicegraph.solve_s, "lower_bound_s": bound,
               "contiguous_optimum_s": downsets.value_s if exact else None, "best_bound_s": best_bound,
               "gap": best / best_bound - 1 if best_bound > 0 else None}
    for path in sorted(glob.glob(os.path.join(msr_fiddle_dir, "human-experts", "*_inference_expert.json"))):
        split = read_json(path)
        ids = frozenset(str(n) for key in ("cpus", "fpgas") for group in split.get(key, []) for n in group["nodes"])
        if ids not in ours:
            log.warning("msr-fiddle suite: no inference graph has exactly the %d nodes of %s; skipped", len(ids),
                        os.path.basename(path))
            continue
        name, best, (graph, platform, costs) = ours[ids]
        sim = simulate(graph, platform, costs, read_expert_split(split, graph, platform))
        yield {"suite": "msr-fiddle", "model": os.path.basename(path), "graph": name, "kernels": len(graph),
               "expert_value_s": sim.value_s, "expert_feasible": sim.feasible,
               "expert_contiguous": sim.device_graph_acyclic, "ours_value_s": best,
               "ours_over_expert": best / sim.value_s if sim.value_s > 0 else None}


RUN_TARGETS = {"measured_over_predicted": (0.85, 1.15), "concurrent_speedup": 1.6, "pipeline_speedup": 1.7}


def run_workloads(quick: bool) -> list[tuple[str, str, str, int | None]]:
    """(case, MODEL, objective, stages) rows of the run suite: every zoo model at its small size for
    latency, the balanced two-branch model for concurrency, balanced chains as 2-stage pipelines."""
    from .modelspec import format_model_spec as spec
    from .zoo import SMALL_OPTIONS

    names = ["resnet18", "bert_base"] if quick else sorted(n for n in SMALL_OPTIONS if n != "twin_branch")
    rows = [("predicted", spec(n, SMALL_OPTIONS[n]), "latency", None) for n in names]
    rows.append(("concurrent", "twin_branch", "latency", None))
    rows.append(("pipeline", "twin_branch:branches=1,depth=8", "pipeline", 2))
    if not quick:
        rows.append(("pipeline", spec("resnet18", SMALL_OPTIONS["resnet18"]), "pipeline", 2))
    return rows


def suite_run(quick: bool = False, time_limit_s: float = 30.0, repeats: int = 10, platform: str = "cpu2",
              candidates: int = 2) -> Iterator[Row]:
    """Plans built and run for real on ``platform`` (measured costs): per zoo model the ``--solver
    auto`` plan, timed side by side with the other ``candidates`` and every single-device
    configuration (``run --candidates``: measured over predicted of the auto plan, and the kept
    plan against the best single device of the same rounds); the concurrent executor's speed-up on
    balanced parallel branches, and 2-stage pipelines' measured throughput, each against the best
    single-device configuration measured in the same run (targets: RUN_TARGETS). Kernel times come
    from the profile cache; each model is timed whole again here (``calibrate_in_context(fresh=True)``)
    so that a prediction and its measurement see the machine alike: this VM's speed drifts by up to
    40% between runs minutes apart, more than the error the targets allow."""
    from .candidates import plan_key
    from .passes.run import calibrate_in_context, run_candidates, run_plan
    from .report import solve_and_report
    from .solvers import Problem
    from .workload import load_workload

    for case, model, objective, stages in run_workloads(quick):
        workload = load_workload(model, platform, "measured")
        loaded = workload.loaded
        calibrate_in_context(workload.costs, loaded.built, loaded.extraction, fresh=True)
        problem = Problem(workload.graph, workload.platform, workload.costs, objective=objective, stages=stages)
        plan, sim, row = solve_and_report(problem, "auto", model, "measured", time_limit_s=time_limit_s)
        kept = None
        if objective == "latency":
            selection, run, _ = run_candidates(loaded.built, loaded.extraction, problem, plan, candidates,
                                               repeats=repeats, progress=log.info)
            auto = next(c for c in selection.candidates if plan_key(c.plan) == plan_key(plan) and c.threads is None)
            predicted_s, measured_s, kept = auto.predicted_s, auto.measured_s, selection.winner.label
        else:
            run, _ = run_plan(loaded.built, loaded.extraction, workload.platform, plan, sim.value_s, repeats=repeats,
                              progress=log.info)
            predicted_s, measured_s = run.predicted_s, run.measured_s
        best_name, best_s = run.best_single_device
        yield {"suite": "run", "case": case, "model": model, "objective": objective, "kernels": len(workload.graph),
               "solver": plan.solver, "devices_used": len(plan.devices_used()), "predicted_s": predicted_s,
               "measured_s": measured_s, "measured_over_predicted": measured_s / predicted_s, "kept": kept,
               "best_single_device": best_name, "best_single_device_s": best_s,
               "speedup_over_best_single_device": run.speedup_over_best_single,
               "speedup_over_one_worker": run.speedup_over_one_worker, "max_rel_diff": run.max_rel_diff,
               "build_s": run.build_s}


def suite_models(quick: bool = False, time_limit_s: float = 10.0) -> Iterator[Row]:
    """Models from torchvision and Hugging Face, exported with torch.export and through ONNX, each
    imported, extracted, planned on cpu2 and paper-node, built across cpu0/cpu1, run and compared
    with torch (``passes/coverage.py``); quick: one CNN and one transformer."""
    from tqdm import tqdm

    from .errors import DivimlInputError
    from .passes.coverage import ROUTES, catalogue, check_model, missing_packages

    missing = missing_packages()
    if missing:
        raise DivimlInputError(f"suite models needs {', '.join(missing)}, which this environment lacks",
                               field="--suite", hint="pip install 'tvm-diviml[torch]'")
    models = [m for m in catalogue().values() if m.quick or not quick]
    progress = tqdm(total=len(models) * len(ROUTES), desc="models suite", unit="row", leave=False)
    for model in models:
        for route in ROUTES:
            progress.set_postfix_str(f"{model.name} ({route})")
            yield check_model(model, route, time_limit_s=time_limit_s)
            progress.update()
    progress.close()


LLM_LAYERS = (8, 24, 48)
LLM_PLATFORMS = ("servers:2xpaper-node", "servers:4xpaper-node")
LLM_OBJECTIVES = ("latency", "throughput")
# The whole-graph solvers the symmetric one is judged against (solvers.full_graph_solver's first). The
# "full" of symmetric_vs_full and speedup is the one with the best plan (on a tie, the faster).
LLM_FULL_SOLVERS = {"latency": ("split",), "throughput": ("milp", "split")}
LLM_TARGETS = {"symmetric_vs_full_pct": 2.0, "speedup": 50.0, "from_layers": 24}


def llm_models(quick: bool) -> list[str]:
    """The llama zoo MODELs of the LLM suite: 8, 24 and 48 layers; quick, 8 layers at hidden 128."""
    return ["llama:layers=8,hidden=128,intermediate=352"] if quick else [f"llama:layers={n}" for n in LLM_LAYERS]


def suite_llm(time_limit_s: float = 120.0, quick: bool = False, models: list[str] | None = None,
              platforms: tuple[str, ...] = LLM_PLATFORMS, objectives: tuple[str, ...] = LLM_OBJECTIVES
              ) -> Iterator[Row]:
    """The symmetric solver against the whole-graph solvers on LLaMA-style models across servers
    (issue 8): per model, platform and objective, its simulated value, the full problem's lower bound,
    its gap and solve time beside each full solver's (``LLM_FULL_SOLVERS``, ``time_limit_s`` each,
    ``timed_out`` when they used it up). Targets (``LLM_TARGETS``): from 24 layers on, within 2% of the
    best full solver's plan and at least 50x faster than that solver. One summary row per objective.

    Pipelines are left out: the symmetric solver does latency and throughput only (SliceGraph, the
    pipeline solver, has no symmetric counterpart to compare). Each model is extracted once and its
    graph priced by the roofline for every platform; solves run one at a time, so their times compare."""
    from tqdm import tqdm

    from .cost.roofline import RooflineCostModel
    from .presets import get_platform
    from .solvers import Problem
    from .workload import load_graph, parse_model_spec

    models = models or llm_models(quick)
    rows = []
    progress = tqdm(total=len(models) * len(platforms) * len(objectives), desc="llm suite", unit="row", leave=False)
    for model in models:
        progress.set_postfix_str(f"extracting {model}")
        graph = load_graph(model).graph
        layers = parse_model_spec(model)[1].get("layers")
        for platform_name in platforms:
            platform = get_platform(platform_name)
            costs = RooflineCostModel(graph, platform)
            for objective in objectives:
                progress.set_postfix_str(f"{model} {platform_name} {objective}")
                problem = Problem(graph, platform, costs, objective=objective)
                row = {"suite": "llm", "model": model, "layers": layers, "kernels": len(graph),
                       "platform": platform_name, "devices": len(platform.devices), "objective": objective,
                       **_llm_solves(problem, layers, time_limit_s)}
                rows.append(row)
                progress.update()
                yield row
    progress.close()
    yield from llm_summaries(rows)


def _llm_solves(problem, layers: int | None, time_limit_s: float) -> Row:
    """The row's solver columns: the symmetric solver, then each full solver, timed one after another;
    the targets judged where the model has enough layers for them to apply."""
    full = LLM_FULL_SOLVERS[problem.objective]
    every_full = list(dict.fromkeys(name for names in LLM_FULL_SOLVERS.values() for name in names))
    notes: list[str] = []
    symmetric, symmetric_s = _timed_solve("symmetric", problem, time_limit_s, notes)
    results = {name: _timed_solve(name, problem, time_limit_s, notes) for name in full}
    plans = {"symmetric": symmetric, **{name: plan for name, (plan, _) in results.items()}}
    bounds = {name: plan.lower_bound_s for name, plan in plans.items()
              if plan is not None and plan.lower_bound_s is not None}
    bound_from = max(bounds, key=bounds.__getitem__, default=None)
    value = symmetric.value_s if symmetric is not None else None
    row: Row = {"symmetric_value_s": value,
                "symmetric_bound_s": symmetric.lower_bound_s if symmetric is not None else None,
                "symmetric_gap": value / symmetric.lower_bound_s - 1
                if symmetric is not None and symmetric.lower_bound_s else None,
                "symmetric_solve_s": symmetric_s,
                "symmetric_fallback": symmetric.attrs["symmetric"].get("fallback") if symmetric is not None else None,
                "best_bound_s": bounds.get(bound_from), "bound_from": bound_from}
    for name in every_full:
        plan, seconds = results.get(name, (None, None))
        row.update({f"{name}_value_s": plan.value_s if plan is not None else None, f"{name}_solve_s": seconds,
                    f"{name}_timed_out": seconds >= time_limit_s * 0.98 if seconds is not None else None,
                    f"symmetric_vs_{name}_pct": _percent_above(value, plan.value_s if plan is not None else None)})
    solved = [name for name in full if results[name][0] is not None]
    reference = min(solved, key=lambda name: (results[name][0].value_s, results[name][1]), default=None)
    row.update({"full_solver": reference,
                "symmetric_vs_full_pct": row[f"symmetric_vs_{reference}_pct"] if reference else None,
                "speedup": results[reference][1] / symmetric_s
                if reference and symmetric is not None and symmetric_s > 0 else None})
    targeted = row["symmetric_vs_full_pct"] is not None and row["speedup"] is not None and \
        (layers or 0) >= LLM_TARGETS["from_layers"]
    row.update({"meets_value_target": row["symmetric_vs_full_pct"] <= LLM_TARGETS["symmetric_vs_full_pct"]
                if targeted else None,
                "meets_speed_target": row["speedup"] >= LLM_TARGETS["speedup"] if targeted else None,
                "notes": "; ".join(notes)})
    return row


def _percent_above(value: float | None, reference: float | None) -> float | None:
    return 100.0 * (value / reference - 1.0) if value is not None and reference else None


def _timed_solve(name: str, problem, time_limit_s: float, notes: list[str]):
    """(plan with its simulated value, wall seconds), or (None, seconds) with a note in ``notes`` when
    the solver fails or its plan is infeasible (the latency and llm suites)."""
    from .errors import DivimlInputError
    from .simulator import simulate
    from .solvers import get_solver

    began = time.perf_counter()
    try:
        plan = get_solver(name, time_limit_s=time_limit_s).solve(problem)
    except DivimlInputError as error:
        notes.append(f"{name}: {error}")
        return None, time.perf_counter() - began
    except Exception as error:          # one broken solver must not end an hour-long run: note it, go on
        log.warning("%s failed on %s", name, problem.graph.name, exc_info=True)
        notes.append(f"{name} failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
        return None, time.perf_counter() - began
    seconds = time.perf_counter() - began
    sim = simulate(problem.graph, problem.platform, problem.costs, plan)
    if not sim.feasible:
        notes.append(f"{name}: infeasible plan ({'; '.join(sim.problems[:1])})")
        return None, seconds
    plan.value_s = sim.value_s
    return plan, seconds


def llm_summaries(rows: list[Row]) -> list[Row]:
    """Per objective, a row with the same columns: the worst symmetric_vs_full and speedup over the rows
    the targets apply to (24+ layers; every row where none has that many), and whether all met both."""
    summaries = []
    for objective in dict.fromkeys(row["objective"] for row in rows):
        members = [row for row in rows if row["objective"] == objective]
        judged = [row for row in members if row["meets_value_target"] is not None]
        considered = judged or members
        pcts = [row["symmetric_vs_full_pct"] for row in considered if row["symmetric_vs_full_pct"] is not None]
        speedups = [row["speedup"] for row in considered if row["speedup"] is not None]
        summaries.append({**dict.fromkeys(rows[0]), "suite": "llm", "model": "summary", "objective": objective,
                          "symmetric_vs_full_pct": max(pcts, default=None), "speedup": min(speedups, default=None),
                          "meets_value_target": all(row["meets_value_target"] for row in judged) if judged else None,
                          "meets_speed_target": all(row["meets_speed_target"] for row in judged) if judged else None,
                          "notes": f"worst of {len(considered)} rows"
                                   + (f" with {LLM_TARGETS['from_layers']}+ layers" if judged else "")})
    return summaries


SUITES: dict[str, Callable[..., Iterator[Row]]] = {"simulator": suite_simulator, "extract": suite_extract,
                                                   "costs": suite_costs, "latency": suite_latency,
                                                   "pipeline": suite_pipeline,
                                                   "msr-fiddle": suite_msr_fiddle, "run": suite_run,
                                                   "llm": suite_llm, "models": suite_models}


def markdown_table(rows: list[Row]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in (row.get(k) for k in keys)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
