"""Plan, build and really run a model on this machine's devices; measured against predicted.

What ``diviml run`` and the ``run`` benchmark suite do: solve the placement, build it (``apply_plan``
+ ``build``), check its outputs against the single-device reference build, time it — one inference
at a time on the concurrent executor for latency, a stream with several inputs in flight for
throughput and pipelines — and time the same model on each single-device configuration, so that
the speed-up is measured side by side in one run. ``run_candidates`` does the same for several
candidate plans and keeps the fastest measured (``tvm_diviml.candidates``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tvm_diviml.candidates import Candidate, Selection, candidate_plans, plan_key, select_fastest
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.plan import Plan
from tvm_diviml.platform import Device, Platform
from tvm_diviml.runtime.concurrent import ConcurrentRunner
from tvm_diviml.runtime.measure import compare_outputs, time_calls, time_stream
from tvm_diviml.runtime.vm import PlacedExecutable, SingleVMRunner
from tvm_diviml.simulator import simulate
from tvm_diviml.toolkit.single_device import single_device_plan
from tvm_diviml.zoo import BuiltModel
from tvm_diviml.zoo.reference import run_reference

from .apply_plan import apply_plan
from .build import build
from .extract import Extraction

log = logging.getLogger(__name__)

# Timings continue past their ``repeats`` until they took this long (at most 2,000 calls): a model of
# tens of microseconds timed 5 or 10 times gave medians 1.5x apart between processes.
SETTLE_S = 0.25


@dataclass(kw_only=True)
class MeasuredRun:
    """What any real run of a plan measured, here or across servers: what ``headline`` reports, its
    outputs against the reference and its time against the simulator's."""

    objective: str
    predicted_s: float | None  # the simulator's latency or period (None: a configuration it has no device for)
    measured_s: float  # median latency, or seconds per inference of the stream
    max_abs_diff: float  # against the single-device reference
    max_rel_diff: float
    device_busy_s: dict[str, float]  # per inference
    build_s: float
    in_flight: int = 1
    samples_s: list[float] = field(default_factory=list)

    @property
    def measured_over_predicted(self) -> float | None:
        return self.measured_s / self.predicted_s if self.predicted_s else None

    def headline_json(self) -> dict[str, Any]:
        """The keys that open both reports' JSON, in their order."""
        return {
            "objective": self.objective,
            "predicted_s": self.predicted_s,
            "measured_s": self.measured_s,
            "measured_over_predicted": self.measured_over_predicted,
            "max_abs_diff": self.max_abs_diff,
            "max_rel_diff": self.max_rel_diff,
        }


@dataclass(kw_only=True)
class RunMeasurement(MeasuredRun):
    """What one real run of a plan on this machine measured, with the single-device configurations."""

    single_device_s: dict[str, float]  # configuration -> measured seconds per inference, one at a time
    one_worker: str  # the configuration that is "one worker" (the fastest device alone)
    executor: str = "concurrent"  # "concurrent" (a worker per device) or "single VM" (a one-device plan)

    @property
    def best_single_device(self) -> tuple[str, float]:
        name = min(self.single_device_s, key=self.single_device_s.__getitem__)
        return name, self.single_device_s[name]

    @property
    def speedup_over_best_single(self) -> float:
        return self.best_single_device[1] / self.measured_s

    @property
    def speedup_over_one_worker(self) -> float:
        return self.single_device_s[self.one_worker] / self.measured_s

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
        }


def single_device_configurations(platform: Platform) -> dict[str, tuple[Device, int | None]]:
    """The single-device configurations to time: each present device as the platform has it (distinct
    target and thread count only: cpu0 and cpu1 of cpu2 are the same CPU), and the host CPU with
    every core of this machine when the platform gives its CPUs fewer."""
    from tvm_diviml.cost.measured import device_present

    out: dict[str, tuple[Device, int | None]] = {}
    seen = set()
    for device in platform.devices:
        key = (str(device.target), device.kind, device.num_threads)
        if device_present(device) and key not in seen:
            seen.add(key)
            threads = f" ({device.num_threads} thread{'s' * (device.num_threads != 1)})" if device.num_threads else ""
            out[f"{device.name}{threads}"] = (device, device.num_threads)
    host = platform.device(platform.host)
    cores = os.cpu_count() or 1
    if host.kind == "cpu" and device_present(host) and (host.num_threads or cores) < cores:
        out[f"{host.name} ({cores} threads, the whole CPU)"] = (host, cores)
    if not out:
        raise DivimlInputError(
            f"no device of platform '{platform.name}' is present on this machine",
            field="platform",
            hint="run on cpu2 here, or where the platform's devices exist",
        )
    return out


