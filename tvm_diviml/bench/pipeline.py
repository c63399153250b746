"""The ``pipeline`` suite: SliceGraph against the best lower bound on K identical GPUs, beside the
figures Archer et al. (ICML 2024) report for their production models."""

from __future__ import annotations

import glob
import math
import os
import time
from collections.abc import Iterator
from dataclasses import replace

from ..app.workload import load_graph
from ..bounds import lower_bounds
from ..bounds.pipeline import DP_IDEALS, downset_bound, pipeline_bounds
from ..cost.roofline import RooflineCostModel
from ..cost.table import TableCostModel
from ..graph import OpGraph
from ..msr_fiddle import HOST_BANDWIDTH_BPS
from ..platform import Device, Link, Platform
from ..presets import gpu_k
from ..solvers import Problem, get_solver
from ..solvers.pipeline_mip import solve_pipeline_mip
from ..toolkit.deadline import Deadline
from ..toolkit.pipeline_polish import polish_pipeline
from .common import MSR_FIDDLE_DIR, geomean, log, progress
from .suite import Row

PIPELINE_STAGES = (2, 4, 8, 16, 32, 64)
# Archer et al. (ICML 2024), geometric mean of lower bound / best partition over 369 production models.
PAPER_PIPELINE_RATIOS = {2: 0.9901, 4: 0.9737, 8: 0.9588, 16: 0.9452, 32: 0.8749, 64: 0.7874}
MSR_FIDDLE_OPERATORS = os.path.join(MSR_FIDDLE_DIR, "throughput-inputs", "OperatorGraphs")
TIME_LIMIT_S = 10.0
BOUND_TIME_LIMIT_S = 450.0  # a ceiling: node and pricing limits stop the MIPs and the stage cover first on most rows
MIP_NODES = 50  # branch-and-bound nodes per MIP: bounds that do not change with the machine's load
MIP_UP_TO = 20_000  # kernels x stages; beyond, the MIPs take longer to build than to help
SMALL_GRAPH = 256  # kernels: the summaries report SliceGraph's slowest run up to this size


def pipeline_workloads(quick: bool, msr_fiddle_dir: str) -> list[tuple[str, str, str]]:
    """(group, MODEL, granularity) rows of the pipeline suite; msr-fiddle files where their folder exists."""
    fiddle = sorted(glob.glob(os.path.join(msr_fiddle_dir, "*_inference.json")))
    if not fiddle:
        log.warning("pipeline suite: no msr-fiddle files under %s; their rows are skipped", msr_fiddle_dir)
    if quick:
        return [("random", "random:kernels=16,seed=0", "fused"), ("zoo-operator", "resnet18", "operator")]
    return (
        [("zoo-fused", name, "fused") for name in ("resnet50", "inception_v3", "bert_base:layers=4", "gpt2:layers=4")]
        + [("zoo-operator", name, "operator") for name in ("resnet50", "mobilenet_v2", "bert_base:layers=4")]
        + [("randwire", f"randwire_ws:nodes={nodes},stages=1,seed=0", "fused") for nodes in (12, 32, 64, 88)]
        + [("msr-fiddle", path, "fused") for path in fiddle]
    )


def fiddle_accelerators(graph, fiddle_costs, count: int):
    """An msr-fiddle graph on ``count`` identical accelerators priced by its own profile (accelerator
    latency where supported, CPU latency elsewhere; each tensor's transfer its file's ``cost``): the
    pipeline problem of Archer et al. on their data. Their memory and CPU-only marks are dropped."""
    devices = [Device(f"acc{i}", {"kind": "cuda"}, f"cuda:{i}") for i in range(count)]
    links = {
        (a.name, b.name): Link(a.name, b.name, 0.0, float(HOST_BANDWIDTH_BPS))
        for a in devices
        for b in devices
        if a.name != b.name
    }
    platform = Platform(f"msr-fiddle acc{count}", devices, links)
    accelerator = next((d.name for d in fiddle_costs.platform.devices if d.kind != "cpu"), None)
    rows = {}
    for kernel in graph.kernels:
        seconds = fiddle_costs.compute_s(kernel, accelerator) if accelerator else math.inf
        if math.isinf(seconds):
            seconds = min(fiddle_costs.compute_s(kernel, d) for d in fiddle_costs.platform.device_names)
        rows[kernel] = {d.name: seconds for d in devices}
    free = OpGraph(
        [replace(k, allowed_devices=None) for k in graph.kernels.values()],
        graph.edges,
        inputs=graph.inputs,
        outputs=graph.outputs,
        weights={w: 0.0 for w in graph.weights},
        name=graph.name,
        attrs=graph.attrs,
    )
    return free, platform, TableCostModel(platform, rows)


