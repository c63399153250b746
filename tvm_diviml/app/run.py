"""Plan, build and really run a model on this machine's devices; measured against predicted.

What ``diviml run`` and the ``run`` benchmark suite do: build the placement, check its outputs against
the single-device reference build, time it — one inference at a time on the concurrent executor for
latency, a stream with several inputs in flight for throughput and pipelines — and time the same model
on each single-device configuration, so that the speed-up is measured side by side in one run.
``run_candidates`` does the same for several candidate plans and keeps the fastest measured
(``tvm_diviml.profiling.timing.choose_by_measurement``). ``run_model`` is the whole job of ``diviml run``
on this machine, from a MODEL string to a ``RunReport`` (``app.rpc_run.run_rpc``: across servers).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tvm_diviml.plan import Plan
from tvm_diviml.platform import Platform
from tvm_diviml.problem import Problem
from tvm_diviml.profiling.candidates import Selection, format_selection
from tvm_diviml.runtime.vm import PlacedExecutable
from tvm_diviml.simulator import simulate, stream_price
from tvm_diviml.tolerances import OutputComparison
from tvm_diviml.toolkit.incumbents import Event
from tvm_diviml.units import format_seconds
from tvm_diviml.zoo import BuiltModel
from tvm_diviml.zoo.reference import run_reference

from ..passes.extract import Extraction
from ..profiling.fallback_time import fallback_hotspots
from ..profiling.timing import (
    BuildTiming,
    build_runnable,
    choose_by_measurement,
    single_device_configurations,
    time_build,
    time_single_devices,
    timing_key,
)
from ..profiling.tuning import open_database
from .dataparallel import batch_split_workloads, build_split, format_batch_splits, solve_batch_splits
from .job import AS_GIVEN, LoadOptions, SolveOptions, runnable_workload, solve_workload
from .reference import FrameworkRun, build_outputs, check_against, check_reference, run_framework
from .workload import Workload


@dataclass(kw_only=True)
class MeasuredRun:
    """What any real run of a plan measured, here or across servers: what ``headline`` reports, its
    outputs against the reference and its time against the simulator's."""

    objective: str
    predicted_s: float | None  # the simulator's latency or period (None: a configuration it has no device for)
    measured_s: float  # median latency, or seconds per inference of the stream
    outputs: OutputComparison  # against the single-device reference
    device_busy_s: dict[str, float]  # per inference
    build_s: float
    in_flight: int = 1
    samples_s: list[float] = field(default_factory=list)

    @property
    def max_abs_diff(self) -> float:
        return self.outputs.max_abs_diff

    @property
    def max_rel_diff(self) -> float:
        return self.outputs.max_rel_diff

    @property
    def measured_over_predicted(self) -> float | None:
        return ratio(self.measured_s, self.predicted_s)

    def headline_json(self) -> dict[str, Any]:
        """The keys that open both reports' JSON, in their order."""
        return {
            "objective": self.objective,
            "predicted_s": self.predicted_s,
            "measured_s": self.measured_s,
            "measured_over_predicted": self.measured_over_predicted,
            "max_abs_diff": self.max_abs_diff,
            "max_rel_diff": self.max_rel_diff,
            "nonfinite_unmatched": self.outputs.misplaced,
        }


@dataclass(kw_only=True)
class RunMeasurement(MeasuredRun):
    """What one real run of a plan on this machine measured, with the single-device configurations."""

    single_device_s: dict[str, float]  # configuration -> measured seconds per inference, one at a time
    one_worker: str  # the configuration that is "one worker" (the fastest device alone)
    executor: str = "concurrent"  # "concurrent" (a worker per device) or "single VM" (a one-device plan)
    singles_timed: str = "one inference at a time"  # how single_device_s was measured

    @property
    def best_single_device(self) -> tuple[str, float]:
        name = min(self.single_device_s, key=self.single_device_s.__getitem__)
        return name, self.single_device_s[name]

    @property
    def speedup_over_best_single(self) -> float | None:
        return ratio(self.best_single_device[1], self.measured_s)

    @property
    def speedup_over_one_worker(self) -> float | None:
        return ratio(self.single_device_s[self.one_worker], self.measured_s)

    def to_json(self) -> dict[str, Any]:
        best_name, best_s = self.best_single_device
        return {
            **self.headline_json(),
            "device_busy_s": self.device_busy_s,
            "single_device_s": self.single_device_s,
            "best_single_device": best_name,
            "speedup_over_best_single_device": self.speedup_over_best_single,
            "one_worker": self.one_worker,
            "speedup_over_one_worker": self.speedup_over_one_worker,
            "build_s": self.build_s,
            "in_flight": self.in_flight,
            "samples_s": self.samples_s,
            "executor": self.executor,
            "single_device_timed": self.singles_timed,
        }


