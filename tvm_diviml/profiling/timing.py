"""Build plans and time them on this machine: the measurements that placement decisions rest on.

Kernel costs priced as they run inside the whole model (``priced_in_context``: the whole model
timed on each single device, what ``profiling.profile`` calibrates its kernels with), one build timed
as it runs best (``time_build``: the concurrent executor, or one VM), the single-device
configurations of a platform, and several candidate plans built and timed side by side so that the
fastest measured is kept (``choose_by_measurement``). ``diviml run`` (``tvm_diviml.app.run``) and
``PartitionForDevices(candidates=N)`` both rest on these.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from tvm_diviml.cost.base import ExecutorOverheads
from tvm_diviml.cost.provenance import DeviceTimings, InContext, MeasureOptions, Provenance
from tvm_diviml.cost.roofline import RooflineCostModel
from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.platform import Device, Platform
from tvm_diviml.problem import Problem
from tvm_diviml.profiling.candidates import Candidate, Selection, candidate_plans, plan_key, priced, select_fastest
from tvm_diviml.runtime.concurrent import ConcurrentRunner
from tvm_diviml.runtime.measure import time_calls, time_stream
from tvm_diviml.runtime.routed import RoutedBuild, SplitBuild, build_routes
from tvm_diviml.runtime.vm import PlacedExecutable, SingleVMRunner, pin_thread, set_threads, usable_cores
from tvm_diviml.servers import corun_groups
from tvm_diviml.simulator import STREAM_SLACK
from tvm_diviml.tolerances import OutputComparison, compare_outputs
from tvm_diviml.toolkit.single_device import single_device_plan
from tvm_diviml.zoo import BuiltModel
from tvm_diviml.zoo.reference import run_reference

from ..passes.apply_plan import apply_plan
from ..passes.build import build
from ..passes.extract import Extraction
from .cache import Measurement, ProfileCache
from .measured import device_present, measure, whole_model_key

log = logging.getLogger(__name__)

# Timings continue past their ``repeats`` until they took this long (at most 2,000 calls): a model of
# tens of microseconds timed 5 or 10 times gave medians 1.5x apart between processes.
SETTLE_S = 0.25
CALIBRATION_ROUNDS = 3  # of the executor's calibration (``_alone_stream_together``)
# Side by side, each candidate runs this many times untimed before its timed inference in a round: the
# second call after another candidate ran was still 25-45% slower than a model run again and again
# (twin_branch:hidden=1024 on cpu2, one thread and both: 3.6 against 2.7 ms), the third as fast.
WARM_CALLS = 2
# A whole-model timing older than this is timed again, not read from the profile cache: this VM's
# speed drifts by tens of percent over hours, and the in-context calibration carries the whole
# model's time into every kernel's (a day-old calibration predicted make demo's plan at 1.37x its
# measured time). Kernels timed alone stay cached: the calibration rescales them.
CALIBRATION_MAX_AGE_S = 3600.0


def single_device_configurations(platform: Platform) -> dict[str, tuple[Device, int | None]]:
    """The single-device configurations to time: each present device as the platform has it (distinct
    target and thread count only: cpu0 and cpu1 of cpu2 are the same CPU), and the host CPU with
    every core of this machine when the platform gives its CPUs fewer."""
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
    builds: dict[tuple[str, int | None], PlacedExecutable] = {}
    out = {}
    for name, (device, threads) in (configurations or single_device_configurations(platform)).items():
        if (device.name, threads) not in builds:
            plan = Plan({k: device.name for k in extraction.graph.kernels})
            built_for = platform if threads == device.num_threads else platform.with_threads(device.name, threads)
            builds[(device.name, threads)] = build(
                apply_plan(model.mod, plan, built_for, extraction=extraction, database=database)
            )
        runner = SingleVMRunner(builds[(device.name, threads)], params, num_threads=threads)
        out[name] = time_calls(runner, inputs, repeats, SETTLE_S)
        log.info("single device %s: %.4f s", name, statistics.median(out[name]))
    return out


def build_runnable(
    model: BuiltModel, extraction: Extraction, platform: Platform, plan: Plan, *, database=None, progress=print
) -> tuple[PlacedExecutable | RoutedBuild, float]:
    """``plan`` built for this machine (its devices checked first), and the seconds the build took; a
    replicated plan as one build per route (``runtime.routed``)."""
    if plan.replicas:
        began = time.perf_counter()
        routed = build_routes(
            plan,
            lambda route: build_runnable(model, extraction, platform, route, database=database, progress=progress)[0],
        )
        return routed, time.perf_counter() - began

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


@dataclass
class BuildTiming:
    """One build timed as it runs best: its outputs against the reference, seconds per inference."""

    measured_s: float
    samples_s: list[float]
    busy_s: dict[str, float]
    in_flight: int
    executor: str
    outputs: OutputComparison


def time_build(
    built: PlacedExecutable | RoutedBuild | SplitBuild,
    model: BuiltModel,
    objective: str,
    reference: list[np.ndarray],
    *,
    repeats: int,
    stream_inputs: int = 16,
    in_flight: int | None = None,
    threads: int | None = None,
) -> BuildTiming:
    """Latency: one inference at a time; throughput and pipelines: a stream with ``in_flight`` inputs
    (default two per device; one at a time on one VM). ``open_runner`` chooses the runner;
    ``threads``: a one-device build's CPU pool."""
    params = [w for _, w in model.params]
    inputs = model.sample_inputs()
    with open_runner(built, params, threads) as runner:
        concurrent = not isinstance(runner, SingleVMRunner)
        outputs = compare_outputs(runner(inputs), reference)
        if objective != "latency":
            flight = stream_in_flight(built, in_flight)
            stream = model.sample_stream(stream_inputs, distinct=flight)
            measured, samples = time_stream(runner, stream, flight), []
            busy = {d: s / stream_inputs for d, s in runner.busy_s.items()}  # busy_s covers the last stream
        elif concurrent:
            (measured, samples, busy), flight = _concurrent_latency(runner, inputs, repeats), 1
        else:
            samples = time_calls(runner, inputs, repeats, SETTLE_S)
            measured, flight = statistics.median(samples), 1
            busy = {runner.device: measured}
    return BuildTiming(measured, samples, busy, flight, "concurrent" if concurrent else "single VM", outputs)


