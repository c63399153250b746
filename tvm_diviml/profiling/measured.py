"""Kernel costs measured with TVM on the devices that are present; roofline estimates for the rest.

What is timed is what the build runs: every distinct PrimFunc of the lowered module, built in one
``tvm.compile`` per target with the schedules the heterogeneous build applies (dlight's default
rules on GPU targets; nothing on llvm, which is what TVM 0.27 builds for the CPU; a MetaSchedule
database where one is given), each timed with ``time_evaluator`` on its own random arguments.
Results are cached per (PrimFunc hash, target, device, TVM version, schedule), so a second run of
the same model measures nothing. Links between present devices are timed with copies of several
sizes and fitted to latency + bytes / bandwidth. A kernel TVM cannot compile is named in one line
(``passes.build.compile_failure``, as the placed build names it). ``measure`` returns the figures
(a ``cost.Provenance``); ``cost.TableCostModel.from_provenance`` prices from them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import platform as host_platform
import sys
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import tvm
from tqdm import tqdm

from ..cost.base import ExecutorOverheads
from ..cost.provenance import DeviceTimings, MeasureOptions, Provenance
from ..errors import DivimlInputError, first_line, raise_if_interrupted
from ..graph import OpGraph
from ..passes.build import compile_failure
from ..passes.extract import Extraction
from ..platform import Device, Link, Platform
from ..runtime.measure import time_link
from ..runtime.vm import set_threads
from ..schedules.apply import rules_digest, schedule_names
from ..schedules.database import database_digest, schedule_for_target, tuning_target
from ..schedules.target import device_target
from ..servers import corun_groups, server_of
from .cache import LinkKey, Measurement, ProfileCache, ProfileKey
from .overheads import corun_factor, executor_overheads
from .tuning import TuningBudget, check_database_covers, open_database, tune_primfuncs

log = logging.getLogger(__name__)


def device_present(device: Device) -> bool:
    """Whether this process can time kernels for ``device``: the platform allows it, TVM finds the
    device, and a GPU's compute capability is the one its target names (an sm_75 target is not
    measured on an sm_90 GPU)."""
    if not device.measure:
        return False
    found = tvm.device(device.kind, device.index)
    if not found.exist:
        return False
    arch = device.target.get("arch") if isinstance(device.target, dict) else None
    if device.kind == "cuda" and arch:
        return arch == "sm_" + str(found.compute_version).replace(".", "")
    return True


def tvm_target(device: Device):
    return device_target(device)


def check_targets(platform: Platform, source: str | None = None) -> None:
    """Every device's target is one TVM builds: checked when the platform is loaded to be measured or
    run, so that a typo (``llvmm``, ``num_cores`` for ``num-cores``) is named before any work."""
    for device in platform.devices:
        try:
            tvm_target(device)
        except Exception as error:  # TVM raises ValueError or its own types for a target it rejects
            raise_if_interrupted()
            raise DivimlInputError(
                f"TVM rejects target {device.target!r} ({first_line(error)})",
                source=source,
                field=f"devices[{device.name}].target",
                hint='write a target TVM knows, e.g. {"kind": "llvm", "num-cores": 4} or '
                '{"kind": "cuda", "arch": "sm_90"}',
            ) from None


def existing_tuning(work_dir: str, devices: list[Device], funcs: dict[str, Any]) -> dict[str, Any]:
    """A user's MetaSchedule database applied on every present device of its target kind; refused where
    it holds no record for any of ``funcs`` (the model's PrimFuncs) on those devices."""
    database = open_database(work_dir)
    present = [d for d in devices if device_present(d)]
    check_database_covers(database, funcs, [tuning_target(tvm_target(d)) for d in present], work_dir)
    tuned = SimpleNamespace(database=database, digest=database_digest(database))
    return {d.name: tuned for d in present}


def tune_for_devices(funcs: dict[str, Any], devices: list[Device], budget, work_root: str, progress: bool = True):
    """Tune ``funcs`` with MetaSchedule for each present device's target within ``budget`` (a
    ``TuningBudget``); device name -> the TuningResult of its target's database. A record applies only
    to builds of the thread count it was tuned for, so each distinct CPU thread count (``devices`` may
    name a device twice: cpu0 alone and as the whole CPU) is a search of its own; the budget's minutes
    are shared equally among the searches, its trials are each one's. Devices of one target kind and
    attributes share one database, persisted under ``work_root`` so that later runs resume."""
    searches: dict[str, tuple[str, Any, list[str]]] = {}  # target as text -> work_dir, target, devices
    for device in devices:
        if not device_present(device):
            continue
        target = tuning_target(tvm_target(device))
        exported = target.export()
        kind_key = json.dumps({k: v for k, v in exported.items() if k != "num-cores"}, sort_keys=True, default=str)
        work_dir = f"{work_root}/{device.kind}-{hashlib.sha256(kind_key.encode()).hexdigest()[:12]}"
        search = searches.setdefault(json.dumps(exported, sort_keys=True, default=str), (work_dir, target, []))
        search[2].append(device.name)
    share = TuningBudget(budget.trials, budget.minutes / max(1, len(searches)))
    done: dict[str, Any] = {}  # work_dir -> its latest search's result (the digest of every record)
    for work_dir, target, names in searches.values():
        if progress:
            cores = int(target.attrs["num-cores"]) if target.kind.name == "llvm" else 0
            threads = f", {cores} thread{'s' * (cores != 1)}" if cores else ""
            print(f"tuning {len(funcs)} kernels for {'/'.join(dict.fromkeys(names))}{threads} ({share.describe()}) ...")
        done[work_dir] = tune_primfuncs(funcs, target, share, work_dir, progress=progress)
    return {name: done[work_dir] for work_dir, _, names in searches.values() for name in names}


def schedule_name(device: Device, tuned_digest: str | None = None) -> str:
    """What schedules a device's kernels, as the profile cache keys it: a tuning database, our CPU
    rules (their code's digest: a changed rule times its kernels again) or dlight's GPU rules."""
    if tuned_digest:
        return f"tuned:{tuned_digest}"
    if device.kind == "cpu":
        return f"rules:{rules_digest()}"
    return "dlight"


def profile_device_label(device: Device) -> str:
    """What, besides the target, makes two devices time a kernel alike: kind and thread count."""
    return f"{device.kind}/threads={device.num_threads}" if device.kind == "cpu" else device.kind


def random_arguments(func, device) -> list:
    """One tensor per buffer parameter: normal floats; integer buffers (indices) all zero, so that
    gathers stay in bounds."""
    rng = np.random.default_rng(0)
    args = []
    for param in func.params:  # TVM 0.27: a PrimFunc's parameters are its buffers
        shape = tuple(int(d) for d in param.shape)
        dtype = str(param.dtype)
        if np.issubdtype(np.dtype(dtype), np.floating):
            array = rng.standard_normal(shape).astype(dtype)
        else:
            array = np.zeros(shape, dtype=dtype)
        args.append(tvm.runtime.tensor(array, device))
    return args


def set_cpu_threads(device: Device) -> None:
    if device.kind == "cpu":
        set_threads(device.num_threads or 0)  # 0: TVM's default, whatever this thread ran before


def time_primfuncs(
    funcs: dict[str, Any], device: Device, options: MeasureOptions, database=None, source: str = "measured"
) -> dict[str, Measurement]:
    """Build ``funcs`` (name -> PrimFunc) in one compile for ``device``'s target and time each."""
    target = tvm_target(device)
    named = {name: func.with_attr("global_symbol", name) for name, func in funcs.items()}
    mod = schedule_for_target(tvm.IRModule(named), target, database)
    try:
        library = tvm.compile(mod, target=target)
    except Exception as error:  # TVM's codegen raises errors of many types
        raise compile_failure(mod, error, target) from None
    runtime_module = library.mod
    dev = tvm.device(device.kind, device.index)
    set_cpu_threads(device)
    results: dict[str, Measurement] = {}
    for name in tqdm(
        named, desc=f"timing kernels on {device.name}", unit="kernel", disable=not options.progress, leave=False
    ):
        args = random_arguments(mod[name], dev)
        evaluator = runtime_module.time_evaluator(
            name, dev, number=1, repeat=options.repeats, min_repeat_ms=options.min_repeat_ms
        )
        timing = evaluator(*args)
        samples = np.asarray(timing.results, dtype=float)
        results[name] = Measurement(float(np.median(samples)), float(samples.std()), len(samples), source)
    return results


def kernel_schedules(funcs: dict[str, Any], device: Device, database=None) -> dict[str, str]:
    """PrimFunc name -> what schedules it on ``device`` as the build does: a rule of ``schedules/``,
    "tuned", or "unscheduled" (milliseconds: nothing is compiled)."""
    named = {name: func.with_attr("global_symbol", name) for name, func in funcs.items()}
    return schedule_names(schedule_for_target(tvm.IRModule(named), tvm_target(device), database))


# The runner and build whose whole-model timings calibrate kernels in context: a cheaper runner, a
# one-device build with static memory planning or a timing that runs until it settles makes old figures stale.
WHOLE_MODEL_RUNNER = "single-vm-3"


def profile_key(device: Device, subject: str, tuned=None) -> ProfileKey:
    """The cache key of ``subject`` (a PrimFunc hash, or a whole model's) timed on ``device``, whose
    kernels ``tuned`` (a TuningResult, or None) scheduled."""
    target_key = json.dumps(tvm_target(device).export(), sort_keys=True, default=str)
    return ProfileKey(
        subject,
        target_key,
        profile_device_label(device),
        tvm.__version__,
        schedule_name(device, tuned.digest if tuned else None),
    )


def whole_model_key(graph: OpGraph, device: Device, tuning: Mapping[str, Any]) -> ProfileKey:
    """The cache key of ``graph``'s whole-model time on ``device`` (the model: its graph's digest)."""
    digest = hashlib.sha256(json.dumps(graph.to_json(), sort_keys=True, default=str).encode()).hexdigest()
    return profile_key(device, f"model:{digest}:{WHOLE_MODEL_RUNNER}", tuning.get(device.name))


def measure(
    graph: OpGraph,
    platform: Platform,
    extraction: Extraction,
    *,
    cache: ProfileCache | None = None,
    options: MeasureOptions | None = None,
    tuning: Mapping[str, Any] | None = None,
    overheads: ExecutorOverheads | None = None,
) -> Provenance:
    """Time ``graph``'s kernels (each distinct PrimFunc of ``extraction`` once) on every present device,
    the concurrent executor's overheads where two devices are present, and the links between them,
    through ``cache``; absent devices are left to the roofline estimate (said loudly). ``tuning``: device
    name -> the TuningResult whose MetaSchedule database the build applies there (its digest goes into
    the cache key). ``overheads``: the executor's costs as another profile of this machine measured them
    in this process (else timed afresh where two devices are present: a second or more)."""
    options, tuning = options or MeasureOptions(), dict(tuning or {})
    present = [d for d in platform.devices if device_present(d)]
    absent = [d.name for d in platform.devices if d not in present]
    if absent:
        log.warning("devices not present here, priced by the roofline estimate: %s", ", ".join(absent))
    timed, measured_now = {}, 0
    for device in present:
        timed[device.name], fresh = _time_kernels(graph, device, extraction, cache, options, tuning.get(device.name))
        measured_now += fresh
    if overheads is None:
        overheads = _executor_overheads(platform, present, cache) if len(present) > 1 else ExecutorOverheads()
    return Provenance(
        timed,
        absent,
        _time_links(platform, present, cache, overheads.handoff_s),
        machine_overheads=overheads,
        executor_overheads=overheads,
        measured_now=measured_now,
        cache_path=cache.path if cache else None,
        options=options,
        tuning=tuning,
    )


def _time_kernels(
    graph: OpGraph, device: Device, extraction: Extraction, cache: ProfileCache | None, options: MeasureOptions, tuned
) -> tuple[DeviceTimings, int]:
    """``graph``'s kernels on ``device``, each PrimFunc timed once (or read from ``cache``), and how many
    were timed now."""
    source = "tuned" if tuned else "measured"
    database = tuned.database if tuned else None
    hash_of = {
        k.attrs["primfunc"]: k.attrs["primfunc_hash"] for k in graph.kernels.values() if "primfunc_hash" in k.attrs
    }
    names = sorted(set(extraction.kernel_func.values()))
    keys = {name: profile_key(device, hash_of[name], tuned) for name in names}
    cached = cache.get_many(list(keys.values())) if cache else {}
    missing = {name: extraction.mod[name] for name, key in keys.items() if key not in cached}
    fresh: dict[str, Measurement] = {}
    if missing:
        log.info("timing %d kernels on %s (%d from the cache)", len(missing), device.name, len(names) - len(missing))
        fresh = time_primfuncs(missing, device, options, database, source)
        if cache:
            cache.put_many({keys[name]: m for name, m in fresh.items()})
    by_name = {name: fresh[name] if name in fresh else cached[keys[name]] for name in names}
    schedules = kernel_schedules({name: extraction.mod[name] for name in names}, device, database)
    func = extraction.kernel_func
    timings = DeviceTimings(
        source,
        {k: by_name[func[k]].median_s for k in graph.kernels},
        {k: by_name[func[k]].spread_s for k in graph.kernels},
        {k: schedules[func[k]] for k in graph.kernels},
    )
    return timings, len(fresh)


def _time_links(
    platform: Platform, present: list[Device], cache: ProfileCache | None, handoff_s: float
) -> dict[tuple[str, str], Link]:
    """Each link between two present devices of one server, timed with copies of several sizes (or read
    from ``cache``) and fitted, plus the executor's hand-off from one device's worker to the other's
    (what a run of the plan pays); a link whose copy times do not grow with size keeps the platform's
    figures. Across servers: the platform's network figures (devices of two servers share TVM device
    strings)."""
    server = server_of(platform)
    links = {}
    for src in present:
        for dst in present:
            if src.name == dst.name or server[src.name] != server[dst.name]:
                continue
            key = LinkKey(src.device, dst.device, host_platform.node(), tvm.__version__)
            measured = cache.get_link(key) if cache else None
            if measured is None:
                try:
                    measured = time_link(src, dst)
                except ValueError as error:  # copy times that do not grow with size: noise
                    log.warning(
                        "link %s -> %s not fitted (%s); using the platform's figures", src.name, dst.name, error
                    )
                    continue
                if cache:
                    cache.put_link(key, measured)
            links[(src.name, dst.name)] = Link(
                src.name, dst.name, measured.latency_s + handoff_s, measured.bandwidth_Bps
            )
    return links


def _executor_overheads(platform: Platform, present: list[Device], cache: ProfileCache | None) -> ExecutorOverheads:
    """The concurrent executor's overheads on this machine (``overheads.executor_overheads``), through the
    profile cache: a second of timing no-op runs, kept per host and Python version. The co-run factor is
    timed afresh in every process whose platform has two CPU devices here (~1 s): it is the host's
    doing and moves with it (this VM: 1.00 most of the time, a twin-branch plan's kernels 1.55x slower
    on both workers for minutes at a time while one device alone kept its speed)."""
    names = [f.name for f in dataclasses.fields(ExecutorOverheads) if f.name != "corun_factor"]
    where = f"python{sys.version_info.major}.{sys.version_info.minor}/{host_platform.node()}"
    keys = {name: ProfileKey(f"executor:{name}", "python", where, tvm.__version__, "default") for name in names}
    cached = cache.get_many(list(keys.values())) if cache else {}
    if all(key in cached for key in keys.values()):
        overheads = ExecutorOverheads(**{name: cached[key].median_s for name, key in keys.items()})
    else:
        log.info("timing the concurrent executor's overheads (no-op segments)")
        overheads = executor_overheads()
        if cache:
            cache.put_many(
                {key: Measurement(getattr(overheads, name), 0.0, 1, "measured") for name, key in keys.items()}
            )
    here = {d.name for d in present}
    if any(len(group & here) > 1 for group in corun_groups(platform)):
        log.info("timing how much two CPU workers slow each other here")
        return dataclasses.replace(overheads, corun_factor=corun_factor())
    return dataclasses.replace(overheads, corun_factor=1.0)