def predicted_run(problem, plan: Plan, in_flight: int | None = None) -> tuple[float, int | None]:
    """What a run of ``plan`` is predicted to take, and the inputs in flight it runs at: the latency
    (one at a time: None), or the period of its stream as the executor runs it
    (``simulator.stream_price``, at ``in_flight``, or at the number it chooses)."""
    if plan.objective == "latency":
        return simulate(problem, plan).value_s, None
    price = stream_price(problem, plan, in_flight)
    return price.period_s, price.in_flight


def run_plan(
    model: BuiltModel,
    extraction: Extraction,
    platform: Platform,
    plan: Plan,
    predicted_s: float | None,
    *,
    repeats: int = 5,
    stream_inputs: int = 16,
    in_flight: int | None = None,
    database=None,
    progress=print,
    threads: int | None = None,
    built: tuple[PlacedExecutable, float] | None = None,
) -> tuple[RunMeasurement, PlacedExecutable]:
    """Build ``plan`` (unless ``built`` gives the build and its seconds), check it against the reference,
    and time it and the single-device configurations. ``threads``: a one-device plan's CPU pool."""
    built, build_s = built or build_runnable(model, extraction, platform, plan, database=database, progress=progress)
    inputs = model.sample_inputs()
    reference = run_reference(model, inputs)
    configurations = time_single_devices(model, extraction, platform, inputs, repeats, database)
    as_platform_has_them = [
        n for n, (device, threads) in single_device_configurations(platform).items() if threads == device.num_threads
    ]
    one_worker = min(as_platform_has_them, key=configurations.__getitem__)
    timing = time_build(
        built,
        model,
        plan.objective,
        reference,
        repeats=repeats,
        stream_inputs=stream_inputs,
        in_flight=in_flight,
        threads=threads,
    )
    return _measurement(plan.objective, predicted_s, timing, configurations, one_worker, build_s), built


def run_candidates(
    model: BuiltModel,
    extraction: Extraction,
    problem,
    chosen: Plan,
    count: int,
    *,
    repeats: int = 5,
    stream_inputs: int = 16,
    in_flight: int | None = None,
    database=None,
    rtol: float | None = None,
    progress=print,
) -> tuple[Selection, RunMeasurement, PlacedExecutable]:
    """``choose_by_measurement``, and the winner's run as ``run_plan`` reports one, from the same
    measurements: its time and the single-device configurations' come from one side-by-side run."""
    selection, builds, timings = choose_by_measurement(
        model,
        extraction,
        problem,
        chosen,
        count,
        repeats=repeats,
        stream_inputs=stream_inputs,
        in_flight=in_flight,
        database=database,
        rtol=rtol,
        progress=progress,
    )
    winner = selection.winner
    built, build_s = builds[timing_key(winner)]
    timing = timings[timing_key(winner)]
    configurations = single_device_configurations(problem.platform)
    singles = [c for c in selection.candidates if c.label in configurations or c.default_schedules]
    single = {c.label: c.measured_s for c in singles}
    one_worker = min((c.label for c in singles if c.threads is None), key=single.__getitem__)
    run = _measurement(problem.objective, winner.predicted_s, timing, single, one_worker, build_s)
    if problem.objective != "latency":
        run.singles_timed = "a stream each, side by side with the plans"
    return selection, run, built