def open_runner(
    built: PlacedExecutable | RoutedBuild | SplitBuild, params: list[np.ndarray], threads: int | None = None
):
    """The runner of a build: the replicas' or copies' runners side by side (``runtime.replicas``; a
    batch split runs the sub-batch model's weights, which it keeps), one VM on the calling thread for
    a one-device build (with ``threads``, else the build's), the concurrent executor otherwise."""
    if isinstance(built, RoutedBuild | SplitBuild):
        return built.runner(params)
    if one_vm(built):
        return SingleVMRunner(built, params, num_threads=threads)
    return ConcurrentRunner(built, params)


def one_vm(built: PlacedExecutable | RoutedBuild | SplitBuild) -> bool:
    """Whether ``built`` runs in one VM on the calling thread: a placed build whose kernels are on one
    device (``simulator.one_vm_stream`` prices its stream so)."""
    return not isinstance(built, RoutedBuild | SplitBuild) and len(built.placement.kernel_devices) <= 1


def stream_in_flight(built: PlacedExecutable | RoutedBuild | SplitBuild, in_flight: int | None) -> int:
    """The inputs a stream of ``built`` keeps in flight: ``in_flight`` (None: two per device), one for a
    one-device build (one VM runs one at a time)."""
    if one_vm(built):
        return 1
    devices = built.devices if isinstance(built, RoutedBuild | SplitBuild) else built.placement.devices
    return in_flight or 2 * len(devices)


