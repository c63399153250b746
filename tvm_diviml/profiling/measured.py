"""Kernel costs measured with TVM on the devices that are present; roofline estimates for the rest.

What is timed is what the build runs: every distinct PrimFunc of the lowered module, built in one
``tvm.compile`` per target with the schedules the heterogeneous build applies (dlight's default
rules on GPU targets; nothing on llvm, which is what TVM 0.27 builds for the CPU; a MetaSchedule
database where one is given), each timed with ``time_evaluator`` on its own random arguments.
Results are cached per (PrimFunc hash, target, device, TVM version, schedule), so a second run of
the same model measures nothing. Links between present devices are timed with copies of several
sizes and fitted to latency + bytes / bandwidth. A kernel TVM cannot compile is named in one line
(``passes.build.compile_failure``, as the placed build names it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import platform as host_platform
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cost.base import CostModel, ExecutorOverheads
from ..cost.roofline import RooflineCostModel
from ..errors import DivimlInputError, first_line, raise_if_interrupted
from ..graph import OpGraph
from ..passes.build import compile_failure
from ..platform import Device, Link, Platform
from ..runtime.measure import time_link
from ..schedules.database import database_digest, schedule_for_target, tuning_target
from .cache import LinkKey, Measurement, ProfileCache, ProfileKey

log = logging.getLogger(__name__)


@dataclass
class MeasureOptions:
    repeats: int = 5  # timed repeats; the median is the cost
    min_repeat_ms: int = 20  # each repeat runs the kernel enough times to last this long
    progress: bool = True


def device_present(device: Device) -> bool:
    """Whether this process can time kernels for ``device``: the platform allows it, TVM finds the
    device, and a GPU's compute capability is the one its target names (an sm_75 target is not
    measured on an sm_90 GPU)."""
    import tvm

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
    from ..schedules.target import device_target

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
    from types import SimpleNamespace

    from .tuning import check_database_covers, open_database

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
    import hashlib

    from .tuning import TuningBudget, tune_primfuncs

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
        from ..schedules.apply import rules_digest

        return f"rules:{rules_digest()}"
    return "dlight"


def profile_device_label(device: Device) -> str:
    """What, besides the target, makes two devices time a kernel alike: kind and thread count."""
    return f"{device.kind}/threads={device.num_threads}" if device.kind == "cpu" else device.kind


def random_arguments(func, device) -> list:
    """One tensor per buffer parameter: normal floats; integer buffers (indices) all zero, so that
    gathers stay in bounds."""
    import tvm

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
    from ..runtime.vm import set_threads

    if device.kind == "cpu":
        set_threads(device.num_threads or 0)  # 0: TVM's default, whatever this thread ran before


def time_primfuncs(
    funcs: dict[str, Any], device: Device, options: MeasureOptions, database=None, source: str = "measured"
) -> dict[str, Measurement]:
    """Build ``funcs`` (name -> PrimFunc) in one compile for ``device``'s target and time each."""
    import tvm
    from tqdm import tqdm

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
    import tvm

    from ..schedules.apply import schedule_names

    named = {name: func.with_attr("global_symbol", name) for name, func in funcs.items()}
    return schedule_names(schedule_for_target(tvm.IRModule(named), tvm_target(device), database))


# The runner and build whose whole-model timings calibrate kernels in context: a cheaper runner, a
# one-device build with static memory planning or a timing that runs until it settles makes old figures stale.
WHOLE_MODEL_RUNNER = "single-vm-3"