def suite_pipeline(
    time_limit_s: float = TIME_LIMIT_S,
    bound_time_limit_s: float = BOUND_TIME_LIMIT_S,
    quick: bool = False,
    stages: tuple[int, ...] = PIPELINE_STAGES,
    mip_up_to: int = MIP_UP_TO,
    msr_fiddle_dir: str = MSR_FIDDLE_OPERATORS,
    mip_nodes: int = MIP_NODES,
    dp_ideals: int = DP_IDEALS,
) -> Iterator[Row]:
    """SliceGraph against the best lower bound on ``gpuK`` (K identical GPUs, roofline costs) for every K
    in ``stages`` with K <= kernels / 4: zoo models at fused and operator granularity, random-wired
    networks, and the msr-fiddle operator graphs on K accelerators priced by their own profiles.

    Per row: SliceGraph (``time_limit_s``) and its plan polished (``polish_pipeline``: windows of
    stages, then every cut along orders, re-cut by the DP, ``time_limit_s`` more); the downset DP
    where the graph has at most ``dp_ideals`` ideals, within ``bound_time_limit_s`` (its value bounds
    every plan; where its plan is proven optimal nothing more runs); the exact MIP
    warm-started from SliceGraph's plan, whose plan, when better, is the best partition found and
    whose proven bound counts; the stage cover, the three-superblock and guess-the-bottleneck
    relaxations; LB0 and the LP bound. Each MIP stops at ``mip_nodes`` branch-and-bound nodes, the
    stage cover at its own pricing budget, the exact MIP within ``bound_time_limit_s`` and the stage
    cover and the relaxations within as much again in all: where neither the DP nor a MIP reaches
    the clock first (``repeatable``), the bounds are the same on every run. The MIPs run only
    where kernels x K <= ``mip_up_to`` (beyond, their models take longer to build than to help). One
    summary row per K: the geometric mean of bound / best beside the paper's."""
    rows = []
    bar = progress(pipeline_workloads(quick, msr_fiddle_dir), desc="pipeline suite", unit="graph")
    for group, model, granularity in bar:
        bar.set_postfix_str(os.path.basename(model))
        found = load_graph(model, granularity=granularity)
        for count in (k for k in stages if k <= len(found.graph) / 4):
            if found.costs is not None:
                graph, platform, costs = fiddle_accelerators(found.graph, found.costs, count)
            else:
                graph, platform = found.graph, gpu_k(count)
                costs = RooflineCostModel(graph, platform)
            problem = Problem(graph, platform, costs, objective="pipeline", stages=count)
            row = {
                "suite": "pipeline",
                "group": group,
                "granularity": granularity,
                "model": os.path.basename(model) if found.costs is not None else model,
                **pipeline_solves(problem, time_limit_s, bound_time_limit_s, mip_up_to, mip_nodes, dp_ideals),
            }
            rows.append(row)
            yield row
    yield from pipeline_summaries(rows)