def candidate_set(problem, chosen: Plan, count: int, *, tuned: bool = False, predict=None) -> list[Candidate]:
    """``candidates.candidate_plans`` and every single-device configuration of this machine (the whole
    CPU too), each configuration labelled as ``single_device_configurations`` names it. ``tuned``: the
    builds apply a tuning database, and each configuration is timed with the default schedules too
    (a MetaSchedule runner times a kernel alone and cache-hot; inside the model its pick can be slower).
    ``predict(device, threads)``: the problem of a configuration no platform device describes, whose
    platform has the device so (None: not predicted)."""
    candidates = candidate_plans(problem, chosen, count)
    for label, (device, threads) in single_device_configurations(problem.platform).items():
        plan = single_device_plan(problem, device.name)
        as_platform_has_it = threads == device.num_threads
        own_threads = None if as_platform_has_it else threads  # None: as the platform gives the device
        same = [
            c for c in candidates if as_platform_has_it and c.threads is None and plan_key(c.plan) == plan_key(plan)
        ]
        if same:
            same[0].label = label
        elif as_platform_has_it:
            candidates.append(priced(problem, label, plan))
        else:
            alone = predict(device, threads) if predict is not None else None
            candidates.append(
                priced(alone, label, plan, own_threads) if alone else Candidate(label, plan, None, threads=own_threads)
            )
        if tuned:  # the cost model priced the tuned kernels: the default build has no prediction
            candidates.append(
                Candidate(f"{label}, default schedules", plan, None, threads=own_threads, default_schedules=True)
            )
    return candidates


def priced_in_context(
    provenance: Provenance,
    platform: Platform,
    model: BuiltModel | None,
    extraction: Extraction,
    *,
    cache: ProfileCache | None = None,
    repeats: int = 5,
    database=None,
    fresh: bool = False,
    executor: bool = True,
) -> Provenance:
    """``provenance`` (kernels measured on ``platform``) with every timed device priced as its kernels run
    inside the model: the whole model timed once per present device configuration (as the platform has
    it; through ``cache``, like kernels, for ``CALIBRATION_MAX_AGE_S``, unless ``fresh``: timed again and
    the cache updated; ``model`` may be None where the cache answers), the timing's spread as its
    ``prediction_error``, and, with ``executor``, the executor's overheads as the model's own timings
    raise them (``executor_in_context``; a one-device configuration's stream does not run on it)."""
    graph = extraction.graph
    configurations = {
        label: (device, threads)
        for label, (device, threads) in single_device_configurations(platform).items()
        if threads == device.num_threads
    }
    keys = {label: whole_model_key(graph, device, provenance.tuning) for label, (device, _) in configurations.items()}
    recent = time.time() - CALIBRATION_MAX_AGE_S
    found = cache.get_many(list(keys.values()), recorded_after=recent) if cache and not fresh else {}
    missing = {label: configurations[label] for label, key in keys.items() if key not in found}
    if missing:
        progress = provenance.options.progress
        timed = _time_whole_model(model, extraction, platform, missing, repeats, database, progress)
        timed = {keys[label]: measurement for label, measurement in timed.items()}
        if cache:
            cache.put_many(timed)
        found.update(timed)
    prediction_error = max((m.spread_s / m.median_s for m in found.values() if m.median_s > 0), default=0.0)
    overheads = provenance.executor_overheads
    if executor:
        overheads = executor_in_context(
            provenance, platform, model, extraction, cache=cache, database=database, fresh=fresh
        )
    in_context = {}
    for label, (device, _) in configurations.items():
        alike = [
            d.name
            for d in platform.devices
            if d.name in provenance.timed
            and (str(d.target), d.kind, d.num_threads) == (str(device.target), device.kind, device.num_threads)
        ]
        for name in alike:
            in_context[name] = fitted_in_context(name, provenance.timed[name], graph, found[keys[label]].median_s)
    return replace(provenance, in_context=in_context, prediction_error=prediction_error, executor_overheads=overheads)


def _time_whole_model(
    model: BuiltModel,
    extraction: Extraction,
    platform: Platform,
    configurations: dict[str, tuple[Device, int | None]],
    repeats: int,
    database,
    progress: bool,
) -> dict[str, Measurement]:
    """The whole model timed on each of ``configurations`` (``single_device_samples``), by label: the
    median, and half the interquartile range as its spread."""
    if progress:
        print(
            f"timing the whole model on {', '.join(configurations)} to price kernels as they run inside it "
            f"(at least {repeats} inferences and {SETTLE_S:g} s each, then cached)",
            file=sys.stderr,
            flush=True,
        )
    samples = single_device_samples(
        model, extraction, platform, model.sample_inputs(), repeats, database, configurations
    )
    return {
        label: Measurement(
            statistics.median(seconds), _relative_spread(seconds) * statistics.median(seconds), len(seconds), "measured"
        )
        for label, seconds in samples.items()
    }


