"""The ``latency`` suite: every latency solver side by side, each judged against the best lower bound."""

from __future__ import annotations

import glob
import os
from collections import Counter
from collections.abc import Iterator

from ..app.workload import load_workload
from ..bounds import lower_bounds
from ..errors import DivimlInputError
from ..solvers import SOLVERS, Problem
from .common import MSR_FIDDLE_DIR, geomean, log, progress, timed_solve
from .suite import Row

LATENCY_SOLVERS = ("fastest_single_device", "greedy", "heft", "split", "milp", "cpsat")
EXACT_SOLVERS = ("milp", "cpsat")
MSR_FIDDLE_LATENCY = os.path.join(MSR_FIDDLE_DIR, "latency-inputs")
LATENCY_RATIOS = (
    "split_over_best",
    "split_over_heft",
    "split_over_greedy",
    "split_time_over_milp",
    "speedup_over_single",
    "bound_over_best",
)
LATENCY_GROUPS = ("random", "msr-fiddle", "zoo", "randwire")
RANDOM_KERNELS, RANDOM_SEEDS = (24, 32, 40), 10
ZOO_LATENCY = ("resnet50", "inception_v3", "bert_base", "gpt2", "vit_b16", "mobilenet_v2", "llama:layers=8")
TIME_LIMIT_S = 60.0
EXACT_UP_TO = 80  # kernels; the exact solvers skip larger graphs (see suite_latency)
PLATFORM, COSTS = "paper-node", "roofline"  # msr-fiddle files carry their own


def latency_workloads(quick: bool, msr_fiddle_dir: str, groups: list[str] | None = None) -> list[tuple[str, str]]:
    """(group, MODEL) rows of the latency suite, of ``groups`` only when given; msr-fiddle files only
    where their folder exists."""
    for group in groups or ():
        if group not in LATENCY_GROUPS:
            raise DivimlInputError(
                f"unknown latency group '{group}'", field="groups", hint=f"use some of {', '.join(LATENCY_GROUPS)}"
            )
    return [row for row in _latency_rows(quick, msr_fiddle_dir) if groups is None or row[0] in groups]


def _latency_rows(quick: bool, msr_fiddle_dir: str) -> list[tuple[str, str]]:
    """Every (group, MODEL) row."""
    fiddle = sorted(glob.glob(os.path.join(msr_fiddle_dir, "*", "*.json")))
    if not fiddle:
        log.warning("latency suite: no msr-fiddle files under %s; their rows are skipped", msr_fiddle_dir)
    if quick:
        return [("random", f"random:kernels={n},seed=0") for n in (6, 8)] + [
            ("msr-fiddle", path) for path in sorted(fiddle, key=os.path.getsize)[:1]
        ]
    return (
        [("random", f"random:kernels={n},seed={seed}") for n in RANDOM_KERNELS for seed in range(RANDOM_SEEDS)]
        + [("msr-fiddle", path) for path in fiddle]
        + [("zoo", name) for name in ZOO_LATENCY]
        + [
            ("randwire", f"randwire_{kind}:nodes={nodes},seed={seed}")
            for kind in ("ws", "er", "ba")
            for nodes in (8, 16, 32)
            for seed in (0, 1, 2)
        ]
    )


def suite_latency(
    time_limit_s: float = TIME_LIMIT_S,
    exact_up_to: int = EXACT_UP_TO,
    solvers: list[str] | None = None,
    quick: bool = False,
    msr_fiddle_dir: str = MSR_FIDDLE_LATENCY,
    groups: list[str] | None = None,
) -> Iterator[Row]:
    """Every latency solver side by side on random DAGs, msr-fiddle graphs, zoo models and random-wired
    networks, each judged against the row's best lower bound; one geometric-mean row per group at the end.

    The exact solvers (``EXACT_SOLVERS``) skip graphs of more than ``exact_up_to`` kernels. Measured with
    60 s: on the 74-79-kernel randwire graphs CP-SAT proved 4 of 9 optima and raised the bound by 19-50%
    (MILP proved 1); both build a 290-kernel model in seconds, but a minute of search there rarely beats
    HEFT, and 783 kernels on 16 devices would need 3.5 million big-M rows."""
    if solvers is None:
        solvers = [name for name in LATENCY_SOLVERS if name in SOLVERS]
        if "cpsat" not in SOLVERS:
            log.warning("latency suite: solver cpsat is not available; its columns are left out")
    for name in solvers:
        if name not in SOLVERS:
            raise DivimlInputError(f"unknown solver '{name}'", field="solvers", hint=f"available: {', '.join(SOLVERS)}")
    rows = []
    bar = progress(latency_workloads(quick, msr_fiddle_dir, groups), desc="latency suite", unit="row")
    for group, model in bar:
        bar.set_postfix_str(os.path.basename(model))
        row = latency_row(group, model, solvers, time_limit_s, exact_up_to, msr_fiddle_dir)
        rows.append(row)
        yield row
    yield from latency_summaries(rows)