class MeasuredCostModel(CostModel):
    """Measured seconds where the device is present, roofline estimates (said loudly) elsewhere.

    A kernel costs its measured time plus what running inside the model adds to it (calibrated from
    the whole model's run, else the device's launch overhead); a copy between two present devices
    costs the fitted copy time plus the concurrent executor's hand-off from one device's worker
    thread to the other's (measured once per process), which is what a run of the plan pays; and
    the simulator prices latency plans segment by segment, as the executor runs them.

    ``mod`` and ``kernel_func`` come from an Extraction: the lowered module, and each graph node's
    PrimFunc name in it. ``tuning`` maps a device name to the TuningResult whose MetaSchedule
    database the build applies on that device (its digest goes into the cache key).
    ``executor_overheads``: the executor's costs as another model of this machine measured them in this
    process (the co-run factor is timed afresh otherwise, a second or more)."""

    executor_segments = True

    def __init__(
        self,
        graph: OpGraph,
        platform: Platform,
        mod: Any,
        kernel_func: dict[str, str],
        *,
        cache: ProfileCache | None = None,
        options: MeasureOptions | None = None,
        tuning: dict[str, Any] | None = None,
        executor_overheads: ExecutorOverheads | None = None,
    ):
        super().__init__(platform)
        self.graph, self.mod, self.kernel_func = graph, mod, kernel_func
        self.cache, self.options = cache, options or MeasureOptions()
        self.tuning = tuning or {}
        self.hash_of = {
            k.attrs["primfunc"]: k.attrs["primfunc_hash"] for k in graph.kernels.values() if "primfunc_hash" in k.attrs
        }
        self.times: dict[str, dict[str, float]] = {}  # device -> PrimFunc name -> seconds
        self.spread: dict[str, dict[str, float]] = {}
        self.origin: dict[str, str] = {}  # device -> "measured" | "tuned"
        self.schedules: dict[str, dict[str, str]] = {}  # device -> PrimFunc name -> what schedules it
        self.links: dict[tuple[str, str], Link] = {}
        self.measured_now = 0  # kernels timed in this run, not from the cache
        self.in_context_s: dict[str, float] = {}  # device -> per-kernel cost of running inside the model
        self.in_context_scale: dict[str, float] = {}  # device -> factor on its kernels' times alone (<= 1)
        self.estimate = RooflineCostModel(graph, platform)
        present = [d for d in platform.devices if device_present(d)]
        self.absent = [d.name for d in platform.devices if d not in present]
        if self.absent:
            log.warning("devices not present here, priced by the roofline estimate: %s", ", ".join(self.absent))
        for device in present:
            self._measure_device(device)
        if executor_overheads is not None:  # measured already in this process (another model of this machine)
            self.executor_overheads = executor_overheads
        elif len(present) > 1:
            self.executor_overheads = self._executor_overheads(present)
        # the machine's figures (no-op segments, the synthetic co-run probe), before this model's own
        # timings in context raise them (``passes.timing.executor_in_context``)
        self.machine_overheads = self.executor_overheads
        self._measure_links(present)

    # -------------------------------------------------------------- kernels
    def _profile_key(self, device: Device, subject: str) -> ProfileKey:
        """The cache key of ``subject`` (a PrimFunc hash, or a whole model's) timed on ``device``."""
        import tvm

        target_key = json.dumps(tvm_target(device).export(), sort_keys=True, default=str)
        tuned = self.tuning.get(device.name)
        return ProfileKey(
            subject,
            target_key,
            profile_device_label(device),
            tvm.__version__,
            schedule_name(device, tuned.digest if tuned else None),
        )

    def whole_model_key(self, device: str) -> ProfileKey:
        """The cache key of this model's whole-model time on ``device`` (the model: its graph's digest)."""
        digest = hashlib.sha256(json.dumps(self.graph.to_json(), sort_keys=True, default=str).encode()).hexdigest()
        return self._profile_key(self.platform.device(device), f"model:{digest}:{WHOLE_MODEL_RUNNER}")

    def _measure_device(self, device: Device) -> None:
        tuned = self.tuning.get(device.name)
        source = "tuned" if tuned else "measured"
        names = sorted(set(self.kernel_func.values()))
        keys = {name: self._profile_key(device, self.hash_of[name]) for name in names}
        cached = self.cache.get_many(list(keys.values())) if self.cache else {}
        missing = {name: self.mod[name] for name, key in keys.items() if key not in cached}
        fresh: dict[str, Measurement] = {}
        if missing:
            log.info(
                "timing %d kernels on %s (%d from the cache)", len(missing), device.name, len(names) - len(missing)
            )
            fresh = time_primfuncs(missing, device, self.options, tuned.database if tuned else None, source)
            self.measured_now += len(fresh)
            if self.cache:
                self.cache.put_many({keys[name]: m for name, m in fresh.items()})
        by_name = {name: fresh[name] if name in fresh else cached[keys[name]] for name in names}
        self.schedules[device.name] = kernel_schedules(
            {name: self.mod[name] for name in names}, device, tuned.database if tuned else None
        )
        self.times[device.name] = {name: m.median_s for name, m in by_name.items()}
        self.spread[device.name] = {name: m.spread_s for name, m in by_name.items()}
        self.origin[device.name] = source

    def schedule_of(self, kernel: str, device: str) -> str:
        """What schedules ``kernel`` on ``device``: a rule, "tuned", "unscheduled", or "-" (estimated)."""
        return self.schedules.get(device, {}).get(self.kernel_func[kernel], "-")

    def compute_s(self, kernel: str, device: str) -> float:
        allowed = self.graph.kernels[kernel].allowed_devices
        if allowed is not None and device not in allowed:
            return math.inf
        measured = self.times.get(device)
        if measured is None:
            return self.estimate.compute_s(kernel, device)
        # time_evaluator times the kernel alone; inside the model the VM's call, allocations and colder
        # caches add to each kernel: measured by calibrate_in_context, else the device's launch overhead.
        overhead = self.in_context_s.get(device, self.platform.device(device).launch_overhead_s)
        return measured[self.kernel_func[kernel]] * self.in_context_scale.get(device, 1.0) + overhead

    def calibrate_in_context(self, device: str, whole_model_s: float) -> float:
        """Price ``device``'s kernels as they run inside the model, so that they sum to the whole model's
        measured time on it (the single-device build, one inference): what the whole takes beyond its
        kernels timed alone is spread evenly over the kernels; where the kernels alone sum to more than
        the whole (their timings were disturbed: the machine was busier then), each is scaled down by
        the same factor, which keeps their ratios. Returns the per-kernel addition."""
        alone = sum(self.times[device][self.kernel_func[k]] for k in self.graph.kernels)
        self.in_context_s[device] = max(0.0, (whole_model_s - alone) / max(1, len(self.graph)))
        self.in_context_scale[device] = min(1.0, whole_model_s / alone) if alone > 0 else 1.0
        if self.in_context_scale[device] < 1.0:
            log.warning(
                "%s: its kernels timed alone sum to %.3f ms, more than the whole model's %.3f ms: the machine "
                "was busier while they were timed; each kernel is priced at %.2f of its time alone",
                device,
                alone * 1e3,
                whole_model_s * 1e3,
                math.floor(self.in_context_scale[device] * 100) / 100,
            )
        return self.in_context_s[device]

    def roofline_fit(self, device: str):
        """The roofline fitted to ``device``'s measured kernels (how far to trust the estimate);
        raises ValueError where no fit is possible."""
        from ..cost.fit import fit_roofline

        kernels = list(self.graph.kernels.values())
        return fit_roofline(
            np.array([k.flops for k in kernels]),
            np.array([k.bytes_moved for k in kernels]),
            np.array([self.compute_s(k.name, device) for k in kernels]),
        )

    def spread_s(self, kernel: str, device: str) -> float | None:
        spread = self.spread.get(device)
        return None if spread is None else spread[self.kernel_func[kernel]]

    def source(self, kernel: str, device: str) -> str:
        return self.origin.get(device, "estimated")

    # -------------------------------------------------------------- links
    def _measure_links(self, present: list[Device]) -> None:
        import tvm

        from ..servers import server_of

        handoff_s = self.executor_overheads.handoff_s
        server = server_of(self.platform)  # devices of two servers share TVM device strings
        for src in present:
            for dst in present:
                if src.name == dst.name or server[src.name] != server[dst.name]:
                    continue  # across servers: the platform's network figures
                key = LinkKey(src.device, dst.device, host_platform.node(), tvm.__version__)
                measured = self.cache.get_link(key) if self.cache else None
                if measured is None:
                    try:
                        measured = time_link(src, dst)
                    except ValueError as error:  # copy times that do not grow with size: noise
                        log.warning(
                            "link %s -> %s not fitted (%s); using the platform's figures", src.name, dst.name, error
                        )
                        continue
                    if self.cache:
                        self.cache.put_link(key, measured)
                self.links[(src.name, dst.name)] = Link(
                    src.name, dst.name, measured.latency_s + handoff_s, measured.bandwidth_Bps
                )

    def _executor_overheads(self, present: list[Device]) -> ExecutorOverheads:
        """The concurrent executor's overheads on this machine (``runtime.measure.executor_overheads``),
        through the profile cache: a second of timing no-op runs, kept per host and Python version.
        The co-run factor is timed afresh in every process whose platform has two CPU devices here
        (~1 s): it is the host's doing and moves with it (this VM: 1.00 most of the time, a twin-branch
        plan's kernels 1.55x slower on both workers for minutes at a time while one device alone
        kept its speed)."""
        import tvm

        from ..servers import corun_groups
        from .overheads import corun_factor, executor_overheads

        names = [f.name for f in dataclasses.fields(ExecutorOverheads) if f.name != "corun_factor"]
        where = f"python{sys.version_info.major}.{sys.version_info.minor}/{host_platform.node()}"
        keys = {name: ProfileKey(f"executor:{name}", "python", where, tvm.__version__, "default") for name in names}
        cached = self.cache.get_many(list(keys.values())) if self.cache else {}
        if all(key in cached for key in keys.values()):
            overheads = ExecutorOverheads(**{name: cached[key].median_s for name, key in keys.items()})
        else:
            log.info("timing the concurrent executor's overheads (no-op segments)")
            overheads = executor_overheads()
            if self.cache:
                self.cache.put_many(
                    {key: Measurement(getattr(overheads, name), 0.0, 1, "measured") for name, key in keys.items()}
                )
        here = {d.name for d in present}
        if any(len(group & here) > 1 for group in corun_groups(self.platform)):
            log.info("timing how much two CPU workers slow each other here")
            return dataclasses.replace(overheads, corun_factor=corun_factor())
        return dataclasses.replace(overheads, corun_factor=1.0)

    def transfer_s(self, nbytes: float, src: str, dst: str) -> float:
        if src == dst:
            return 0.0
        link = self.links.get((src, dst))
        return link.transfer_s(nbytes) if link else self.platform.transfer_s(nbytes, src, dst)

    # -------------------------------------------------------------- export
    def to_table(self):
        """All costs (kernels and links) as a TableCostModel: measure here, plan anywhere. The table says
        what it was measured for (each kernel's fingerprint, the model, each device's target, the
        versions), so that it never prices another model's kernels of the same names."""
        from .. import __version__
        from ..cost.table import TableCostModel, tvm_version

        compute = {k: {d: self.compute_s(k, d) for d in self.platform.device_names} for k in self.graph.kernels}
        sources = {d: self.source(next(iter(self.graph.kernels)), d) for d in self.platform.device_names}
        return TableCostModel(
            self.platform,
            compute,
            dict(self.links),
            sources,
            executor_segments=self.executor_segments,
            prediction_error=self.prediction_error,
            executor_overheads=self.executor_overheads,
            fingerprints={name: kernel.fingerprint for name, kernel in self.graph.kernels.items()},
            made_for={
                "model": self.graph.name,
                "targets": {d.name: d.target for d in self.platform.devices},
                "versions": {"tvm": tvm_version(), "tvm_diviml": __version__},
            },
        )


def time_whole_model(
    mod, entry: str, inputs: list, weights: list, device: Device, options: MeasureOptions, database=None
) -> Measurement:
    """The lowered module run whole by the Relax VM on ``device``, with the same schedules as the
    per-kernel builds: the figure the sum of kernel times must match."""
    import tvm
    from tvm import relax

    target = tvm_target(device)
    scheduled = schedule_for_target(mod, target, database)
    executable = tvm.compile(scheduled, target=target, relax_pipeline=relax.get_default_pipeline(target))
    dev = tvm.device(device.kind, device.index)
    set_cpu_threads(device)
    vm = relax.VirtualMachine(executable, dev)
    args = [tvm.runtime.tensor(a, dev) for a in inputs] + [
        w.copyto(dev) if hasattr(w, "copyto") else tvm.runtime.tensor(w, dev) for w in weights
    ]
    timing = vm.time_evaluator(entry, dev, number=1, repeat=options.repeats, min_repeat_ms=options.min_repeat_ms)(*args)
    samples = np.asarray(timing.results, dtype=float)
    return Measurement(
        float(np.median(samples)), float(samples.std()), len(samples), "tuned" if database is not None else "measured"
    )