def fitted_in_context(device: str, timings: DeviceTimings, graph: OpGraph, whole_model_s: float) -> InContext:
    """``InContext.fitted`` to ``device``'s kernels (``timings``) and the whole model's time on it, said
    where the kernels alone sum to more than the whole."""
    alone = sum(timings.seconds[k] for k in graph.kernels)
    fitted = InContext.fitted(alone, whole_model_s, len(graph))
    if fitted.scale < 1.0:
        log.warning(
            "%s: its kernels timed alone sum to %.3f ms, more than the whole model's %.3f ms: the machine "
            "was busier while they were timed; each kernel is priced at %.2f of its time alone",
            device,
            alone * 1e3,
            whole_model_s * 1e3,
            math.floor(fitted.scale * 100) / 100,
        )
    log.info(
        "%s: %.1f us per kernel inside the model (whole model %.3f ms)",
        device,
        fitted.per_kernel_s * 1e6,
        whole_model_s * 1e3,
    )
    return fitted


def executor_in_context(
    provenance: Provenance,
    platform: Platform,
    model: BuiltModel | None,
    extraction: Extraction,
    *,
    cache: ProfileCache | None = None,
    database=None,
    fresh: bool = False,
) -> ExecutorOverheads:
    """The executor's overheads as this model raises the machine's (``provenance.machine_overheads``),
    timed on its single-device build on the first present CPU device, through the profile cache like
    the whole-model times:

    - a stream on the concurrent executor against one VM call at a time: the difference per inference
      is what a segment call costs in a stream (the worker's bookkeeping, the wake-ups, the outputs
      handed back), ``stream_segment_s``, which streams on that executor (replicas, several devices)
      pay where it is above the no-op segments' figure (one inference at a time keeps that one: in a
      stream the driver works on the next input beside the worker; a one-device build's stream runs
      in one VM and pays neither).
      On bert_base at its small size (~70 us a call) a stream took ~120 us per inference on one
      worker, while no-op segments measured 1.6 us a call;
    - where a second CPU device shares the machine, the model on both at once (one VM per device,
      each pinned to its cores) against one alone: the ratio becomes ``corun_factor`` when above the
      synthetic probe's, whose dense kernel read 1.00 while mobilenet_v2 at 64x64 ran 1.1-1.3x slower
      per inference with the other core busy."""
    overheads = provenance.machine_overheads
    present = [d for d in platform.devices if d.name in provenance.timed and d.kind == "cpu"]
    if not present:
        return overheads
    first = present[0]
    pair = next((sorted(g & {d.name for d in present})[:2] for g in corun_groups(platform) if first.name in g), [])
    second = platform.device(pair[1]) if len(pair) > 1 else None
    threads = [d.num_threads or 1 for d in (first, second) if d is not None]
    cores = usable_cores()
    if second is not None and sum(threads) > len(cores):
        second = None
    model_key = whole_model_key(extraction.graph, first, provenance.tuning)
    keys = {how: replace(model_key, primfunc_hash=f"{model_key.primfunc_hash}:{how}") for how in ("alone", "stream")}
    if second is not None:
        keys["beside"] = replace(model_key, primfunc_hash=f"{model_key.primfunc_hash}:beside")
    recent = time.time() - CALIBRATION_MAX_AGE_S
    found = cache.get_many(list(keys.values()), recorded_after=recent) if cache and not fresh else {}
    if any(key not in found for key in keys.values()):
        plan = Plan({k: first.name for k in extraction.graph.kernels})
        built = build(apply_plan(model.mod, plan, platform, extraction=extraction, database=database))
        slots = [cores[: threads[0]], cores[threads[0] : sum(threads)]] if second is not None else [[]]
        timed = _alone_stream_together(built, model, slots, threads)
        found = {keys[how]: Measurement(seconds, 0.0, 1, "measured") for how, seconds in timed.items()}
        if cache:
            cache.put_many(found)
    alone = found[keys["alone"]].median_s
    per_call = found[keys["stream"]].median_s - alone
    log.info("%s: a stream pays %.1f us per segment call beyond one VM call at a time", first.name, per_call * 1e6)
    overheads = replace(overheads, stream_segment_s=max(0.0, per_call))
    if second is not None and alone > 0:
        factor = found[keys["beside"]].median_s / alone
        log.info("%s and %s at once: each inference %.2fx as long as alone", first.name, second.name, factor)
        if factor > overheads.corun_factor:
            overheads = replace(overheads, corun_factor=factor)
    return overheads


