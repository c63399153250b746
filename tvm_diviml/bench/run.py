"""The ``run`` suite: plans built and run for real on this machine, measured against their predictions
and against the best single-device configuration."""

from __future__ import annotations

from collections.abc import Iterator

from ..app.report import solve_and_report
from ..app.workload import load_workload
from ..candidates import plan_key
from ..modelspec import format_model_spec
from ..solvers import Problem
from ..zoo import SMALL_OPTIONS
from .common import log
from .suite import QUICK, Option, Row, Suite, time_limit

RUN_TARGETS = {"measured_over_predicted": (0.85, 1.15), "concurrent_speedup": 1.6, "pipeline_speedup": 1.7}
TIME_LIMIT_S = 30.0
REPEATS = 10
PLATFORM = "cpu2"
CANDIDATES = 2


def run_workloads(quick: bool) -> list[tuple[str, str, str, int | None]]:
    """(case, MODEL, objective, stages) rows of the run suite: every zoo model at its small size for
    latency, the balanced two-branch model for concurrency, balanced chains as 2-stage pipelines."""
    names = ["resnet18", "bert_base"] if quick else sorted(n for n in SMALL_OPTIONS if n != "twin_branch")
    rows = [("predicted", format_model_spec(n, SMALL_OPTIONS[n]), "latency", None) for n in names]
    rows.append(("concurrent", "twin_branch", "latency", None))
    rows.append(("pipeline", "twin_branch:branches=1,depth=8", "pipeline", 2))
    if not quick:
        rows.append(("pipeline", format_model_spec("resnet18", SMALL_OPTIONS["resnet18"]), "pipeline", 2))
    return rows


def suite_run(
    quick: bool = False,
    time_limit_s: float = TIME_LIMIT_S,
    repeats: int = REPEATS,
    platform: str = PLATFORM,
    candidates: int = CANDIDATES,
) -> Iterator[Row]:
    """Plans built and run for real on ``platform`` (measured costs): per zoo model the ``--solver
    auto`` plan, timed side by side with the other ``candidates`` and every single-device
    configuration (``run --candidates``: measured over predicted of the auto plan, and the kept
    plan against the best single device of the same rounds); the concurrent executor's speed-up on
    balanced parallel branches, and 2-stage pipelines' measured throughput, each against the best
    single-device configuration measured in the same run (targets: RUN_TARGETS). Kernel times come
    from the profile cache; each model is timed whole again here (``calibrate_in_context(fresh=True)``)
    so that a prediction and its measurement see the machine alike: this VM's speed drifts by up to
    40% between runs minutes apart, more than the error the targets allow."""
    from ..app.run import run_candidates, run_plan  # import TVM: only when it runs
    from ..passes.timing import calibrate_in_context

    for case, model, objective, stages in run_workloads(quick):
        workload = load_workload(model, platform, "measured")
        loaded = workload.loaded
        calibrate_in_context(workload.costs, loaded.built, loaded.extraction, fresh=True)
        problem = Problem(workload.graph, workload.platform, workload.costs, objective=objective, stages=stages)
        plan, sim, row = solve_and_report(problem, "auto", model, "measured", time_limit_s=time_limit_s)
        kept = None
        if objective == "latency":
            selection, run, _ = run_candidates(
                loaded.built, loaded.extraction, problem, plan, candidates, repeats=repeats, progress=log.info
            )
            auto = next(
                c
                for c in selection.candidates
                if plan_key(c.plan) == plan_key(plan) and c.threads is None and not c.default_schedules
            )
            predicted_s, measured_s, kept = auto.predicted_s, auto.measured_s, selection.winner.label
        else:
            run, _ = run_plan(
                loaded.built,
                loaded.extraction,
                workload.platform,
                plan,
                sim.value_s,
                repeats=repeats,
                progress=log.info,
            )
            predicted_s, measured_s = run.predicted_s, run.measured_s
        best_name, best_s = run.best_single_device
        yield {
            "suite": "run",
            "case": case,
            "model": model,
            "objective": objective,
            "kernels": len(workload.graph),
            "solver": plan.solver,
            "devices_used": len(plan.devices_used()),
            "predicted_s": predicted_s,
            "measured_s": measured_s,
            "measured_over_predicted": measured_s / predicted_s,
            "kept": kept,
            "best_single_device": best_name,
            "best_single_device_s": best_s,
            "speedup_over_best_single_device": run.speedup_over_best_single,
            "speedup_over_one_worker": run.speedup_over_one_worker,
            "max_rel_diff": run.max_rel_diff,
            "build_s": run.build_s,
        }


SUITE = Suite(
    "run",
    "plans built and run on this machine: measured against predicted and the best single device",
    suite_run,
    (
        QUICK,
        time_limit(TIME_LIMIT_S),
        Option("repeats", int, REPEATS, "timed inferences per plan"),
        Option("platform", str, PLATFORM, "a preset whose devices this machine has"),
        Option("candidates", int, CANDIDATES, "plans timed side by side with the auto plan"),
    ),
)
