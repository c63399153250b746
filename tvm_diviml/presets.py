"""The named platforms (cpuN, paper-node, h200-node, gpuK, local) and ``load_platform``: a --platform
spec (a preset name, ``local``, ``servers:...`` or a JSON file) to a Platform. It sits above
``platform.py`` (the types) and ``servers.py`` (several servers), so that a server kind can name a
preset without a cycle; ``local`` is this machine as ``detect.py`` finds it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from .detect import LOCAL, local_platform
from .errors import DivimlInputError
from .machine import SCHEDULED_CPU_EFFICIENCY, SCHEDULED_GPU_EFFICIENCY, available_cores, host_core_flops
from .platform import Device, Link, LinkTable, Platform, register_file_form
from .servers import PREFIX, servers_from_json, servers_platform


def _full_mesh(
    devices: list[Device], link_for: Callable[[Device, Device], tuple[float, float | None]]
) -> dict[tuple[str, str], Link]:
    """A link for every ordered pair of distinct devices, its (latency, bandwidth) from ``link_for``."""
    links = {}
    for a in devices:
        for b in devices:
            if a.name != b.name:
                latency, bandwidth = link_for(a, b)
                links[(a.name, b.name)] = Link(a.name, b.name, latency, bandwidth)
    return links


# cpu1 and cpu2 plan anywhere (tests, docs and servers:2xcpu1 name them); a larger cpuN must fit the cores.
ALWAYS_AVAILABLE_CPUS = 2


def cpu_n(count: int) -> Platform:
    """This machine's CPU as ``count`` single-thread devices (``cpu:0`` ... ), the platform that really
    runs here: each a core of this CPU (its FMA-width peak, ``machine.host_core_flops``), 8 GiB and 20
    GB/s. Copies between them are memcpy within one memory (~5 µs, ~10 GB/s)."""
    cores = available_cores()
    if count < 1 or count > max(cores, ALWAYS_AVAILABLE_CPUS):
        raise DivimlInputError(
            f"cpu{count} asks for {count} single-thread devices and this machine has {cores} cores",
            field="platform",
            hint=f"use cpu1 to cpu{cores}, or local:cores=K to split the cores into K devices",
        )
    devices = [
        Device(
            name=f"cpu{i}",
            target={"kind": "llvm"},
            device=f"cpu:{i}",
            memory_bytes=8 * 2**30,
            peak_flops=host_core_flops(),
            bandwidth_Bps=20e9,
            efficiency=SCHEDULED_CPU_EFFICIENCY,
            launch_overhead_s=5e-6,
            num_threads=1,
        )
        for i in range(count)
    ]
    return Platform(
        f"cpu{count}",
        devices,
        _full_mesh(devices, lambda a, b: (5e-6, 10e9)),
        description=f"this machine's CPU as {count} single-thread devices (runs here)",
    )


def cpu2() -> Platform:
    """This machine's CPU as two single-thread devices: the default of ``diviml run``."""
    return replace(cpu_n(2), description="this machine's CPU as two single-thread devices (runs here)")


def paper_node() -> Platform:
    """A CPU plus two *distinct* GPUs on PCIe 3.0 x16, shaped like DiviML's testbed (one CPU and
    two different GPUs in one server).

    Data sheets: Intel Xeon Gold 6230 (20 cores, AVX-512, 2 FMA units, 2.1 GHz: 20 x 32 x 2 x 2.1
    = 2.7 TFLOP/s fp32; 6 channels DDR4-2933 = 140 GB/s); NVIDIA GeForce RTX 2080 Ti (13.4 TFLOP/s
    fp32 boost, 616 GB/s GDDR6, 11 GB); NVIDIA GeForce GTX 1080 Ti (11.3 TFLOP/s fp32, 484 GB/s
    GDDR5X, 11 GB); PCIe 3.0 x16: 15.75 GB/s raw, ~12 GB/s achieved, ~10 µs per copy. GPU efficiency
    ``SCHEDULED_GPU_EFFICIENCY`` (typical of untuned but scheduled kernels); CPU efficiency
    ``SCHEDULED_CPU_EFFICIENCY``, measured (see its comment), printed with every estimate. GPU to GPU
    copies go peer to peer over the same PCIe switch. The CPU describes that testbed's Xeon, not this
    machine's CPU, so it is never measured here (``measure=False``): always the roofline estimate.
    """
    devices = [
        Device(
            "cpu",
            {"kind": "llvm"},
            "cpu:0",
            memory_bytes=192 * 2**30,
            peak_flops=2.69e12,
            bandwidth_Bps=140e9,
            efficiency=SCHEDULED_CPU_EFFICIENCY,
            launch_overhead_s=5e-6,
            num_threads=20,
            measure=False,
        ),
        Device(
            "rtx2080ti",
            {"kind": "cuda", "arch": "sm_75"},
            "cuda:0",
            memory_bytes=11 * 2**30,
            peak_flops=13.4e12,
            bandwidth_Bps=616e9,
            efficiency=SCHEDULED_GPU_EFFICIENCY,
            launch_overhead_s=5e-6,
        ),
        Device(
            "gtx1080ti",
            {"kind": "cuda", "arch": "sm_61"},
            "cuda:1",
            memory_bytes=11 * 2**30,
            peak_flops=11.3e12,
            bandwidth_Bps=484e9,
            efficiency=SCHEDULED_GPU_EFFICIENCY,
            launch_overhead_s=5e-6,
        ),
    ]
    return Platform(
        "paper-node",
        devices,
        _full_mesh(devices, lambda a, b: (10e-6, 12e9)),
        description="CPU + RTX 2080 Ti + GTX 1080 Ti over PCIe 3.0 (DiviML-like testbed)",
    )