def _alone_stream_together(
    built: PlacedExecutable, model: BuiltModel, cores: list[list[int]], threads: list[int]
) -> dict[str, float]:
    """Median seconds per inference of ``built``: one VM call at a time on ``cores[0]`` ("alone"), a
    stream of as many on the concurrent executor ("stream"), and with two slots each VM's calls while
    the other runs it too ("beside"). The three are timed in turn, ``CALIBRATION_ROUNDS`` times, and the
    stream's excess and the two slots' ratio taken within each round: timed once each, on a VM whose
    speed drifts, resnet18@64's one-thread build read a stream excess of 0.83 ms a call (the executor's
    own cost measured 50-100 us on mobilenet_v2@64), and a run predicted its streams at 0.57 of what
    they measured."""
    params, inputs = [w for _, w in model.params], model.sample_inputs()
    results: dict[int, list[float]] = {}
    prepared: dict = {}  # one copy of the weights, as replicas read them (``routed``)

    def work(slot: int, calls: int, start: threading.Barrier) -> None:
        set_threads(threads[slot])
        pin_thread(cores[slot])
        runner = SingleVMRunner(built, params, num_threads=threads[slot], prepared=prepared)
        runner(inputs)
        start.wait()
        results[slot] = time_calls(runner, inputs, calls)

    def timed(slots: list[int], calls: int) -> list[float]:
        start = threading.Barrier(len(slots))
        workers = [threading.Thread(target=work, args=(slot, calls, start)) for slot in slots]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return [t for slot in slots for t in results[slot]]

    probe = statistics.median(timed([0], 3))
    calls = max(5, min(2000, math.ceil(SETTLE_S / max(probe, 1e-9))))
    flight = 1 + STREAM_SLACK
    stream = model.sample_stream(max(calls, 2 * flight), distinct=flight)
    rounds = []
    with ConcurrentRunner(built, params, prepared=prepared) as runner:
        for _ in range(CALIBRATION_ROUNDS):
            row = {"alone": statistics.median(timed([0], calls)), "stream": time_stream(runner, stream, flight)}
            if len(cores) > 1:
                row["beside"] = statistics.median(timed([0, 1], calls))
            rounds.append(row)
    return within_rounds(rounds)


def within_rounds(rounds: list[dict[str, float]]) -> dict[str, float]:
    """The median "alone" time, with the stream's excess over it and the "beside" ratio to it each taken
    within a round (the machine's speed may change between rounds) and their medians applied."""
    alone = statistics.median(row["alone"] for row in rounds)
    out = {"alone": alone, "stream": alone + statistics.median(row["stream"] - row["alone"] for row in rounds)}
    if all("beside" in row for row in rounds):
        out["beside"] = alone * statistics.median(row["beside"] / row["alone"] for row in rounds)
    return out


def single_device_runner(
    model: BuiltModel, extraction: Extraction, platform: Platform, device: Device, database=None
) -> SingleVMRunner:
    """The model built for ``device`` alone, as ``diviml run`` builds it, in a runner on its threads."""
    plan = Plan({k: device.name for k in extraction.graph.kernels})
    built = build(apply_plan(model.mod, plan, platform, extraction=extraction, database=database))
    return SingleVMRunner(built, [w for _, w in model.params], num_threads=device.num_threads)


def bare_vm_call(
    model: BuiltModel,
    extraction: Extraction,
    platform: Platform,
    device: Device,
    options: MeasureOptions,
    database=None,
) -> Measurement:
    """The single-device build's VM call alone (``single_device_runner``, weights packed as the build
    reads them), timed by TVM's ``time_evaluator``: the figure the sum of kernel times must match."""
    runner = single_device_runner(model, extraction, platform, device, database)
    set_threads(runner.num_threads)
    timer = runner.vm.time_evaluator(
        runner.built.placement.entry, runner.host, number=1, repeat=options.repeats, min_repeat_ms=options.min_repeat_ms
    )
    samples = np.asarray(timer(*runner.arguments(model.sample_inputs())).results, dtype=float)
    return Measurement(
        float(np.median(samples)), float(samples.std()), len(samples), "tuned" if database is not None else "measured"
    )


