"""The ``llm`` suite: the symmetric solver against the whole-graph solvers on LLaMA-style models
across servers (DiviML's LLM case: identical servers and identical blocks solved once)."""

from __future__ import annotations

from collections.abc import Iterator

from ..app.workload import load_graph
from ..cost.roofline import RooflineCostModel
from ..modelspec import parse_model_spec
from ..presets import get_platform
from ..solvers import Problem
from ..toolkit.incumbents import Event, Incumbents
from ..toolkit.mip_backend import new_model
from .common import progress, timed_solve
from .suite import Row

LLM_LAYERS = (8, 24, 48)
LLM_QUICK_MODEL = "llama:layers=8,hidden=128,intermediate=352"
LLM_PLATFORMS = ("servers:2xpaper-node", "servers:4xpaper-node")
LLM_OBJECTIVES = ("latency", "throughput")
# The whole-graph solvers the symmetric one is judged against (solvers.full_graph_solver's first). The
# "full" of symmetric_vs_full and speedup is the one with the best plan (on a tie, the faster).
LLM_FULL_SOLVERS = {"latency": ("split",), "throughput": ("milp", "split")}
LLM_TARGETS = {"symmetric_vs_full_pct": 2.0, "speedup": 50.0, "from_layers": 24}
TIME_LIMIT_S = 120.0
TIMED_OUT = 0.98  # a solve that used this share of its time limit counts as timed out


def llm_models(quick: bool) -> list[str]:
    """The llama zoo MODELs of the LLM suite: 8, 24 and 48 layers; quick, 8 layers at hidden 128."""
    return [LLM_QUICK_MODEL] if quick else [f"llama:layers={n}" for n in LLM_LAYERS]


def suite_llm(
    time_limit_s: float = TIME_LIMIT_S,
    quick: bool = False,
    models: list[str] | None = None,
    platforms: tuple[str, ...] = LLM_PLATFORMS,
    objectives: tuple[str, ...] = LLM_OBJECTIVES,
) -> Iterator[Row]:
    """The symmetric solver against the whole-graph solvers on LLaMA-style models across servers:
    per model, platform and objective, its simulated value, the full problem's lower bound,
    its gap and solve time beside each full solver's (``LLM_FULL_SOLVERS``, ``time_limit_s`` each,
    ``timed_out`` when they used it up). Targets (``LLM_TARGETS``): from 24 layers on, within 2% of the
    best full solver's plan and at least 50x faster than that solver. One summary row per objective.

    Pipelines are left out: the symmetric solver does latency and throughput only (SliceGraph, the
    pipeline solver, has no symmetric counterpart to compare). Each model is extracted once and its
    graph priced by the roofline for every platform; solves run one at a time, so their times compare
    (HiGHS is loaded before the first, which would otherwise pay for it alone)."""
    models = models or llm_models(quick)
    new_model("warm-up", "highs")  # HiGHS parses its C header once per process (~0.2 s): in no solver's time
    rows = []
    bar = progress(total=len(models) * len(platforms) * len(objectives), desc="llm suite", unit="row")
    for model in models:
        bar.set_postfix_str(f"extracting {model}")
        graph = load_graph(model).graph
        layers = parse_model_spec(model)[1].get("layers")
        for platform_name in platforms:
            platform = get_platform(platform_name)
            costs = RooflineCostModel(graph, platform)
            for objective in objectives:
                bar.set_postfix_str(f"{model} {platform_name} {objective}")
                problem = Problem(graph, platform, costs, objective=objective)
                row = {
                    "suite": "llm",
                    "model": model,
                    "layers": layers,
                    "kernels": len(graph),
                    "platform": platform_name,
                    "devices": len(platform.devices),
                    "objective": objective,
                    **llm_solves(problem, layers, time_limit_s),
                }
                rows.append(row)
                bar.update()
                yield row
    bar.close()
    yield from llm_summaries(rows)


