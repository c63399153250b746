"""The ``msr-fiddle`` suite: the max-load problem of Tarnawski et al. (2020) on their own graphs, and
the human experts' splits scored by the same simulator beside ours."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator

from ..bounds import lower_bound
from ..jsonio import read_json
from ..msr_fiddle import read_expert_split, read_msr_fiddle
from ..simulator import simulate
from ..solvers import Problem, get_solver
from .common import MSR_FIDDLE_DIR, log
from .suite import Row

TIME_LIMIT_S = 300.0  # the downset DP, per graph
SLICEGRAPH_TIME_LIMIT_S = 60.0
QUICK_SLICEGRAPH_TIME_LIMIT_S = 2.0
QUICK_GRAPHS = 2  # the smallest, by node count
MAX_IDEALS = 50_000  # beyond, the DP falls back to SliceGraph


def suite_msr_fiddle(
    time_limit_s: float = TIME_LIMIT_S,
    slicegraph_time_limit_s: float = SLICEGRAPH_TIME_LIMIT_S,
    max_ideals: int = MAX_IDEALS,
    quick: bool = False,
    msr_fiddle_dir: str = MSR_FIDDLE_DIR,
) -> Iterator[Row]:
    """The msr-fiddle max-load problem (Tarnawski et al. 2020, mode host_staged) on every
    ``throughput-inputs/*/*_inference.json``: the downset DP (exact where the ideals fit under
    ``max_ideals`` and ``time_limit_s``; SliceGraph otherwise), SliceGraph on its own, our best lower
    bound (bounds.lower_bound, raised to the DP optimum where exact: that optimum bounds every ordered
    contiguous split) and the gap; then each ``human-experts/*_inference_expert.json`` split scored by
    the same simulator beside ours, matched to the graph file that has exactly its node ids. ``quick``:
    the two smallest graphs, SliceGraph for 2 s."""
    files = sorted(glob.glob(os.path.join(msr_fiddle_dir, "throughput-inputs", "*", "*_inference.json")))
    if not files:
        log.warning("msr-fiddle suite: no files under %s; skipped", msr_fiddle_dir)
        return
    if quick:
        files = sorted(files, key=lambda path: len(read_json(path)["nodes"]))[:QUICK_GRAPHS]
        slicegraph_time_limit_s = min(slicegraph_time_limit_s, QUICK_SLICEGRAPH_TIME_LIMIT_S)
    ours: dict[frozenset, tuple[str, float, object]] = {}  # node ids -> (file, our best value, graph data)
    for path in files:
        name = os.path.relpath(path, os.path.join(msr_fiddle_dir, "throughput-inputs"))
        data = read_json(path)
        graph, platform, costs = read_msr_fiddle(data, name)
        problem = Problem(graph, platform, costs, objective="throughput")
        downsets = get_solver(
            "downsets",
            time_limit_s=time_limit_s,
            max_ideals=max_ideals,
            fallback_options={"time_limit_s": slicegraph_time_limit_s},
        ).solve(problem)
        slicegraph = get_solver("slicegraph", time_limit_s=slicegraph_time_limit_s).solve(problem)
        exact = downsets.method == "downset DP" and downsets.optimal
        bound = lower_bound(problem)
        best_bound = max(bound, downsets.value_s) if exact else bound
        best = min(downsets.value_s, slicegraph.value_s)
        ours[frozenset(str(n["id"]) for n in data["nodes"])] = (name, best, (graph, platform, costs))
        yield {
            "suite": "msr-fiddle",
            "model": name,
            "kernels": len(graph),
            "accelerators": int(data["maxFPGAs"]),
            "cpus": int(data["maxCPUs"]),
            "ideals": downsets.attrs.get("ideals"),
            "dp_exact": exact,
            "downsets_value_s": downsets.value_s,
            "downsets_s": downsets.solve_s,
            "downsets_method": downsets.method,
            "fallback_reason": downsets.attrs.get("fallback_reason"),
            "slicegraph_value_s": slicegraph.value_s,
            "slicegraph_s": slicegraph.solve_s,
            "lower_bound_s": bound,
            "contiguous_optimum_s": downsets.value_s if exact else None,
            "best_bound_s": best_bound,
            "gap": best / best_bound - 1 if best_bound > 0 else None,
        }
    yield from expert_rows(msr_fiddle_dir, ours)


def expert_rows(msr_fiddle_dir: str, ours: dict[frozenset, tuple[str, float, object]]) -> Iterator[Row]:
    """Each human expert's split scored by our simulator beside our best value on the same graph
    (``ours``: node ids -> (graph file, our best value, (graph, platform, costs)))."""
    for path in sorted(glob.glob(os.path.join(msr_fiddle_dir, "human-experts", "*_inference_expert.json"))):
        split = read_json(path)
        ids = frozenset(str(n) for key in ("cpus", "fpgas") for group in split.get(key, []) for n in group["nodes"])
        if ids not in ours:
            log.warning(
                "msr-fiddle suite: no inference graph has exactly the %d nodes of %s; skipped",
                len(ids),
                os.path.basename(path),
            )
            continue
        name, best, (graph, platform, costs) = ours[ids]
        sim = simulate(Problem(graph, platform, costs), read_expert_split(split, graph, platform))
        yield {
            "suite": "msr-fiddle",
            "model": os.path.basename(path),
            "graph": name,
            "kernels": len(graph),
            "expert_value_s": sim.value_s,
            "expert_feasible": sim.feasible,
            "expert_contiguous": sim.device_graph_acyclic,
            "ours_value_s": best,
            "ours_over_expert": best / sim.value_s if sim.value_s > 0 else None,
        }