def runner_overhead_s(
    model: BuiltModel, extraction: Extraction, platform: Platform, device, *, repeats: int = 20
) -> float:
    """What ``SingleVMRunner`` adds to one inference of the single-device build on ``device`` (inputs
    uploaded, outputs to numpy): its median call less the bare VM call's, timed alternately."""
    runner = single_device_runner(model, extraction, platform, device)
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
    rtol: float | None = None,
    progress=print,
) -> tuple[Selection, dict, dict]:
    """Build and time ``candidate_set``'s plans; the fastest measured whose outputs match the reference
    within ``rtol`` (None: by their dtypes, ``tolerances.output_rtol``) wins. Latency is timed side by
    side, one inference of each candidate per round (drift and load then touch them alike); streams one
    candidate after another. Returns the selection, the builds and the timings (both by ``timing_key``).
    With a tuning ``database`` each single-device configuration is also built with the default
    schedules and timed beside the rest."""
    candidates = candidate_set(
        problem,
        chosen,
        count,
        tuned=database is not None,
        predict=lambda device, threads: predict_configuration(problem, model, extraction, device, threads, database),
    )
    inputs = model.sample_inputs()
    reference = run_reference(model, inputs)
    builds = build_candidates(model, extraction, problem.platform, candidates, database, progress)
    timed = [c for c in candidates if not c.left_out]
    if problem.objective == "latency":
        timings = _time_side_by_side(timed, builds, model, reference, repeats)
    else:
        timings = _time_streams_side_by_side(timed, builds, model, reference, stream_inputs, in_flight)
    for candidate in timed:
        timing = timings[timing_key(candidate)]
        candidate.outputs_differ = not timing.outputs.equal(rtol)
        progress(f"candidate {candidate.label}: {timing.measured_s * 1e3:.3f} ms per inference")
    return select_fastest(candidates, lambda c: timings[timing_key(c)].measured_s), builds, timings


def build_candidates(
    model: BuiltModel, extraction: Extraction, platform: Platform, candidates: list[Candidate], database, progress
) -> dict[tuple, tuple[PlacedExecutable | RoutedBuild, float]]:
    """Each candidate not left out, built once (by ``timing_key``), with its build seconds; a replicated
    plan's routes reuse the plain plans' builds (the whole model on cpu0 is ``cpu0 alone``'s build)."""
    builds: dict[tuple, tuple[PlacedExecutable | RoutedBuild, float]] = {}

    def plain(plan: Plan, threads: int | None = None, default_schedules: bool = False) -> PlacedExecutable:
        key = (plan_key(plan), threads, default_schedules)
        if key not in builds:
            built_for = platform if threads is None else platform.with_threads(plan.devices_used()[0], threads)
            schedules = None if default_schedules else database
            builds[key] = build_runnable(model, extraction, built_for, plan, database=schedules, progress=progress)
        return builds[key][0]

    for candidate in candidates:
        key = timing_key(candidate)
        if candidate.left_out or key in builds:
            continue
        began = time.perf_counter()
        if candidate.plan.replicas:
            built = build_routes(candidate.plan, plain, candidate.policy)
        else:
            built = plain(candidate.plan, candidate.threads, candidate.default_schedules)
        builds[key] = (built, time.perf_counter() - began)
    return builds


def predict_configuration(
    problem, model: BuiltModel, extraction: Extraction, device: Device, threads: int, database=None
) -> Problem | None:
    """The problem of ``device`` with ``threads`` threads (the whole CPU), priced by a cost model of
    the kind ``problem`` has, made for the platform with that device so: roofline, or measured here
    (kernels timed with that many threads through the profile cache, priced inside the model as it
    runs now). None for a cost table read from a file, which holds no such device."""
    platform = problem.platform.with_threads(device.name, threads)
    measured = problem.costs.provenance
    if isinstance(problem.costs, RooflineCostModel):
        costs = RooflineCostModel(problem.graph, platform)
    elif measured is not None:
        with ProfileCache(measured.cache_path) if measured.cache_path else contextlib.nullcontext() as cache:
            provenance = measure(
                problem.graph,
                platform,
                extraction,
                cache=cache,
                options=measured.options,
                tuning=measured.tuning,
                overheads=measured.machine_overheads,
            )
            if provenance.timed:  # timed now, as the configurations it is judged against are
                provenance = priced_in_context(
                    provenance, platform, model, extraction, cache=cache, database=database, fresh=True, executor=False
                )
        costs = TableCostModel.from_provenance(problem.graph, platform, provenance)
    else:
        return None
    return Problem(problem.graph, platform, costs, objective=problem.objective, stages=problem.stages)