def latency_summaries(rows: list[Row]) -> list[Row]:
    """Per group, a row with the same columns holding the geometric mean of each ratio column."""
    summaries = []
    for group in dict.fromkeys(row["group"] for row in rows):
        members = [row for row in rows if row["group"] == group]
        summary = {
            **dict.fromkeys(members[0]),
            "suite": "latency",
            "group": group,
            "model": f"geomean of {len(members)} rows",
            "notes": "summary",
        }
        for key in LATENCY_RATIOS:
            summary[key] = geomean(row[key] for row in members if row[key] is not None)
        summaries.append(summary)
    return summaries


def latency_row(
    group: str, model: str, solvers: list[str], time_limit_s: float, exact_up_to: int, msr_fiddle_dir: str
) -> Row:
    """One workload: every solver's simulated latency, time and proof, against the best lower bound."""
    fiddle = group == "msr-fiddle"  # carries its own devices and costs
    workload = load_workload(model, None if fiddle else PLATFORM, None if fiddle else COSTS)
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="latency")
    graph = problem.graph
    bounds = lower_bounds(problem)
    results: dict[str, tuple[float, float, bool]] = {}
    plans = {}
    notes = []
    skipped = [name for name in solvers if name in EXACT_SOLVERS and len(graph) > exact_up_to]
    if skipped:
        notes.append(f"{', '.join(skipped)} skipped ({len(graph)} kernels > {exact_up_to})")
    for name in solvers:
        if name in skipped:
            continue
        plan, seconds = timed_solve(name, problem, time_limit_s, notes)
        if plan is None:
            continue
        if plan.lower_bound_s is not None:
            bounds[name] = plan.lower_bound_s
        results[name] = (plan.value_s, seconds, plan.optimal)
        plans[name] = plan
    bound_from = max(bounds, key=bounds.__getitem__)
    bound = bounds[bound_from]
    values = {name: result[0] for name, result in results.items()}
    best_solver = min(values, key=values.__getitem__, default=None)
    best = values.get(best_solver)
    row = {
        "suite": "latency",
        "group": group,
        "model": os.path.relpath(model, msr_fiddle_dir) if fiddle else model,
        "kernels": len(graph),
        "edges": len(graph.edges),
        "devices": len(problem.platform.devices),
        "lower_bound_s": bound,
        "bound_from": bound_from,
        "best_value_s": best,
        "best_solver": best_solver,
        "best_devices": kernels_per_device(plans[best_solver], problem.platform) if best_solver else None,
    }
    for name in solvers:
        value, seconds, optimal = results.get(name, (None, None, None))
        row.update(
            {
                f"{name}_value_s": value,
                f"{name}_solve_s": seconds,
                f"{name}_optimal": optimal,
                f"{name}_gap": value / bound - 1.0 if value is not None and bound > 0 else None,
            }
        )
    split = values.get("split")
    row.update(
        split_over_best=_ratio(split, best),
        split_over_heft=_ratio(split, values.get("heft")),
        split_over_greedy=_ratio(split, values.get("greedy")),
        split_time_over_milp=_ratio(row.get("split_solve_s"), row.get("milp_solve_s")),
        speedup_over_single=_ratio(values.get("fastest_single_device"), best),
        bound_over_best=_ratio(bound, best),
        notes="; ".join(notes),
    )
    return row


def kernels_per_device(plan, platform) -> str:
    """How many kernels ``plan`` places on each device it uses, in the platform's order ("cpu 12, gpu0 40"):
    where a plan leaves a device idle (a CPU too slow to help) shows at a glance."""
    counts = Counter(plan.assignment.values())
    return ", ".join(f"{name} {counts[name]}" for name in platform.device_names if counts[name])


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None where either is missing (a solver that gave no plan)."""
    return numerator / denominator if numerator is not None and denominator else None
