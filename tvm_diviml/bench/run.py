"""The ``run`` suite: plans built and run for real on this machine, measured against their predictions
and against the best single-device configuration."""

from __future__ import annotations

from collections.abc import Iterator

from ..app.report import solve_and_report
from ..app.run import run_candidates, run_plan
from ..app.workload import load_workload
from ..modelspec import format_model_spec
from ..profiling.candidates import plan_key
from ..solvers import Problem
from ..zoo import SMALL_OPTIONS
from .common import log
from .suite import Row

RUN_TARGETS = {"measured_over_predicted": (0.85, 1.15), "concurrent_speedup": 1.6, "pipeline_speedup": 1.7}
TIME_LIMIT_S = 30.0
REPEATS = 10
PLATFORM = "cpu2"
CANDIDATES = 2


def run_workloads(quick: bool) -> list[tuple[str, str, str, int | None]]:
    """(case, MODEL, objective, stages) rows of the run suite: every zoo model at its small size for
    latency, the balanced two-branch model for concurrency, balanced chains as 2-stage pipelines, and
    streams of models of several kinds (``THROUGHPUT_MODELS``)."""
    names = ["resnet18", "bert_base"] if quick else sorted(n for n in SMALL_OPTIONS if n != "twin_branch")
    rows = [("predicted", format_model_spec(n, SMALL_OPTIONS[n]), "latency", None) for n in names]
    rows.append(("concurrent", "twin_branch", "latency", None))
    rows.append(("pipeline", "twin_branch:branches=1,depth=8", "pipeline", 2))
    if not quick:
        rows.append(("pipeline", format_model_spec("resnet18", SMALL_OPTIONS["resnet18"]), "pipeline", 2))
    rows += [("throughput", model, "throughput", None) for model in THROUGHPUT_MODELS[: 2 if quick else None]]
    return rows


# Streams of several kinds of model: CNNs at small sizes, an encoder, a decode step, parallel
# branches and a random-wired net (``run --objective throughput``: the kept plan of all it times).
THROUGHPUT_MODELS = [
    "mobilenet_v2:resolution=64",
    "resnet18:resolution=64",
    format_model_spec("bert_base", SMALL_OPTIONS["bert_base"]),
    "llama:layers=2,hidden=128,heads=4,kv_heads=2,intermediate=256,vocab=1000,step=decode,cache=32",
    "twin_branch",
    format_model_spec("randwire_ws", SMALL_OPTIONS["randwire_ws"]),
]


def suite_run(
    quick: bool = False,
    time_limit_s: float = TIME_LIMIT_S,
    repeats: int = REPEATS,
    platform: str = PLATFORM,
    candidates: int = CANDIDATES,
    case: str = "",
) -> Iterator[Row]:
    """Plans built and run for real on ``platform`` (measured costs): per zoo model the ``--solver
    auto`` plan, timed side by side with the other ``candidates`` and every single-device
    configuration (``run --candidates``: measured over predicted of the auto plan, and the kept
    plan against the best single device of the same rounds); the concurrent executor's speed-up on
    balanced parallel branches, and 2-stage pipelines' measured throughput, each against the best
    single-device configuration measured in the same run (targets: RUN_TARGETS). Kernel times come
    from the profile cache; each model is timed whole again here (``load_workload(runs_here=True)``)
    so that a prediction and its measurement see the machine alike: this VM's speed drifts by up to
    40% between runs minutes apart, more than the error the targets allow."""
    for kind, model, objective, stages in run_workloads(quick):
        if case and kind != case:
            continue
        workload = load_workload(model, platform, "measured", runs_here=True)  # runs here: timed whole now
        problem = Problem(workload.graph, workload.platform, workload.costs, objective=objective, stages=stages)
        plan, sim, row = solve_and_report(
            problem, "auto", model, "measured", time_limit_s=time_limit_s, replicas=objective == "throughput"
        )
        run, judged, winner = _timed(workload, problem, plan, sim.value_s, candidates, repeats)
        kept = winner.label if winner else None
        best_name, best_s = run.best_single_device
        yield {
            "suite": "run",
            "case": kind,
            "model": model,
            "objective": objective,
            "kernels": len(workload.graph),
            "solver": plan.solver,
            "devices_used": len(plan.devices_used()),
            "predicted_s": judged.predicted_s,
            "measured_s": judged.measured_s,
            "measured_over_predicted": judged.measured_s / judged.predicted_s,
            "kept": kept,
            "kept_devices": len(winner.plan.devices_used()) if kept else None,
            "kept_replicas": bool(winner.plan.replicas) if kept else None,
            "in_flight": run.in_flight,
            "best_single_device": best_name,
            "best_single_device_s": best_s,
            "speedup_over_best_single_device": run.speedup_over_best_single,
            "speedup_over_one_worker": run.speedup_over_one_worker,
            "max_rel_diff": run.max_rel_diff,
            "build_s": run.build_s,
        }


def _timed(workload, problem, plan, predicted_s: float, candidates: int, repeats: int):
    """The run of ``plan`` and whose prediction is on trial, with the candidate kept (None: the plan
    alone was run, for a pipeline). Latency and throughput: the ``candidates`` best plans and every
    single-device configuration side by side (``run --candidates``); latency judges the auto plan's
    prediction, a stream the kept plan's, as it runs."""
    loaded = workload.loaded
    if problem.objective not in ("latency", "throughput"):
        run, _ = run_plan(
            loaded.built, loaded.extraction, workload.platform, plan, predicted_s, repeats=repeats, progress=log.info
        )
        return run, run, None
    selection, run, _ = run_candidates(
        loaded.built, loaded.extraction, problem, plan, candidates, repeats=repeats, progress=log.info
    )
    winner = selection.winner
    auto = next(
        c
        for c in selection.candidates
        if plan_key(c.plan) == plan_key(plan) and c.threads is None and not c.default_schedules
    )
    return run, auto if problem.objective == "latency" else winner, winner
