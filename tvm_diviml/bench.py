"""Benchmark suites behind ``diviml bench``: each yields rows (dicts) measured in one run.

Speed targets live here, never in unit tests; ratios are measured side by side in one run.
"""
from __future__ import annotations

import logging
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
    from .errors import DivimlInputError
    from .simulator import simulate
    from .solvers import Problem, get_solver
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
        began = time.perf_counter()
        try:
            plan = get_solver(name, time_limit_s=time_limit_s).solve(problem)
        except DivimlInputError as error:
            notes.append(f"{name}: {error}")
            continue
        except Exception as error:          # one broken solver must not end an hour-long run: note it, go on
            log.warning("latency suite: %s failed on %s", name, model, exc_info=True)
            notes.append(f"{name} failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
            continue
        seconds = time.perf_counter() - began
        sim = simulate(graph, problem.platform, problem.costs, plan)
        if not sim.feasible:
            notes.append(f"{name}: infeasible plan ({'; '.join(sim.problems[:1])})")
            continue
        if plan.lower_bound_s is not None:
            bounds[name] = plan.lower_bound_s
        results[name] = (sim.value_s, seconds, plan.optimal)
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


SUITES: dict[str, Callable[..., Iterator[Row]]] = {"simulator": suite_simulator, "extract": suite_extract,
                                                   "costs": suite_costs, "latency": suite_latency}


def markdown_table(rows: list[Row]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in (row.get(k) for k in keys)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