def time_single_devices(
    model: BuiltModel,
    extraction: Extraction,
    platform: Platform,
    inputs: list[np.ndarray],
    repeats: int,
    database=None,
    configurations: dict | None = None,
) -> dict[str, float]:
    """Median seconds per inference of the whole model on each single-device configuration (one
    build per device, run with each thread count); ``configurations``: a subset of them."""
    samples = single_device_samples(model, extraction, platform, inputs, repeats, database, configurations)
    return {name: statistics.median(seconds) for name, seconds in samples.items()}


def single_device_samples(
    model: BuiltModel,
    extraction: Extraction,
    platform: Platform,
    inputs: list[np.ndarray],
    repeats: int,
    database=None,
    configurations: dict | None = None,
) -> dict[str, list[float]]:
    """``time_single_devices``' samples: seconds of each timed inference per configuration."""
    params = [w for _, w in model.params]
    builds: dict[str, PlacedExecutable] = {}
    out = {}
    for name, (device, threads) in (configurations or single_device_configurations(platform)).items():
        if device.name not in builds:
            plan = Plan({k: device.name for k in extraction.graph.kernels})
            builds[device.name] = build(apply_plan(model.mod, plan, platform, extraction=extraction, database=database))
        runner = SingleVMRunner(builds[device.name], params, num_threads=threads)
        out[name] = time_calls(runner, inputs, repeats, SETTLE_S)
        log.info("single device %s: %.4f s", name, statistics.median(out[name]))
    return out


def build_runnable(
    model: BuiltModel, extraction: Extraction, platform: Platform, plan: Plan, *, database=None, progress=print
) -> tuple[PlacedExecutable, float]:
    """``plan`` built for this machine (its devices checked first), and the seconds the build took."""
    from tvm_diviml.cost.measured import device_present

    absent = [d for d in dict.fromkeys([platform.host, *plan.devices_used()]) if not device_present(platform.device(d))]
    if absent:
        device = platform.device(absent[0])
        raise DivimlInputError(
            f"the plan uses device '{device.name}' ({device.device}), which this machine lacks "
            "(or the platform marks as another machine's)",
            field="platform",
            hint="run where the platform's devices exist, or plan for a platform of this machine (e.g. cpu2)",
        )
    began = time.perf_counter()
    built = build(apply_plan(model.mod, plan, platform, extraction=extraction, database=database))
    build_s = time.perf_counter() - began
    progress(
        f"built for {', '.join(built.placement.devices)} in {build_s:.1f} s "
        f"({len(built.placement.segments)} segments, {built.placement.copies_per_run} device copies per run)"
    )
    return built, build_s


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


@dataclass
class BuildTiming:
    """One build timed as it runs best: its outputs against the reference, seconds per inference."""

    measured_s: float
    samples_s: list[float]
    busy_s: dict[str, float]
    in_flight: int
    executor: str
    max_abs_diff: float
    max_rel_diff: float


def time_build(
    built: PlacedExecutable,
    model: BuiltModel,
    objective: str,
    reference: list[np.ndarray],
    *,
    repeats: int,
    stream_inputs: int = 16,
    in_flight: int | None = None,
    threads: int | None = None,
) -> BuildTiming:
    """Latency: one inference at a time, on the concurrent executor (one VM, without the workers'
    hand-offs, when the build has one device); throughput and pipelines: a stream with ``in_flight``
    inputs (default two per device). ``threads``: a one-device build's CPU pool."""
    params = [w for _, w in model.params]
    inputs = model.sample_inputs()
    concurrent = len(built.placement.devices) > 1 or objective != "latency"
    with ConcurrentRunner(built, params) as runner:
        abs_diff, rel_diff = compare_outputs(runner(inputs), reference)
        if objective != "latency":
            flight = in_flight or 2 * len(built.placement.devices)
            stream = [model.sample_inputs(seed) for seed in range(stream_inputs)]
            measured, samples = time_stream(runner, stream, flight), []
            busy = {d: s / stream_inputs for d, s in runner.busy_s.items()}  # busy_s covers the last stream
        elif concurrent:
            (measured, samples, busy), flight = _concurrent_latency(runner, inputs, repeats), 1
    if not concurrent:
        single = SingleVMRunner(built, params, num_threads=threads)
        samples = time_calls(single, inputs, repeats, SETTLE_S)
        measured, flight = statistics.median(samples), 1
        busy = {built.placement.devices[0]: measured}
    return BuildTiming(measured, samples, busy, flight, "concurrent" if concurrent else "single VM", abs_diff, rel_diff)