def h200_node() -> Platform:
    """A host CPU plus one NVIDIA H200 (the GPU this project is lent), over PCIe Gen5 x16.

    Data sheets: H200 SXM 141 GB HBM3e at 4.8 TB/s, 67 TFLOP/s fp32 (non-tensor); host AMD EPYC
    9654 class (96 cores, AVX-512, 2.4 GHz: about 7.4 TFLOP/s fp32; 12 channels DDR5-4800 = 460
    GB/s); PCIe Gen5 x16 64 GB/s per direction raw, ~50 GB/s achieved.
    """
    devices = [
        Device(
            "cpu",
            {"kind": "llvm"},
            "cpu:0",
            memory_bytes=512 * 2**30,
            peak_flops=7.4e12,
            bandwidth_Bps=460e9,
            efficiency=SCHEDULED_CPU_EFFICIENCY,
            launch_overhead_s=5e-6,
            num_threads=96,
        ),
        Device(
            "h200",
            {"kind": "cuda", "arch": "sm_90"},
            "cuda:0",
            memory_bytes=141e9,
            peak_flops=67e12,
            bandwidth_Bps=4.8e12,
            efficiency=SCHEDULED_GPU_EFFICIENCY,
            launch_overhead_s=4e-6,
        ),
    ]
    return Platform(
        "h200-node",
        devices,
        _full_mesh(devices, lambda a, b: (8e-6, 50e9)),
        description="host CPU + one H200 over PCIe Gen5",
    )


def gpu_k(count: int) -> Platform:
    """``count`` identical H100-class GPUs and nothing else, joined by NVLink-class links
    (fourth-generation NVLink: 450 GB/s per direction, ~3 µs), for pipeline benchmarks. Data sheet:
    H100 SXM 67 TFLOP/s fp32, 3.35 TB/s HBM3, 80 GB. Inputs start on ``gpu0``."""
    if not 1 <= count <= 1024:
        raise DivimlInputError(f"gpuK needs 1 <= K <= 1024, got {count}", field="platform")
    gpus = [
        Device(
            f"gpu{i}",
            {"kind": "cuda", "arch": "sm_90"},
            f"cuda:{i}",
            memory_bytes=80 * 2**30,
            peak_flops=67e12,
            bandwidth_Bps=3.35e12,
            efficiency=SCHEDULED_GPU_EFFICIENCY,
            launch_overhead_s=4e-6,
        )
        for i in range(count)
    ]
    return Platform(
        f"gpu{count}",
        gpus,
        LinkTable([g.name for g in gpus], (3e-6, 450e9)),
        description=f"{count} identical H100-class GPUs on NVLink-class links",
    )


def cpu1() -> Platform:
    """This machine's CPU as one single-thread device: a server kind for several loopback RPC servers
    on this 2-core machine (``servers:2xcpu1``), one core each."""
    device = replace(cpu_n(1).devices[0], name="cpu")
    return Platform("cpu1", [device], {}, description="this machine's CPU as one single-thread device (runs here)")


PRESETS: dict[str, Callable[[], Platform]] = {
    "cpu1": cpu1,
    "cpu2": cpu2,
    "paper-node": paper_node,
    "h200-node": h200_node,
}


def preset_names() -> list[str]:
    return list(PRESETS) + [
        "cpuN (N single-thread devices of this CPU, e.g. cpu4)",
        "gpuK (K = 1..1024, e.g. gpu4)",
        "local[:cores=K] (this machine, detected)",
        "servers:NxKIND[+MxKIND] (e.g. servers:4xpaper-node)",
    ]


def load_platform(spec: str) -> Platform:
    """A preset name (``cpu2``, ``cpu4``, ``paper-node``, ``h200-node``, ``gpu8``), this machine
    (``local``, ``local:cores=K``: ``detect.py``), several servers (``servers:4xpaper-node``, see
    ``servers.py``) or a platform JSON file."""
    if spec.startswith(PREFIX):
        return servers_platform(spec, load_platform)
    if spec in PRESETS:
        return PRESETS[spec]()
    if spec == LOCAL or spec.startswith(LOCAL + ":"):
        return local_platform(spec)
    match = re.fullmatch(r"gpu(\d+)", spec)
    if match:
        return gpu_k(int(match.group(1)))
    match = re.fullmatch(r"cpu(\d+)", spec)
    if match:
        return cpu_n(int(match.group(1)))
    if spec.endswith(".json"):
        return Platform.load(spec)
    raise DivimlInputError(
        f"unknown platform '{spec}'",
        field="platform",
        hint=f"use a preset ({', '.join(preset_names())}) or a platform .json file",
    )


get_platform = load_platform  # the name callers have always used

# A platform file of servers ({"servers": [...]}) read through Platform.from_json names its kinds as specs.
register_file_form("servers", partial(servers_from_json, load_kind=load_platform))
