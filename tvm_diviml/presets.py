"""The named platforms (cpu1, cpu2, paper-node, h200-node, gpuK) and ``load_platform``: a --platform
spec (a preset name, ``servers:...`` or a JSON file) to a Platform. It sits above ``platform.py`` (the
types) and ``servers.py`` (several servers), so that a server kind can name a preset without a cycle."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from .errors import DivimlInputError
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


# The fraction of a CPU's peak that whole models reach with their kernels scheduled by tvm-diviml's
# CPU rules: measured by `diviml bench --suite cpu` on 2026-12-02 (AMD EPYC, Zen 5, AVX-512, one thread
# of 2 cores, quiet machine): resnet50 0.67, mobilenet_v2 0.50, bert_base at 128 tokens 0.80,
# inception_v3 0.67 of the attainable peak (a cache-resident matmul: 227 GFLOP/s), geomean 0.65.
# TVM 0.27's own unscheduled kernels reached about 0.005. A preset CPU is priced at this fraction of
# its datasheet peak, on the assumption that its cores scale as one does.
SCHEDULED_CPU_EFFICIENCY = 0.65


def _host_core_flops() -> float:
    """This machine's CPU, one core: vector lanes (AVX-512 16, AVX2 8, else 4 fp32) x two FMA units x 2
    FLOP x its nominal clock, read from /proc/cpuinfo (2.5 GHz where it cannot be read)."""
    flags, mhz = set(), 2500.0
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "flags" and not flags:
                    flags = set(value.split())
                elif key.strip() == "cpu MHz":
                    mhz = float(value)
    except (OSError, ValueError):
        pass
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    return lanes * 2 * 2 * mhz * 1e6


def cpu2() -> Platform:
    """This machine's CPU as two devices (``cpu:0``, ``cpu:1``), one thread each: the platform
    that really runs here. Copies between them are memcpy within one memory (~5 µs, ~10 GB/s)."""
    devices = [
        Device(
            name=f"cpu{i}",
            target={"kind": "llvm"},
            device=f"cpu:{i}",
            memory_bytes=8 * 2**30,
            peak_flops=_host_core_flops(),
            bandwidth_Bps=20e9,
            efficiency=SCHEDULED_CPU_EFFICIENCY,
            launch_overhead_s=5e-6,
            num_threads=1,
        )
        for i in range(2)
    ]
    return Platform(
        "cpu2",
        devices,
        _full_mesh(devices, lambda a, b: (5e-6, 10e9)),
        description="this machine's CPU as two single-thread devices (runs here)",
    )


def paper_node() -> Platform:
    """A CPU plus two *distinct* GPUs on PCIe 3.0 x16, shaped like DiviML's testbed (one CPU and
    two different GPUs in one server).

    Data sheets: Intel Xeon Gold 6230 (20 cores, AVX-512, 2 FMA units, 2.1 GHz: 20 x 32 x 2 x 2.1
    = 2.7 TFLOP/s fp32; 6 channels DDR4-2933 = 140 GB/s); NVIDIA GeForce RTX 2080 Ti (13.4 TFLOP/s
    fp32 boost, 616 GB/s GDDR6, 11 GB); NVIDIA GeForce GTX 1080 Ti (11.3 TFLOP/s fp32, 484 GB/s
    GDDR5X, 11 GB); PCIe 3.0 x16: 15.75 GB/s raw, ~12 GB/s achieved, ~10 µs per copy. GPU efficiency
    0.35 (typical of untuned but scheduled kernels); CPU efficiency ``SCHEDULED_CPU_EFFICIENCY``,
    measured (see its comment), printed with every estimate. GPU to GPU copies go peer to peer over
    the same PCIe switch. The CPU describes that testbed's Xeon, not this
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
            efficiency=0.35,
            launch_overhead_s=5e-6,
        ),
        Device(
            "gtx1080ti",
            {"kind": "cuda", "arch": "sm_61"},
            "cuda:1",
            memory_bytes=11 * 2**30,
            peak_flops=11.3e12,
            bandwidth_Bps=484e9,
            efficiency=0.35,
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
            efficiency=0.35,
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
            efficiency=0.35,
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
    device = replace(cpu2().devices[0], name="cpu")
    return Platform("cpu1", [device], {}, description="this machine's CPU as one single-thread device (runs here)")


PRESETS: dict[str, Callable[[], Platform]] = {
    "cpu1": cpu1,
    "cpu2": cpu2,
    "paper-node": paper_node,
    "h200-node": h200_node,
}


def preset_names() -> list[str]:
    return list(PRESETS) + ["gpuK (K = 1..1024, e.g. gpu4)", "servers:NxKIND[+MxKIND] (e.g. servers:4xpaper-node)"]


def load_platform(spec: str) -> Platform:
    """A preset name (``cpu2``, ``paper-node``, ``h200-node``, ``gpu8``), several servers
    (``servers:4xpaper-node``, see ``servers.py``) or a platform JSON file."""
    if spec.startswith(PREFIX):
        return servers_platform(spec, load_platform)
    if spec in PRESETS:
        return PRESETS[spec]()
    match = re.fullmatch(r"gpu(\d+)", spec)
    if match:
        return gpu_k(int(match.group(1)))
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