def candidate_set(problem, chosen: Plan, count: int) -> list[Candidate]:
    """``candidates.candidate_plans`` and every single-device configuration of this machine (the whole
    CPU too), each configuration labelled as ``single_device_configurations`` names it."""
    candidates = candidate_plans(problem, chosen, count)
    for label, (device, threads) in single_device_configurations(problem.platform).items():
        plan = single_device_plan(problem, device.name)
        as_platform_has_it = threads == device.num_threads
        same = [
            c for c in candidates if as_platform_has_it and c.threads is None and plan_key(c.plan) == plan_key(plan)
        ]
        if same:
            same[0].label = label
        else:
            predicted = simulate(problem.graph, problem.platform, problem.costs, plan).value_s
            candidates.append(
                Candidate(
                    label,
                    plan,
                    predicted if as_platform_has_it else None,
                    threads=None if as_platform_has_it else threads,
                )
            )
    return candidates


def calibrate_in_context(
    costs, model: BuiltModel, extraction: Extraction, *, repeats: int = 5, database=None, fresh: bool = False
) -> dict[str, float]:
    """Time the whole model once per present device configuration (as the platform has it; through
    the profile cache, like kernels, unless ``fresh``: timed again and the cache updated), and have
    ``costs`` (a MeasuredCostModel) price every device of that configuration as its kernels run
    inside the model, with the timing's spread as its ``prediction_error``. Returns the per-kernel
    figures by device."""
    from tvm_diviml.cost.cache import Measurement

    platform = costs.platform
    configurations = {
        label: (device, threads)
        for label, (device, threads) in single_device_configurations(platform).items()
        if threads == device.num_threads
    }
    keys = {label: costs.whole_model_key(device.name) for label, (device, _) in configurations.items()}
    found = costs.cache.get_many(list(keys.values())) if costs.cache and not fresh else {}
    missing = {label: configurations[label] for label, key in keys.items() if key not in found}
    if missing:
        if costs.options.progress:
            print(
                f"timing the whole model on {', '.join(missing)} to price kernels as they run inside it "
                f"(at least {repeats} inferences and {SETTLE_S:g} s each, then cached)",
                file=sys.stderr,
                flush=True,
            )
        samples = single_device_samples(model, extraction, platform, model.sample_inputs(), repeats, database, missing)
        timed = {
            keys[label]: Measurement(
                statistics.median(seconds),
                _relative_spread(seconds) * statistics.median(seconds),
                len(seconds),
                "measured",
            )
            for label, seconds in samples.items()
        }
        if costs.cache:
            costs.cache.put_many(timed)
        found.update(timed)
    costs.prediction_error = max((m.spread_s / m.median_s for m in found.values() if m.median_s > 0), default=0.0)
    for label, (device, _) in configurations.items():
        whole = found[keys[label]].median_s
        alike = [
            d.name
            for d in platform.devices
            if d.name in costs.times
            and (str(d.target), d.kind, d.num_threads) == (str(device.target), device.kind, device.num_threads)
        ]
        for name in alike:
            overhead = costs.calibrate_in_context(name, whole)
            log.info("%s: %.1f us per kernel inside the model (whole model %.3f ms)", name, overhead * 1e6, whole * 1e3)
    return dict(costs.in_context_s)


def runner_overhead_s(
    model: BuiltModel, extraction: Extraction, platform: Platform, device, *, repeats: int = 20
) -> float:
    """What ``SingleVMRunner`` adds to one inference of the single-device build on ``device`` (inputs
    uploaded, outputs to numpy): its median call less the bare VM call's, timed alternately."""
    built = build(
        apply_plan(model.mod, Plan({k: device.name for k in extraction.graph.kernels}), platform, extraction=extraction)
    )
    runner = SingleVMRunner(built, [w for _, w in model.params], num_threads=device.num_threads)
    inputs = model.sample_inputs()
    bare = runner.bare_call(inputs)
    with_runner, alone = [], []
    for _ in range(repeats):
        with_runner += time_calls(runner, inputs, 1, SETTLE_S / repeats)
        alone += time_calls(lambda _: bare(), [], 1, SETTLE_S / repeats)
    return max(0.0, statistics.median(with_runner) - statistics.median(alone))