def timing_key(candidate: Candidate) -> tuple:
    return plan_key(candidate.plan), candidate.threads, candidate.default_schedules, candidate.policy


def candidate_platform(platform: Platform, candidate: Candidate) -> Platform:
    """The platform ``candidate`` is built for: its one device given the candidate's threads, if any."""
    if candidate.threads is None:
        return platform
    (device,) = candidate.plan.devices_used()
    return platform.with_threads(device, candidate.threads)


def _time_side_by_side(
    candidates: list[Candidate], builds: dict, model: BuiltModel, reference: list[np.ndarray], repeats: int
) -> dict[tuple, BuildTiming]:
    """One inference at a time, each candidate ``WARM_CALLS`` + 1 times per round (the last timed: warm,
    as a model run again and again is), ``repeats`` rounds or more, until the fastest candidate too was timed for
    ``SETTLE_S``: a one-device build in one VM with its thread count, a multi-device build on the
    concurrent executor."""
    params = [w for _, w in model.params]
    inputs = model.sample_inputs()
    with contextlib.ExitStack() as stack:
        runners, checks, busy = {}, {}, {}
        for candidate in candidates:
            key = timing_key(candidate)
            runners[key] = stack.enter_context(open_runner(builds[key][0], params, candidate.threads))
            checks[key] = compare_outputs(runners[key](inputs), reference)
            busy[key] = Counter()
        samples: dict[tuple, list[float]] = {key: [] for key in runners}
        rounds = repeats
        while len(next(iter(samples.values()))) < rounds:
            for key, runner in runners.items():
                for _ in range(WARM_CALLS):  # untimed: the previous candidate left the caches and pool its own
                    runner(inputs)
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
        per_run = {d: s / len(samples[key]) for d, s in busy[key].items()} if concurrent else {runner.device: measured}
        out[key] = BuildTiming(
            measured, samples[key], per_run, 1, "concurrent" if concurrent else "single VM", checks[key]
        )
    return out


def _time_streams_side_by_side(
    candidates: list[Candidate],
    builds: dict,
    model: BuiltModel,
    reference: list[np.ndarray],
    stream_inputs: int,
    in_flight: int | None,
    rounds: int = 5,
) -> dict[tuple, BuildTiming]:
    """Each candidate's stream, ``in_flight`` inputs at a time (None: the candidate's own, as priced;
    else two per device), timed one stream of ``stream_inputs`` per candidate per round, the median of
    ``rounds`` rounds: drift and load touch every candidate alike."""
    params = [w for _, w in model.params]
    inputs = model.sample_inputs()
    keys = list(dict.fromkeys(timing_key(c) for c in candidates))
    flights, threads = {}, {}
    for candidate in candidates:
        key = timing_key(candidate)
        flights.setdefault(key, stream_in_flight(builds[key][0], in_flight or candidate.in_flight))
        threads.setdefault(key, candidate.threads)
    with contextlib.ExitStack() as stack:
        runners = {key: stack.enter_context(open_runner(builds[key][0], params, threads[key])) for key in keys}
        checks = {key: compare_outputs(runner(inputs), reference) for key, runner in runners.items()}
        streams = {key: model.sample_stream(stream_inputs, distinct=flights[key]) for key in keys}
        samples: dict[tuple, list[float]] = {key: [] for key in keys}
        busy: dict[tuple, Counter] = {key: Counter() for key in keys}
        for _ in range(rounds):
            for key, runner in runners.items():
                samples[key].append(time_stream(runner, streams[key], flights[key], rounds=1))
                busy[key].update({d: s / stream_inputs for d, s in runner.busy_s.items()})
        executors = {
            key: "single VM" if isinstance(runner, SingleVMRunner) else "concurrent" for key, runner in runners.items()
        }
    return {
        key: BuildTiming(
            statistics.median(samples[key]),
            samples[key],
            {d: s / rounds for d, s in busy[key].items()},
            flights[key],
            executors[key],
            checks[key],
        )
        for key in keys
    }


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
