"""Score a solved plan and describe it: the contract JSON row and the readable table.

Every number reported comes from the simulator; the solver's own claim is kept beside it
(``claimed_value_s``) so that a disagreement is visible.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from ..plan import Plan
from ..planning import Solved, plan_model
from ..problem import Problem
from ..simulator import Simulation
from ..tolerances import SOLVER_SLACK
from ..units import format_rate, format_seconds

log = logging.getLogger(__name__)


def solve_and_report(
    problem: Problem, solver: str, model: str, cost_source: str, **options
) -> tuple[Plan, Simulation, dict]:
    """``plan_model`` (options: ``time_limit_s``, ``seed``, ``bound_time_limit_s``, ``listener``) and the
    contract row of what it kept: the plan, its simulation and the row (with the solve's progress)."""
    solved = plan_model(problem, solver, **options)
    return solved.plan, solved.simulation, report_row(problem, solved, model, cost_source)


def report_row(problem: Problem, solved: Solved, model: str, cost_source: str) -> dict[str, Any]:
    """The contract row of one solve (docs/usage.md: ``--json``): its simulated value, the best bound and
    the gap, whether it is proven optimal, every baseline and the speed-up over the best single device;
    the solve's progress."""
    plan, sim, baselines, gap = solved.plan, solved.simulation, solved.baselines, solved.gap
    best_single = baselines.get("fastest_single_device")
    return {
        "model": model,
        "platform": problem.platform.name,
        "objective": problem.objective,
        "mode": sim.mode,
        "solver": plan.solver,
        "value_s": solved.value_s,
        "claimed_value_s": plan.value_s,
        "lower_bound_s": solved.bound_s,
        "lower_bound_parts": solved.bounds,
        "gap": gap,
        "solve_s": plan.solve_s,
        "optimal": solved.status == "optimal",
        "optimal_among": plan.optimal_among if plan.optimal and gap and gap > SOLVER_SLACK else None,
        "feasible": sim.feasible,
        "problems": sim.problems,
        "kernels": len(problem.graph),
        "edges": len(problem.graph.edges),
        "cost_source": cost_source,
        "cost_sources": {
            d: problem.costs.source(next(iter(problem.graph.kernels)), d) for d in problem.platform.device_names
        }
        if len(problem.graph)
        else {},
        "speedup_over_fastest_single_device": (best_single / solved.value_s)
        if best_single and solved.value_s > 0
        else None,
        "assignment": plan.assignment,
        "stages": plan.stages,
        "stage_devices": plan.stage_devices,
        "replicas": [{"kernels": len(group.kernels), "shares": group.shares} for group in plan.replicas],
        "kernels_per_device": _kernels_per_device(plan),
        "baselines": baselines,
        "device_busy_s": sim.device_busy_s,
        "memory_bytes": sim.memory_bytes,
        "device_graph_acyclic": sim.device_graph_acyclic,
        "symmetric": plan.attrs.get("symmetric"),
        "weaker_method": plan.attrs.get("weaker_method"),  # a solver that fell back says so
        "estimated_figures": estimated_figures(problem.platform),
        "kept_single_device": solved.kept_single_device,
        "replicated": solved.replicated,
        "interrupted": solved.status == "interrupted",
        "bounds_s": solved.bounds_s,
        "progress": [event.as_json() for event in solved.trace],
    }


def estimated_figures(platform) -> list[dict[str, Any]]:
    """The platform's figures that are estimates, not datasheets or measurements (``attrs.estimates``),
    with their values: a plan priced by them must say so."""
    return [
        {"device": device, "figure": figure, "value": getattr(platform.by_name[device], figure), "how": how}
        for device, notes in platform.estimates.items()
        if device in platform.by_name
        for figure, how in notes.items()
    ]


def _estimate_line(estimate: dict[str, Any]) -> str:
    """``cpu peak_flops 332.3 GFLOP/s: estimated (how)``."""
    unit = "FLOP" if estimate["figure"] == "peak_flops" else "B"
    return (
        f"{estimate['device']} {estimate['figure']} {format_rate(estimate['value'], unit)}: "
        f"estimated ({estimate['how']})"
    )


def _proof(row: dict[str, Any]) -> str:
    if not row["optimal"]:
        return ""
    among = row.get("optimal_among")
    return f" (proven optimal among {among}; the bound below holds for any placement)" if among else " (proven optimal)"


def _symmetric_line(found: dict[str, Any]) -> str:
    """What the symmetric solver reused: blocks, and how many each server took (or why it fell back)."""
    if "fallback" in found:
        return f"symmetric: fell back: {found['fallback']}"
    servers = "; ".join(
        f"{server} " + " + ".join(f"{run['blocks']} (anchor {run['anchor']}, groups of {run['group']})" for run in runs)
        for server, runs in found["servers"].items()
    )
    return (
        f"symmetric: {found['blocks']} blocks of {found['block_kernels']} kernels (head {found['head']}, "
        f"tail {found['tail']}), {found['candidates']} candidate placements of a group of blocks; "
        f"blocks per server: {servers}"
        + ("; the whole-graph throughput MILP then improved that plan" if found.get("improved_by_milp") else "")
    )


def _kernels_per_device(plan: Plan) -> dict[str, int]:
    """Kernels each device runs: its own, and a replica group's on every device that takes a share."""
    counts = Counter(plan.assignment.values())
    for group in plan.replicas:
        for kernel in group.kernels:
            counts.update(d for d in group.shares if d != plan.assignment[kernel])
    return dict(counts)


def _replicas_line(group: dict[str, Any]) -> str:
    """One replica group: its kernels and each device's share of the stream."""
    shares = ", ".join(
        f"{device} {100 * share:.0f}%" for device, share in sorted(group["shares"].items(), key=lambda item: -item[1])
    )
    return (
        f"replicas: {group['kernels']} kernels on {len(group['shares'])} devices, shares of the stream: {shares} "
        "(run builds one executable per route of an input)"
    )


def _cost_sources(sources: dict[str, str]) -> str:
    """Each device's cost source; past four devices, by source with a count, so that a platform of
    64 devices keeps a one-line header."""
    if len(sources) <= 4:
        return ", ".join(f"{device} {source}" for device, source in sources.items())
    by_source: dict[str, list[str]] = {}
    for device, source in sources.items():
        by_source.setdefault(source, []).append(device)
    return ", ".join(
        f"{devices[0]} {source}" if len(devices) == 1 else f"{len(devices)} devices {source}"
        for source, devices in by_source.items()
    )


def format_row(row: dict[str, Any], platform_devices: list[str]) -> str:
    """A readable summary of one plan row."""
    what = "latency" if row["objective"] == "latency" else "period"
    lines = [
        f"model {row['model']}: {row['kernels']} kernels, {row['edges']} edges; platform {row['platform']}; "
        f"costs: {row['cost_source']} ({_cost_sources(row['cost_sources'])})",
        f"objective {row['objective']} (mode {row['mode']}), solver {row['solver']}, solved in "
        f"{row['solve_s']:.3f} s{_proof(row)}"
        + (f", bounds in {row['bounds_s']:.1f} s" if row.get("bounds_s", 0) >= 1 else "")
        + (", stopped by an interrupt: the best plan found until then" if row.get("interrupted") else ""),
        f"{what}: {format_seconds(row['value_s'])}   lower bound: {format_seconds(row['lower_bound_s'])}   gap: "
        + (f"{100 * row['gap']:.1f}%" if row["gap"] is not None else "-"),
    ]
    if row["objective"] != "latency" and row["value_s"] > 0:
        lines[-1] += f"   throughput: {1 / row['value_s']:.2f} /s"
    lines += [
        _estimate_line(estimate)
        for estimate in row.get("estimated_figures", [])
        if row["cost_sources"].get(estimate["device"], "estimated") == "estimated"  # priced by the figure
    ]
    others = {name: value for name, value in row["baselines"].items() if not name.startswith("single:")}
    if others:
        lines.append("baselines: " + ", ".join(f"{name} {format_seconds(value)}" for name, value in others.items()))
    if row["speedup_over_fastest_single_device"] is not None:
        lines.append(f"speed-up over the fastest single device: {row['speedup_over_fastest_single_device']:.2f}x")
    elif row["baselines"].get("fastest_single_device") is None:
        lines.append(
            "no single device can run the whole model (memory or allowed devices): no single-device "
            "baseline, the plan must split it"
        )
    if row["objective"] == "throughput" and not row["device_graph_acyclic"]:
        lines.append(
            "the device graph has a cycle (tensors return to a device they came from): not a linear "
            "pipeline; it runs with several inputs in flight"
        )
    if row.get("symmetric"):
        lines.append(_symmetric_line(row["symmetric"]))
    if row.get("kept_single_device"):
        lines.append(row["kept_single_device"])
    if row.get("replicated"):
        lines.append(row["replicated"])
    lines += [_replicas_line(group) for group in row.get("replicas", [])]
    if row.get("weaker_method"):
        lines.append(row["weaker_method"])
    if not row["feasible"]:
        lines.append("INFEASIBLE: " + "; ".join(row["problems"][:5]))
    counts = row.get("kernels_per_device") or Counter(row["assignment"].values())
    lines.append("")
    lines.append(f"{'device':<14}{'kernels':>8}{'busy':>14}{'memory MiB':>12}{'alone':>14}")
    for device in platform_devices:
        alone = row["baselines"].get(f"single:{device}")
        lines.append(
            f"{device:<14}{counts.get(device, 0):>8}{format_seconds(row['device_busy_s'].get(device, 0.0)):>14}"
            f"{row['memory_bytes'].get(device, 0.0) / 2**20:>12.1f}"
            f"{(format_seconds(alone) if alone is not None else 'does not fit'):>14}"
        )
    if row["stages"]:
        lines.append("")
        for index, (stage, device) in enumerate(zip(row["stages"], row["stage_devices"] or [])):
            lines.append(f"stage {index}: {len(stage)} kernels on {device}")
    return "\n".join(lines)