def _relative_spread(samples: list[float]) -> float:
    """Half the range between the first and third quartiles, over the median: how far one timing
    of the same build strays (a prediction cannot be trusted closer than that)."""
    if len(samples) < 2:
        return 0.0
    quartiles = statistics.quantiles(samples, n=4)
    return (quartiles[2] - quartiles[0]) / 2 / statistics.median(samples)


def choose_by_measurement(
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
    rtol: float = 1e-4,
    progress=print,
) -> tuple[Selection, dict, dict]:
    """Build and time ``candidate_set``'s plans; the fastest measured whose outputs match the reference
    within ``rtol`` wins. Latency is timed side by side, one inference of each candidate per round
    (drift and load then touch them alike); streams one candidate after another. Returns the
    selection, the builds and the timings (both by plan key and thread count)."""
    candidates = candidate_set(problem, chosen, count)
    inputs = model.sample_inputs()
    reference = run_reference(model, inputs)
    builds: dict[tuple, tuple[PlacedExecutable, float]] = {}
    for candidate in candidates:
        if plan_key(candidate.plan) not in builds:
            builds[plan_key(candidate.plan)] = build_runnable(
                model, extraction, problem.platform, candidate.plan, database=database, progress=progress
            )
    timings: dict[tuple, BuildTiming] = {}
    if problem.objective == "latency":
        timings = _time_side_by_side(candidates, builds, model, reference, repeats)
    else:
        for candidate in candidates:
            timings[_timing_key(candidate)] = time_build(
                builds[plan_key(candidate.plan)][0],
                model,
                problem.objective,
                reference,
                repeats=repeats,
                stream_inputs=stream_inputs,
                in_flight=in_flight,
                threads=candidate.threads,
            )
    for candidate in candidates:
        timing = timings[_timing_key(candidate)]
        progress(f"candidate {candidate.label}: {timing.measured_s * 1e3:.3f} ms per inference")

    def measure(candidate: Candidate) -> float:
        timing = timings[_timing_key(candidate)]
        return timing.measured_s if timing.max_rel_diff <= rtol else math.inf  # wrong outputs never win

    return select_fastest(candidates, measure), builds, timings


def _timing_key(candidate: Candidate) -> tuple:
    return plan_key(candidate.plan), candidate.threads


def _time_side_by_side(
    candidates: list[Candidate], builds: dict, model: BuiltModel, reference: list[np.ndarray], repeats: int
) -> dict[tuple, BuildTiming]:
    """One inference at a time, each candidate twice per round (the second timed: warm, as a model run
    again and again is), ``repeats`` rounds or more, until the fastest candidate too was timed for
    ``SETTLE_S``: a one-device build in one VM with its thread count, a multi-device build on the
    concurrent executor."""
    params = [w for _, w in model.params]
    inputs = model.sample_inputs()
    with contextlib.ExitStack() as stack:
        runners, checks, busy = {}, {}, {}
        for candidate in candidates:
            key = _timing_key(candidate)
            built = builds[plan_key(candidate.plan)][0]
            if len(built.placement.devices) == 1:
                runners[key] = SingleVMRunner(built, params, num_threads=candidate.threads)
            else:
                runners[key] = stack.enter_context(ConcurrentRunner(built, params))
            checks[key] = compare_outputs(runners[key](inputs), reference)
            busy[key] = Counter()
        samples: dict[tuple, list[float]] = {key: [] for key in runners}
        rounds = repeats
        while len(next(iter(samples.values()))) < rounds:
            for key, runner in runners.items():
                runner(inputs)  # untimed: the previous candidate left the caches and thread pool its own
                began = time.perf_counter()
                runner(inputs)
                samples[key].append(time.perf_counter() - began)
                if isinstance(runner, ConcurrentRunner):
                    busy[key].update(runner.busy_s)
            done, fastest = len(next(iter(samples.values()))), min(sum(x) for x in samples.values())
            if fastest < SETTLE_S:  # rounds until every candidate was timed for SETTLE_S
                rounds = max(rounds, min(200 * repeats, math.ceil(done * SETTLE_S / max(fastest, 1e-9))))
    out = {}
    for key, runner in runners.items():
        measured = statistics.median(samples[key])
        concurrent = isinstance(runner, ConcurrentRunner)
        devices = builds[key[0]][0].placement.devices
        per_run = {d: s / len(samples[key]) for d, s in busy[key].items()} if concurrent else {devices[0]: measured}
        out[key] = BuildTiming(
            measured, samples[key], per_run, 1, "concurrent" if concurrent else "single VM", *checks[key]
        )
    return out


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
    rtol: float = 1e-4,
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
    built, build_s = builds[plan_key(winner.plan)]
    timing = timings[_timing_key(winner)]
    configurations = single_device_configurations(problem.platform)
    single = {c.label: c.measured_s for c in selection.candidates if c.label in configurations}
    one_worker = min(
        (n for n in single if configurations[n][1] == configurations[n][0].num_threads), key=single.__getitem__
    )
    run = _measurement(problem.objective, winner.predicted_s, timing, single, one_worker, build_s)
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
        max_abs_diff=timing.max_abs_diff,
        max_rel_diff=timing.max_rel_diff,
        device_busy_s=timing.busy_s,
        single_device_s=single_device_s,
        one_worker=one_worker,
        build_s=build_s,
        in_flight=timing.in_flight,
        samples_s=timing.samples_s,
        executor=timing.executor,
    )