def llm_solves(problem: Problem, layers: int | None, time_limit_s: float) -> Row:
    """The row's solver columns: the symmetric solver, then each full solver, timed one after another;
    the targets judged where the model has enough layers for them to apply."""
    full = LLM_FULL_SOLVERS[problem.objective]
    every_full = list(dict.fromkeys(name for names in LLM_FULL_SOLVERS.values() for name in names))
    notes: list[str] = []
    first: dict[str, Event | None] = {}

    def solve(name: str):
        """``timed_solve``, and when the solver offered its first plan (its own clock from the call)."""
        watch = Incumbents(problem)
        solved = timed_solve(name, problem, time_limit_s, notes, watch)
        first[name] = watch.first_plan()
        return solved

    symmetric, symmetric_s = solve("symmetric")
    results = {name: solve(name) for name in full}
    plans = {"symmetric": symmetric, **{name: plan for name, (plan, _) in results.items()}}
    bounds = {
        name: plan.lower_bound_s for name, plan in plans.items() if plan is not None and plan.lower_bound_s is not None
    }
    bound_from = max(bounds, key=bounds.__getitem__, default=None)
    value = symmetric.value_s if symmetric is not None else None
    row: Row = {
        "symmetric_value_s": value,
        "symmetric_bound_s": symmetric.lower_bound_s if symmetric is not None else None,
        "symmetric_gap": value / symmetric.lower_bound_s - 1
        if symmetric is not None and symmetric.lower_bound_s
        else None,
        "symmetric_solve_s": symmetric_s,
        "symmetric_first_plan_s": first["symmetric"].at_s if first["symmetric"] else None,
        "symmetric_first_value_s": first["symmetric"].value_s if first["symmetric"] else None,
        "symmetric_fallback": symmetric.attrs["symmetric"].get("fallback") if symmetric is not None else None,
        "best_bound_s": bounds.get(bound_from),
        "bound_from": bound_from,
    }
    for name in every_full:
        plan, seconds = results.get(name, (None, None))
        row.update(
            {
                f"{name}_value_s": plan.value_s if plan is not None else None,
                f"{name}_solve_s": seconds,
                f"{name}_first_plan_s": first[name].at_s if first.get(name) else None,
                f"{name}_timed_out": seconds >= time_limit_s * TIMED_OUT if seconds is not None else None,
                f"symmetric_vs_{name}_pct": percent_above(value, plan.value_s if plan is not None else None),
            }
        )
    solved = [name for name in full if results[name][0] is not None]
    reference = min(solved, key=lambda name: (results[name][0].value_s, results[name][1]), default=None)
    row.update(
        {
            "full_solver": reference,
            "symmetric_vs_full_pct": row[f"symmetric_vs_{reference}_pct"] if reference else None,
            "speedup": results[reference][1] / symmetric_s
            if reference and symmetric is not None and symmetric_s > 0
            else None,
            "first_plan_speedup": results[reference][1] / row["symmetric_first_plan_s"]
            if reference and row["symmetric_first_plan_s"]
            else None,
            "symmetric_first_vs_full_pct": percent_above(
                row["symmetric_first_value_s"], results[reference][0].value_s if reference else None
            ),
        }
    )
    targeted = (
        row["symmetric_vs_full_pct"] is not None
        and row["speedup"] is not None
        and (layers or 0) >= LLM_TARGETS["from_layers"]
    )
    row.update(
        {
            "meets_value_target": row["symmetric_vs_full_pct"] <= LLM_TARGETS["symmetric_vs_full_pct"]
            if targeted
            else None,
            "meets_speed_target": row["speedup"] >= LLM_TARGETS["speedup"] if targeted else None,
            "notes": "; ".join(notes),
        }
    )
    return row


def percent_above(value: float | None, reference: float | None) -> float | None:
    """How many percent ``value`` lies above ``reference``; None where either is missing."""
    return 100.0 * (value / reference - 1.0) if value is not None and reference else None


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
        summaries.append(
            {
                **dict.fromkeys(rows[0]),
                "suite": "llm",
                "model": "summary",
                "objective": objective,
                "symmetric_vs_full_pct": max(pcts, default=None),
                "speedup": min(speedups, default=None),
                "first_plan_speedup": min(
                    (row["first_plan_speedup"] for row in considered if row["first_plan_speedup"] is not None),
                    default=None,
                ),
                "meets_value_target": all(row["meets_value_target"] for row in judged) if judged else None,
                "meets_speed_target": all(row["meets_speed_target"] for row in judged) if judged else None,
                "notes": f"worst of {len(considered)} rows"
                + (f" with {LLM_TARGETS['from_layers']}+ layers" if judged else ""),
            }
        )
    return summaries
