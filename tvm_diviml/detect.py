"""This machine as a platform: ``diviml platforms --detect`` writes it as a file to keep and edit, and
``--platform local`` (``local:cores=K``) uses it directly.

The CPU: the cores this process may use, LLVM's name for it and its vector width (through TVM), its
caches (sysfs), its memory, an FMA-width estimate of its peak and a timed numpy copy for its memory
(``machine.py``). The GPUs: CUDA and ROCm devices as TVM's runtime lists them, their figures from the
datasheets of known parts (``machine.GPU_PARTS``) or, for a part not in that table, estimated from
its multiprocessors and clock and a timed copy; host <-> GPU links timed with TVM copies. Every
figure that is an estimate is noted under ``attrs.estimates``, which plan reports print.

TVM is imported only when a listing is made: the module is imported by ``presets.py``, which the
solvers' callers load without TVM.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass

from .errors import DivimlInputError
from .machine import (
    SCHEDULED_CPU_EFFICIENCY,
    SCHEDULED_GPU_EFFICIENCY,
    available_cores,
    cpu_caches,
    gpu_part,
    host_copy,
    host_cpu,
    memory_total_bytes,
    unknown_gpu_flops,
)
from .platform import Device, Link, Platform
from .runtime.measure import copy_seconds, time_link

log = logging.getLogger(__name__)

LOCAL = "local"
LAUNCH_OVERHEAD_S = 5e-6  # a kernel launch, CPU worker or CUDA stream (as the presets state)
DEVICE_COPY_BYTES = 256 << 20  # a device-to-device copy that times an unknown GPU's memory


@dataclass(frozen=True)
class LinkFigures:
    latency_s: float
    bandwidth_Bps: float


@dataclass(frozen=True)
class GpuRecord:
    """One GPU as TVM's runtime reports it, with its copies timed."""

    kind: str  # "cuda" or "rocm"
    index: int
    name: str  # as the driver reports it, e.g. "NVIDIA L4"
    compute_version: str  # e.g. "8.9"
    memory_bytes: float
    multiprocessors: int
    clock_hz: float
    upload: LinkFigures  # host -> GPU
    download: LinkFigures  # GPU -> host
    copy_bandwidth_Bps: float | None = None  # a copy within the GPU, bytes read + written; timed for unknown parts


@dataclass(frozen=True)
class CpuIsa:
    """LLVM's view of this machine's CPU, through TVM."""

    mcpu: str
    triple: str
    vector_bits: int