def _measurement(
    objective: str,
    predicted_s: float | None,
    timing: BuildTiming,
    single_device_s: dict[str, float],
    one_worker: str,
    build_s: float,
) -> RunMeasurement:
    """A build's timing as the run report has it, beside the single-device configurations'."""
    return RunMeasurement(
        objective=objective,
        predicted_s=predicted_s,
        measured_s=timing.measured_s,
        outputs=timing.outputs,
        device_busy_s=timing.busy_s,
        single_device_s=single_device_s,
        one_worker=one_worker,
        build_s=build_s,
        in_flight=timing.in_flight,
        samples_s=timing.samples_s,
        executor=timing.executor,
    )


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator`` where both are times (positive and finite), else None: a report
    prints "-" then, never "inf" or "nan"."""
    times = (numerator, denominator)
    if any(t is None or not math.isfinite(t) or t <= 0 for t in times):
        return None
    return numerator / denominator


def format_ratio(value: float | None, unit: str = "x") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def format_time(seconds: float | None) -> str:
    """Seconds as a report prints them; "-" where no time was measured (None, or not finite)."""
    return format_seconds(seconds if seconds is not None and math.isfinite(seconds) else None)


def headline(run: MeasuredRun, rtol: float | None, reference: str, how: str = "", detail: str = "") -> list[str]:
    """The first lines of a run's report: the outputs against ``reference`` (``rtol`` None: by their
    dtypes), then measured against predicted (``how`` after the objective, e.g. " over RPC";
    ``detail`` after the sample count)."""
    lines = [f"outputs against {reference}: {run.outputs.describe(rtol)}"]
    measured_over = f"measured/predicted {format_ratio(run.measured_over_predicted, '')}"
    if run.predicted_s is None:
        predicted = "not predicted (the cost model prices no device with these threads or schedules)"
    elif run.objective == "latency":
        predicted = f"predicted {format_time(run.predicted_s)}: {measured_over}"
    else:
        predicted = (
            f"predicted {format_ratio(ratio(1.0, run.predicted_s), ' /s')} (period {format_time(run.predicted_s)}): "
            f"{measured_over}"
        )
    if run.objective == "latency":
        lines.append(
            f"latency{how}: measured {format_time(run.measured_s)} (median of {len(run.samples_s)}"
            f"{detail}), {predicted}"
        )
    else:
        lines.append(
            f"throughput{how}: measured {format_ratio(ratio(1.0, run.measured_s), ' /s')} "
            f"({format_time(run.measured_s)} per inference, {run.in_flight} in flight), {predicted}"
        )
    return lines + far_off_advice(run.measured_over_predicted, run.objective)


# measured/predicted beyond this factor either way: the report lists the likely causes and their fixes
FAR_OFF = 2.0


def far_off_advice(measured_over_predicted: float | None, objective: str) -> list[str]:
    """Why a run may be ``FAR_OFF`` its prediction, and what to do about each cause (nothing when it is
    within): the causes seen on real runs, slower first, then faster than predicted."""
    factor = measured_over_predicted
    if factor is None or 1 / FAR_OFF <= factor <= FAR_OFF:
        return []
    cache = "`diviml cache clear` drops kernel times cached in the last hour (they may come from a busier machine)"
    if factor > FAR_OFF:
        causes = [
            "other work on the machine while this ran: rerun when it is quiet (`uptime` shows the load)",
            "costs not timed here (--cost roofline, or a cost table from another machine): use --cost measured",
            "a kernel left to the Fallback schedule (a warning above names it; `diviml profile` lists every rule)",
        ]
        if objective != "latency":
            causes.append(
                "many segments or copies per inference: each costs the executor a call; --candidates N times "
                "the N best plans and every single device, and keeps the fastest"
            )
        causes.append(cache)
    else:
        causes = [
            "kernel times taken while the machine was busier than now: " + cache,
            "costs not timed here (--cost roofline, or a cost table from another machine): use --cost measured",
        ]
    slower = "slower" if factor > FAR_OFF else "faster"
    return [f"measured {slower} than predicted by more than {FAR_OFF:g}x; the likely causes:"] + [
        f"  - {cause}" for cause in causes
    ]


def format_run(run: RunMeasurement, rtol: float | None = None) -> str:
    """The measured-against-predicted report of one run (``rtol`` None: by the outputs' dtypes)."""
    lines = headline(run, rtol, "the single-device build", detail=f", {run.executor} executor")
    lines.append("busy per inference: " + ", ".join(f"{d} {format_time(s)}" for d, s in run.device_busy_s.items()))
    lines.append(f"single-device configurations, measured now ({run.singles_timed}):")
    width = max(40, *(len(name) + 2 for name in run.single_device_s))
    for name, seconds in run.single_device_s.items():
        lines.append(
            f"  {name:<{width}}{format_time(seconds):>14}" + ("   (one worker)" if name == run.one_worker else "")
        )
    best_name, _ = run.best_single_device
    lines.append(
        f"speed-up over the best single-device configuration ({best_name}): "
        f"{format_ratio(run.speedup_over_best_single)}"
    )
    lines.append(f"speed-up over one worker ({run.one_worker}): {format_ratio(run.speedup_over_one_worker)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- the whole job: diviml run
@dataclass(frozen=True)
class RunOptions:
    """How ``run_model`` builds, checks and times a plan (``diviml run``'s flags): timed inferences
    (latency), inputs streamed and in flight (throughput, pipelines), the N best plans timed side by
    side (0: the plan as planned), the outputs' tolerance (None: by their dtypes), the framework the
    outputs are also held to, and the most sub-batch copies of a zoo model's batch."""

    repeats: int = 10
    stream_inputs: int = 16
    in_flight: int | None = None
    candidates: int = 1
    rtol: float | None = None
    reference: str | None = None  # "torch" or "onnxruntime"
    batch_split: int = 1


RUN_DEFAULTS = RunOptions()
RUN_SOLVE = SolveOptions(time_limit_s=30.0)  # a run spends less time on solving than ``plan``


@dataclass
class Planned:
    """A run's plan before it is built: what ``diviml run`` prints first (the contract row, then
    ``notes``: the batch splits tried, or the servers a run across them uses) and warns of (kernels left
    to the Fallback schedule that take a large share of the model's time)."""

    row: dict[str, Any]
    problem: Problem
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class RunReport:
    """What a run did: its contract ``row`` with the measurements (``run``; ``candidates`` and
    ``kept_assignment`` where several plans were timed; ``reference`` where a framework checked the
    outputs) as ``--json`` writes it, the report printed after the plan (``text``), and whether the
    outputs are within tolerance of the single-device build and of the framework (``passed``). The
    kept build, with the model it runs and the weights its runner takes, is what ``app.export.export_run``
    exports."""

    row: dict[str, Any]
    text: str
    passed: bool
    measured: MeasuredRun
    built: Any  # the kept build: a PlacedExecutable, RoutedBuild or SplitBuild, or a build across servers
    model: BuiltModel  # the model run: the export's inputs and outputs
    weights: Sequence[tuple[str, np.ndarray]] | None = None  # what the runner takes, where not the model's


def measured_report(
    row: dict[str, Any], measured: MeasuredRun, text: str, built: Any, model: BuiltModel, rtol: float | None
) -> RunReport:
    """A run's report: its measurements added to the row, and whether its outputs passed."""
    row["run"] = measured.to_json()
    return RunReport(row, text, measured.outputs.equal(rtol), measured, built, model)


def run_model(
    model: str,
    platform: str = "cpu2",
    cost: str = "measured",
    *,
    load: LoadOptions = AS_GIVEN,
    solve: SolveOptions = RUN_SOLVE,
    options: RunOptions = RUN_DEFAULTS,
    listener: Callable[[Event], None] | None = None,
    on_planned: Callable[[Planned], None] | None = None,
    progress: Callable[[str], None] = print,
) -> RunReport:
    """Plan ``model`` for ``platform``'s devices (which this machine has), build the plan, check its
    outputs against the single-device build (and ``options.reference``'s framework, first run on the
    same inputs) and time it against every single-device configuration: ``diviml run`` without its
    parsing and printing. ``listener``: the solve's progress; ``on_planned``: the plan, before it is
    built; ``progress``: the build's and timings' lines."""
    if options.reference:
        check_reference(options.reference, model)
    if options.batch_split > 1:
        return _run_batch_split(model, platform, cost, load, solve, options, on_planned, progress)
    workload = runnable_workload(model, platform, cost, load)
    loaded = workload.loaded
    framework = run_framework(options.reference, model, loaded.built.sample_inputs()) if options.reference else None
    solved, row, problem = solve_workload(workload, solve, listener=listener)
    if on_planned:
        on_planned(Planned(row, problem, warnings=fallback_warnings(workload.costs, workload.loaded.extraction)))
    database = tuning_database(load.tuning_db, workload.costs)
    measured, built, text = _run_kept(loaded, problem, solved.plan, row, options, database, progress)
    if framework is None:
        return measured_report(row, measured, text, built, loaded.built, options.rtol)
    return _checked_by_framework(framework, row, measured, text, built, loaded.built, options.rtol, load.input_file)


def _run_kept(
    loaded, problem: Problem, plan: Plan, row: dict[str, Any], options: RunOptions, database, progress
) -> tuple[RunMeasurement, Any, str]:
    """``plan`` built and timed (``options.candidates`` 0), or the best of the candidates by measurement
    (their selection added to ``row``); the run, its build and its report."""
    timing = dict(
        repeats=options.repeats,
        stream_inputs=options.stream_inputs,
        in_flight=options.in_flight,
        database=database,
        progress=progress,
    )
    if not options.candidates:
        predicted, in_flight = predicted_run(problem, plan, options.in_flight)
        measured, built = run_plan(
            loaded.built, loaded.extraction, problem.platform, plan, predicted, **{**timing, "in_flight": in_flight}
        )
        return measured, built, format_run(measured, options.rtol)
    selection, measured, built = run_candidates(
        loaded.built, loaded.extraction, problem, plan, options.candidates, rtol=options.rtol, **timing
    )
    row["candidates"] = selection.to_json()
    row["kept_assignment"] = selection.winner.plan.assignment
    return (
        measured,
        built,
        f"{format_selection(selection)}\n\nthe kept plan, run:\n{format_run(measured, options.rtol)}",
    )


def _checked_by_framework(
    framework: FrameworkRun,
    row: dict[str, Any],
    measured: RunMeasurement,
    text: str,
    built: Any,
    model: BuiltModel,
    rtol: float | None,
    input_file: str | None,
) -> RunReport:
    """The run's report with the build's outputs held to the framework's, which it must pass too."""
    check = check_against(framework, build_outputs(built, model), input_file)
    row["reference"] = check.to_json(rtol)
    report = measured_report(row, measured, f"{check.describe(rtol)}\n{text}", built, model, rtol)
    report.passed = report.passed and check.passed(rtol)
    return report


def _run_batch_split(
    model: str,
    platform: str,
    cost: str,
    load: LoadOptions,
    solve: SolveOptions,
    options: RunOptions,
    on_planned: Callable[[Planned], None] | None,
    progress: Callable[[str], None],
) -> RunReport:
    """``run`` with a batch split: the best split planned (``plan --batch-split``), its copies built on
    their devices and run side by side, the joined outputs checked against the batch's single-device
    build; timed one batch at a time beside the single-device configurations."""
    workloads = batch_split_workloads(model, platform, cost, options.batch_split, **load.keywords(runs_here=True))
    plan, _, row, problem = solve_batch_splits(
        workloads, solve.solver, solve.objective, stages=solve.stages, time_limit_s=solve.time_limit_s, seed=solve.seed
    )
    if on_planned:
        on_planned(Planned(row, problem, notes=[format_batch_splits(row)]))
    whole = workloads[1].loaded
    database = tuning_database(load.tuning_db, workloads[1].costs)
    built = _split_build(plan, workloads, problem.platform, database, progress) if plan.batch_split > 1 else None
    predicted, in_flight = predicted_run(problem, plan, options.in_flight)
    measured, built = run_plan(
        whole.built,
        whole.extraction,
        problem.platform,
        plan,
        predicted,
        repeats=options.repeats,
        stream_inputs=options.stream_inputs,
        in_flight=in_flight,
        database=database,
        progress=progress,
        built=built,
    )
    report = measured_report(row, measured, format_run(measured, options.rtol), built, whole.built, options.rtol)
    if plan.batch_split > 1:
        report.weights = workloads[plan.batch_split].loaded.built.params
    return report


def _split_build(
    plan: Plan, workloads: dict[int, Workload], platform: Platform, database, progress
) -> tuple[Any, float]:
    """The split's copies built (``dataparallel.build_split``), with the seconds it took."""
    began = time.perf_counter()
    split = build_split(
        plan,
        workloads[1],
        workloads[plan.batch_split],
        lambda model, extraction, copy: build_runnable(
            model, extraction, platform, copy, database=database, progress=progress
        )[0],
    )
    return split, time.perf_counter() - began


def tuning_database(tuning_db: str | None, costs):
    """The MetaSchedule database a build applies: the one ``tuning_db`` names, or the one that tuning just
    filled for ``costs`` (``--tune``, ``--tune-minutes``); None without either."""
    if tuning_db:
        return open_database(tuning_db)
    tuning = costs.provenance.tuning if costs.provenance is not None else {}
    tuned = [result.database for result in tuning.values()]
    return tuned[0] if tuned else None


def fallback_warnings(costs, extraction: Extraction) -> list[str]:
    """One warning for each kernel that no class rule scheduled and that takes a large share of the
    model's measured time: otherwise only a profile's last column shows it."""
    return [hotspot.message() for hotspot in fallback_hotspots(costs, extraction)]