def pipeline_solves(
    problem: Problem,
    time_limit_s: float,
    bound_time_limit_s: float,
    mip_up_to: int,
    mip_nodes: int = MIP_NODES,
    dp_ideals: int = DP_IDEALS,
) -> Row:
    """One graph on K stages: SliceGraph and the downset DP, then (where the DP proves nothing and the
    graph is small enough) the exact MIP warm-started from SliceGraph and the MIP relaxations, against
    every lower bound."""
    graph, count = problem.graph, problem.stages
    sliced = get_solver("slicegraph", time_limit_s=time_limit_s).solve(problem)
    polished = polish_pipeline(problem, sliced, Deadline.after(time_limit_s))
    bounds = lower_bounds(problem)
    best, mip_s, notes = polished.value_s, None, ""
    began = time.perf_counter()
    solved = downset_bound(problem, Deadline(began + bound_time_limit_s), dp_ideals, polished.value_s)
    dp_s = time.perf_counter() - began
    stopped_by_time = int(solved is None and dp_s >= bound_time_limit_s)
    if solved is not None:
        bounds["downsets"] = solved.lower_bound_s
        if not solved.infeasible:
            best = min(best, solved.value_s)
    if solved is not None and solved.optimal:
        bound_s, notes = 0.0, "the downset DP proved its plan optimal"
    elif len(graph) * count <= mip_up_to:
        began = time.perf_counter()
        exact = solve_pipeline_mip(problem, Deadline.after(bound_time_limit_s), warm_start=sliced, max_nodes=mip_nodes)
        mip_s = time.perf_counter() - began
        best = min(best, exact.value_s)
        if exact.lower_bound_s is not None:
            bounds["exact_mip"] = exact.lower_bound_s
        began = time.perf_counter()
        stats: dict = {}
        options = {"exact_mip": False, "downsets": False, "max_nodes": mip_nodes, "stats": stats}
        bounds.update(pipeline_bounds(problem, Deadline.after(bound_time_limit_s), **options))
        bound_s = time.perf_counter() - began
        stopped_by_time += stats.get("stopped_by_time", 0) + exact.stopped_by_time
    else:
        bound_s, notes = 0.0, f"MIPs skipped: {len(graph)} kernels x {count} stages > {mip_up_to}"
    best_from = max(bounds, key=bounds.__getitem__)
    return {
        "kernels": len(graph),
        "stages": count,
        "slicegraph_value_s": sliced.value_s,
        "slicegraph_s": sliced.solve_s,
        "stopped": sliced.attrs.get("stopped"),
        "polished_value_s": polished.value_s,
        "downsets_value_s": None if solved is None else solved.value_s,
        "ideals": None if solved is None else solved.attrs["ideals"],
        "downsets_s": dp_s,
        "best_value_s": best,
        "mip_s": mip_s,
        "mip_nodes": mip_nodes,
        "repeatable": not stopped_by_time,
        "lower_bound_s": bounds[best_from],
        "bound_from": best_from,
        "bound_s": bound_s,
        "ratio": bounds[best_from] / best if best > 0 else 1.0,
        "slicegraph_ratio": bounds[best_from] / sliced.value_s if sliced.value_s > 0 else 1.0,
        **{f"bound_{name}_s": seconds for name, seconds in bounds.items()},
        "notes": notes,
    }


def pipeline_summaries(rows: list[Row]) -> list[Row]:
    """Per K: the geometric mean of bound / value over every graph, the paper's figure beside it, and
    SliceGraph's slowest run on graphs of at most 256 kernels."""
    summaries = []
    for count in sorted({row["stages"] for row in rows}):
        members = [row for row in rows if row["stages"] == count]
        small = [row["slicegraph_s"] for row in members if row["kernels"] <= SMALL_GRAPH]
        summaries.append(
            {
                "suite": "pipeline",
                "group": "summary",
                "stages": count,
                "graphs": len(members),
                "ratio_geomean": geomean(max(row["ratio"], 1e-12) for row in members),
                "slicegraph_ratio_geomean": geomean(max(row["slicegraph_ratio"], 1e-12) for row in members),
                "paper_ratio": PAPER_PIPELINE_RATIOS.get(count),
                "ratio_min": min(row["ratio"] for row in members),
                f"slicegraph_max_s_up_to_{SMALL_GRAPH}_kernels": max(small, default=None),
            }
        )
    return summaries