def with_random_weights(mod, entry: str, seed: int = 0) -> BuiltModel:
    """``mod`` with seeded random weights for its entry's weight parameters: enough to time it."""
    from tvm_diviml.zoo import init_weights

    from .frontends import from_relax

    func = mod[entry]
    num_inputs = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else len(func.params)
    shapes = [(p.name, tuple(int(d) for d in p.ty.shape.values), str(p.ty.dtype)) for p in func.params[num_inputs:]]
    return from_relax(mod, entry, [w for _, w in init_weights(shapes, seed)])


def _concurrent_latency(
    runner: ConcurrentRunner, inputs: list[np.ndarray], repeats: int
) -> tuple[float, list[float], dict[str, float]]:
    """Median latency, the samples, and each device's busy time averaged over the runs (warm-up included)."""
    busy_total: Counter = Counter()

    def run_once(arrays):
        outputs = runner(arrays)
        busy_total.update(runner.busy_s)  # busy_s covers the last run only
        return outputs

    samples = time_calls(run_once, inputs, repeats, SETTLE_S)
    return statistics.median(samples), samples, {d: s / (len(samples) + 1) for d, s in busy_total.items()}


def headline(run: MeasuredRun, rtol: float, reference: str, how: str = "", detail: str = "") -> list[str]:
    """The first lines of a run's report: the outputs against ``reference``, then measured against
    predicted (``how`` after the objective, e.g. " over RPC"; ``detail`` after the sample count)."""
    from tvm_diviml.report import format_seconds

    verdict = "equal" if run.max_rel_diff <= rtol else f"DIFFERENT (beyond rtol {rtol:g})"
    lines = [
        f"outputs against {reference}: max abs diff {run.max_abs_diff:.3g}, "
        f"max rel diff {run.max_rel_diff:.3g}: {verdict}"
    ]
    if run.predicted_s is None:
        predicted = "not predicted (the platform has no device with these threads)"
    elif run.objective == "latency":
        predicted = f"predicted {format_seconds(run.predicted_s)}: measured/predicted {run.measured_over_predicted:.2f}"
    else:
        predicted = (
            f"predicted {1 / run.predicted_s:.2f} /s (period {format_seconds(run.predicted_s)}): "
            f"measured/predicted {run.measured_over_predicted:.2f}"
        )
    if run.objective == "latency":
        lines.append(
            f"latency{how}: measured {format_seconds(run.measured_s)} (median of {len(run.samples_s)}"
            f"{detail}), {predicted}"
        )
    else:
        lines.append(
            f"throughput{how}: measured {1 / run.measured_s:.2f} /s ({format_seconds(run.measured_s)} per "
            f"inference, {run.in_flight} in flight), {predicted}"
        )
    return lines


def format_run(run: RunMeasurement, rtol: float) -> str:
    """The measured-against-predicted report of one run."""
    from tvm_diviml.report import format_seconds

    lines = headline(run, rtol, "the single-device build", detail=f", {run.executor} executor")
    lines.append("busy per inference: " + ", ".join(f"{d} {format_seconds(s)}" for d, s in run.device_busy_s.items()))
    lines.append("single-device configurations, measured now (one inference at a time):")
    for name, seconds in run.single_device_s.items():
        lines.append(
            f"  {name:<40}{format_seconds(seconds):>14}" + ("   (one worker)" if name == run.one_worker else "")
        )
    best_name, _ = run.best_single_device
    lines.append(
        f"speed-up over the best single-device configuration ({best_name}): {run.speedup_over_best_single:.2f}x"
    )
    lines.append(f"speed-up over one worker ({run.one_worker}): {run.speedup_over_one_worker:.2f}x")
    return "\n".join(lines)