def cpu_isa() -> CpuIsa:
    import tvm
    from tvm.target import codegen

    from .schedules.analysis import vector_bits  # imports TVM: detect's plain import stays TVM-free

    mcpu = str(codegen.llvm_get_system_cpu())
    bits = vector_bits(tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    return CpuIsa(mcpu, str(codegen.llvm_get_system_triple()), bits)


@functools.cache
def list_gpus() -> tuple[GpuRecord, ...]:
    """The CUDA and ROCm GPUs TVM's runtime finds here, their copies timed (about a second per GPU)."""
    import tvm

    found = []
    for kind in ("cuda", "rocm"):
        index = 0
        while tvm.device(kind, index).exist:
            found.append(_gpu_record(kind, index))
            index += 1
    return tuple(found)


def _gpu_record(kind: str, index: int) -> GpuRecord:
    import tvm

    device = tvm.device(kind, index)
    name = str(device.device_name)
    host = Device("host", {"kind": "llvm"}, "cpu:0")
    gpu = Device(name, {"kind": kind}, f"{kind}:{index}")
    upload, download = _timed_link(host, gpu), _timed_link(gpu, host)
    return GpuRecord(
        kind=kind,
        index=index,
        name=name,
        compute_version=str(device.compute_version),
        memory_bytes=float(device.total_global_memory),
        multiprocessors=int(device.multi_processor_count),
        clock_hz=float(device.max_clock_rate) * 1e3,  # TVM reports kHz
        upload=LinkFigures(upload.latency_s, upload.bandwidth_Bps),
        download=LinkFigures(download.latency_s, download.bandwidth_Bps),
        copy_bandwidth_Bps=None if gpu_part(name) else _time_device_copy(device),
    )


def _timed_link(src: Device, dst: Device):
    """Copies from ``src`` to ``dst`` fitted to latency + bytes / bandwidth; timed again once where the
    times did not grow with the size (a noisy moment)."""
    try:
        return time_link(src, dst)
    except ValueError as error:
        log.warning("copies %s -> %s timed again: %s", src.device, dst.device, error)
        return time_link(src, dst, repeats=20)


def _time_device_copy(device, repeats: int = 5) -> float:
    """Bytes read and written per second by a copy within ``device``'s memory (the median of ``repeats``)."""
    import tvm

    source = tvm.runtime.empty((DEVICE_COPY_BYTES // 4,), "float32", device)
    target = tvm.runtime.empty((DEVICE_COPY_BYTES // 4,), "float32", device)
    return 2 * DEVICE_COPY_BYTES / copy_seconds(source, target, repeats)


def cores_split(spec: str) -> int | None:
    """``local`` -> None (the whole CPU as one device); ``local:cores=K`` -> K devices."""
    if spec == LOCAL:
        return None
    match = re.fullmatch(rf"{LOCAL}:cores=(\d+)", spec)
    cores = available_cores()
    if not match:
        raise DivimlInputError(
            f"cannot read '{spec}'",
            field="platform",
            hint=f"write local (the CPU as one device) or local:cores=K (K from 1 to {cores})",
        )
    count = int(match.group(1))
    if not 1 <= count <= cores:
        raise DivimlInputError(
            f"local:cores={count} splits {cores} cores into {count} devices",
            field="platform",
            hint=f"K is from 1 to {cores}, the cores this process may use",
        )
    return count


def local_platform(spec: str = LOCAL, gpus: list[GpuRecord] | tuple[GpuRecord, ...] | None = None) -> Platform:
    """This machine: its CPU as one device (``local``) or K devices that split its cores evenly
    (``local:cores=K``), then every GPU of ``gpus`` (default: ``list_gpus()``)."""
    split = cores_split(spec)
    gpus = list_gpus() if gpus is None else tuple(gpus)
    cpu, isa, copy, cores = host_cpu(), cpu_isa(), host_copy(), available_cores()
    memory = memory_total_bytes()
    count = split or 1
    estimates: dict[str, dict[str, str]] = {}
    cpus = _cpu_devices(split, cores, memory, cpu, copy, estimates)
    gpu_devices = _gpu_devices(gpus, estimates)
    kinds = f"{cores} cores" + ("" if split is None else f" as {count} devices")
    found = ", ".join(f"{device.name} ({record.name})" for device, record in gpu_devices) or "no GPU found"
    how = "CPU peak estimated from its FMA width, memory timed with numpy copies"
    if gpu_devices:
        how += (
            "; GPU peaks from the datasheets of known parts (else estimated), host <-> GPU links timed with "
            "TVM copies, GPU <-> GPU priced as two copies through host memory"
        )
    return Platform(
        LOCAL if split is None else spec,
        [*cpus, *(device for device, _ in gpu_devices)],
        _local_links(cpus, gpu_devices, copy),
        host=cpus[0].name,
        description=f"this machine: {cpu.model} ({isa.mcpu}, {isa.vector_bits}-bit vectors), {kinds}; {found}. "
        f"Detected: {how}",
        extra_attrs={
            "estimates": estimates,
            "detected": {
                "cpu": {
                    "model": cpu.model,
                    "mcpu": isa.mcpu,
                    "triple": isa.triple,
                    "vector_bits": isa.vector_bits,
                    "cores": cores,
                    "caches_bytes": cpu_caches(),
                    "memory_bytes": memory,
                },
                "gpus": [
                    {
                        "device": device.name,
                        "driver_name": record.name,
                        "compute_version": record.compute_version,
                        "multiprocessors": record.multiprocessors,
                        "clock_hz": record.clock_hz,
                    }
                    for device, record in gpu_devices
                ],
            },
        },
    )


def _cpu_devices(
    split: int | None, cores: int, memory: float | None, cpu, copy, estimates: dict[str, dict[str, str]]
) -> list[Device]:
    """The CPU as one device ``cpu`` (``split`` None) or ``split`` devices ``cpu{i}`` sharing its ``cores``
    and ``memory`` evenly (the first ones a core more where they do not divide); what each figure
    estimates noted in ``estimates``."""
    count = split or 1
    devices = []
    for i in range(count):
        threads = cores // count + (1 if i < cores % count else 0)
        name = "cpu" if split is None else f"cpu{i}"
        devices.append(
            Device(
                name,
                {"kind": "llvm"},
                f"cpu:{i}",
                memory_bytes=int(memory // count) if memory else None,
                peak_flops=cpu.core_flops * threads,
                bandwidth_Bps=readable(copy.bandwidth_Bps),
                efficiency=SCHEDULED_CPU_EFFICIENCY,
                launch_overhead_s=LAUNCH_OVERHEAD_S,
                num_threads=threads,
            )
        )
        estimates[name] = {"peak_flops": cpu.flops_note(threads), "bandwidth_Bps": copy.note}
    return devices


def _local_links(cpus: list[Device], gpu_devices: list[tuple[Device, GpuRecord]], copy) -> dict[tuple[str, str], Link]:
    """Between CPU devices: the timed host copy; host <-> GPU: each GPU's timed copies; GPU <-> GPU:
    through host memory, one copy down, then one up."""
    links = {}
    for a in cpus:
        for b in cpus:
            if a is not b:
                links[(a.name, b.name)] = Link(
                    a.name, b.name, readable(copy.link_latency_s), readable(copy.link_bandwidth_Bps)
                )
    for gpu, record in gpu_devices:
        for host in cpus:
            links[(host.name, gpu.name)] = Link(host.name, gpu.name, *_figures(record.upload))
            links[(gpu.name, host.name)] = Link(gpu.name, host.name, *_figures(record.download))
    for a, source in gpu_devices:
        for b, destination in gpu_devices:
            if a is not b:
                bandwidth = 1 / (1 / source.download.bandwidth_Bps + 1 / destination.upload.bandwidth_Bps)
                latency = source.download.latency_s + destination.upload.latency_s
                links[(a.name, b.name)] = Link(a.name, b.name, readable(latency), readable(bandwidth))
    return links


def _figures(link: LinkFigures) -> tuple[float, float]:
    return readable(link.latency_s), readable(link.bandwidth_Bps)


def readable(value: float) -> float:
    """A timed figure to three significant digits: what a timing supports, and what a person edits."""
    return float(f"{value:.3g}")


def _gpu_devices(gpus: tuple[GpuRecord, ...], estimates: dict[str, dict[str, str]]) -> list[tuple[Device, GpuRecord]]:
    """A Device per GPU record: named by its part (``l4``, ``a100_0``), its figures the part's
    datasheet's or, for a part not in the table, estimated (noted in ``estimates``)."""
    shorts = [_short_name(record) for record in gpus]
    made = []
    for record, short in zip(gpus, shorts):
        name = short if shorts.count(short) == 1 else f"{short}_{shorts[: len(made)].count(short)}"
        part = gpu_part(record.name)
        if part is not None:
            flops, bandwidth = part.fp32_flops, part.bandwidth_Bps
        else:
            if record.copy_bandwidth_Bps is None:
                raise DivimlInputError(
                    f"GPU {record.kind}:{record.index} ({record.name}) is not a known part, and its memory "
                    "was not timed",
                    field="gpus",
                    hint="give its copy_bandwidth_Bps (list_gpus times it)",
                )
            flops, note = unknown_gpu_flops(record.kind, record.multiprocessors, record.clock_hz)
            bandwidth = readable(record.copy_bandwidth_Bps)
            estimates[name] = {
                "peak_flops": note,
                "bandwidth_Bps": "not a known part: a copy within its memory, timed (the datasheet figure is higher)",
            }
        made.append(
            (
                Device(
                    name,
                    _gpu_target(record),
                    f"{record.kind}:{record.index}",
                    memory_bytes=record.memory_bytes,
                    peak_flops=flops,
                    bandwidth_Bps=bandwidth,
                    efficiency=SCHEDULED_GPU_EFFICIENCY,
                    launch_overhead_s=LAUNCH_OVERHEAD_S,
                    part=record.name,
                ),
                record,
            )
        )
    return made


def _short_name(record: GpuRecord) -> str:
    """A GPU's device name: its part's model (``a100``, ``rtx4090``, ``mi300x``), ``gpu`` when unknown."""
    part = gpu_part(record.name)
    if part is None:
        return "gpu"
    words = re.sub(r"^(NVIDIA (GeForce )?|AMD Instinct )", "", part.name).split()
    return "".join(words[:2] if words[0] in ("RTX", "GTX") else words[:1]).lower()


def _gpu_target(record: GpuRecord) -> dict:
    """``{"kind": "cuda", "arch": "sm_89"}`` from CUDA's compute version; ROCm's TVM finds itself."""
    version = re.fullmatch(r"(\d+)\.(\d+)", record.compute_version)
    if record.kind == "cuda" and version:
        return {"kind": "cuda", "arch": f"sm_{version.group(1)}{version.group(2)}"}
    return {"kind": record.kind}
