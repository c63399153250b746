"""What this machine's CPU and memory are, read from the OS and timed briefly with numpy, and the
datasheet figures of known GPUs: the figures that a platform's ``"estimate"`` stands for and that
``detect.py`` writes into a detected platform. TVM-free (the GPUs present are listed by ``detect.py``).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

# The fraction of a CPU's peak that whole models reach with their kernels scheduled by tvm-diviml's
# CPU rules: measured by `diviml bench --suite cpu` on 2026-12-02 (AMD EPYC, Zen 5, AVX-512, one thread
# of 2 cores, quiet machine): resnet50 0.67, mobilenet_v2 0.50, bert_base at 128 tokens 0.80,
# inception_v3 0.67 of the attainable peak (a cache-resident matmul: 227 GFLOP/s), geomean 0.65.
# TVM 0.27's own unscheduled kernels reached about 0.005. A preset CPU is priced at this fraction of
# its datasheet peak, on the assumption that its cores scale as one does.
SCHEDULED_CPU_EFFICIENCY = 0.65
# The fraction of a GPU's datasheet peaks that untuned but scheduled kernels (dlight's rules) reach.
SCHEDULED_GPU_EFFICIENCY = 0.35
# The clock assumed where /proc/cpuinfo gives none (stated in every note that uses it).
FALLBACK_CPU_MHZ = 2500.0


@dataclass(frozen=True)
class HostCpu:
    """This machine's CPU as /proc/cpuinfo and the scheduler describe it."""

    model: str
    cores: int  # the cores this process may run on (its affinity), not the machine's count
    fp32_lanes: int  # AVX-512 16, AVX2 8, else 4
    clock_mhz: float
    clock_read: bool  # False: FALLBACK_CPU_MHZ

    @property
    def core_flops(self) -> float:
        """One core's fp32 peak: lanes x two FMA units x 2 FLOP x the nominal clock."""
        return self.fp32_lanes * 2 * 2 * self.clock_mhz * 1e6

    def flops_note(self, threads: int) -> str:
        """How ``core_flops * threads`` was reached, for a figure's estimate note."""
        clock = f"{self.clock_mhz / 1e3:.2f} GHz" + ("" if self.clock_read else " (clock not read: assumed)")
        return (
            f"this machine's CPU ({self.model}): {self.fp32_lanes} fp32 lanes x 2 FMA units x 2 FLOP x {clock} "
            f"x {threads} thread{'s' if threads > 1 else ''}, from /proc/cpuinfo"
        )


@functools.cache
def host_cpu() -> HostCpu:
    flags, mhz, model = set(), None, "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "flags" and not flags:
                    flags = set(value.split())
                elif key == "cpu MHz":  # the last core's, as the presets have always read it
                    mhz = float(value)
                elif key == "model name" and model == "unknown CPU":
                    model = value.strip()
    except (OSError, ValueError):
        pass
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    read = mhz is not None and mhz > 0
    return HostCpu(model, available_cores(), lanes, mhz if read else FALLBACK_CPU_MHZ, read)


def available_cores() -> int:
    """The cores this process may run on: its affinity (a container's or taskset's share), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_core_flops() -> float:
    """One core of this machine's CPU: its fp32 peak (``HostCpu.core_flops``)."""
    return host_cpu().core_flops


def cpu_caches() -> dict[str, int]:
    """cpu0's caches from sysfs, by name (``L1d``, ``L1i``, ``L2``, ``L3``) to bytes; {} where unreadable."""
    caches: dict[str, int] = {}
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = sorted(e for e in os.listdir(root) if e.startswith("index"))
    except OSError:
        return caches
    for entry in entries:
        try:
            fields = {}
            for name in ("level", "type", "size"):
                with open(os.path.join(root, entry, name)) as file:
                    fields[name] = file.read().strip()
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(fields["type"], "")
        size = re.fullmatch(r"(\d+)([KMG]?)", fields["size"])
        if size:
            caches[f"L{fields['level']}{suffix}"] = (
                int(size.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[size.group(2)]
            )
    return caches


def memory_total_bytes() -> float | None:
    """This machine's memory: MemTotal, or the cgroup's limit where that is lower (a container's share)."""
    total = None
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemTotal:"):
                    total = float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as file:
            limit = file.read().strip()
        if limit.isdigit() and (total is None or int(limit) < total):
            total = float(limit)
    except OSError:
        pass
    return total


@dataclass(frozen=True)
class HostCopy:
    """This machine's memory, timed with numpy copies: ``bandwidth_Bps`` counts the bytes read and
    written (a STREAM copy), the link figures are one copy's latency and bytes per second."""

    bandwidth_Bps: float
    link_latency_s: float
    link_bandwidth_Bps: float
    note: str


SMALL_COPY_BYTES = 4 << 10
LARGE_COPY_BYTES = 64 << 20


@functools.cache
def host_copy(repeats: int = 5) -> HostCopy:
    """Copies of 4 KiB and 64 MiB, the median of ``repeats`` each after one to warm up (about 0.1 s):
    the small one's time is the latency, the difference the bandwidth. One thread copies, so the
    bandwidth is a floor for several cores reading at once."""
    import numpy as np

    def median_copy_s(nbytes: int) -> float:
        source, target = np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
        samples = []
        for _ in range(repeats + 1):
            began = time.perf_counter()
            np.copyto(target, source)
            samples.append(time.perf_counter() - began)
        return float(np.median(samples[1:]))

    small, large = median_copy_s(SMALL_COPY_BYTES), median_copy_s(LARGE_COPY_BYTES)
    per_byte = max(large - small, 1e-9) / (LARGE_COPY_BYTES - SMALL_COPY_BYTES)
    figures = HostCopy(
        bandwidth_Bps=2 * LARGE_COPY_BYTES / large,
        link_latency_s=small,
        link_bandwidth_Bps=1 / per_byte,
        note="this machine's memory, timed with one-thread numpy copies of 4 KiB and 64 MiB",
    )
    log.info(
        "host memory: copy %.1f GB/s (read + write), a 4 KiB copy %.2f us",
        figures.bandwidth_Bps / 1e9,
        small * 1e6,
    )
    return figures


@dataclass(frozen=True)
class GpuPart:
    """A GPU's datasheet figures. ``pattern`` matches its name as the driver reports it (or as a
    person writes it), upper-cased with every run of other characters than letters and digits one space."""

    name: str
    pattern: str
    fp32_flops: float  # FLOP/s, fp32 without tensor cores (vector ALUs on AMD)
    bandwidth_Bps: float  # memory bandwidth, bytes/s
    remark: str = ""

    def note(self) -> str:
        remark = f", {self.remark}" if self.remark else ""
        return (
            f"datasheet of {self.name}: {self.fp32_flops / 1e12:g} TFLOP/s fp32, "
            f"{self.bandwidth_Bps / 1e9:g} GB/s{remark}"
        )


# Vendors' datasheets. The first pattern that matches names the part, so variants come before the base part.
GPU_PARTS = (
    GpuPart("NVIDIA H200 NVL", r"\bH200\b.*\bNVL\b", 60e12, 4.8e12),
    GpuPart("NVIDIA H200 SXM", r"\bH200\b", 67e12, 4.8e12),
    GpuPart("NVIDIA H100 NVL", r"\bH100\b.*\bNVL\b", 60e12, 3.9e12),
    GpuPart("NVIDIA H100 PCIe", r"\bH100\b.*\bPCIE\b", 51e12, 2.0e12),
    GpuPart("NVIDIA H100 SXM", r"\bH100\b", 67e12, 3.35e12),
    GpuPart("NVIDIA A100 80GB PCIe", r"\bA100\b(?=.*\b80GB\b)(?=.*\bPCIE\b)", 19.5e12, 1.935e12),
    GpuPart("NVIDIA A100 80GB SXM", r"\bA100\b.*\b80GB\b", 19.5e12, 2.039e12),
    GpuPart("NVIDIA A100 40GB", r"\bA100\b", 19.5e12, 1.555e12),
    GpuPart("NVIDIA L40S", r"\bL40S\b", 91.6e12, 864e9),
    GpuPart("NVIDIA L40", r"\bL40\b", 90.5e12, 864e9),
    GpuPart("NVIDIA L4", r"\bL4\b", 30.3e12, 300e9),
    GpuPart("NVIDIA A10", r"\bA10\b", 31.2e12, 600e9),
    GpuPart("NVIDIA T4", r"\bT4\b", 8.1e12, 320e9),
    GpuPart("NVIDIA V100S", r"\bV100S\b", 16.4e12, 1134e9),
    GpuPart("NVIDIA V100 PCIe", r"\bV100\b.*\bPCIE\b", 14e12, 900e9),
    GpuPart("NVIDIA V100 SXM2", r"\bV100\b", 15.7e12, 900e9),
    GpuPart("NVIDIA GeForce RTX 4090", r"\bRTX ?4090\b", 82.6e12, 1008e9),
    GpuPart("NVIDIA GeForce RTX 3090", r"\bRTX ?3090\b", 35.6e12, 936e9),
    GpuPart("NVIDIA GeForce RTX 2080 Ti", r"\bRTX ?2080 ?TI\b", 13.4e12, 616e9),
    GpuPart("NVIDIA GeForce GTX 1080 Ti", r"\bGTX ?1080 ?TI\b", 11.3e12, 484e9),
    GpuPart("AMD Instinct MI300X", r"\bMI300X\b", 81.7e12, 5.3e12),
    # ROCm lists each of an MI250(X)'s two dies as a device: the figures are one die's, half the card's.
    GpuPart("AMD Instinct MI250X", r"\bMI250X\b", 23.95e12, 1.6384e12, "one of its two dies"),
    GpuPart("AMD Instinct MI250", r"\bMI250\b", 22.65e12, 1.6384e12, "one of its two dies"),
    GpuPart("AMD Instinct MI210", r"\bMI210\b", 22.6e12, 1.6384e12),
)


def gpu_part(text: str) -> GpuPart | None:
    """The known part that ``text`` (a driver's device name, a device's name or a TVM target tag) names."""
    normalised = " " + re.sub(r"[^A-Z0-9]+", " ", str(text).upper()) + " "
    return next((part for part in GPU_PARTS if re.search(part.pattern, normalised)), None)


def known_part_names() -> str:
    """The known parts, vendor names left out: for hints."""
    return ", ".join(re.sub(r"^(NVIDIA (GeForce )?|AMD Instinct )", "", part.name) for part in GPU_PARTS)


# FP32 lanes per streaming multiprocessor (NVIDIA, Ampere and later consumer parts, Hopper) or per
# compute unit (AMD CDNA/RDNA): what an unknown part's peak is estimated from.
FP32_LANES_PER_UNIT = {"cuda": 128, "rocm": 64}


def unknown_gpu_flops(kind: str, units: int, clock_hz: float) -> tuple[float, str]:
    """An unknown GPU's fp32 peak from its multiprocessors and clock, and the note that says so."""
    lanes = FP32_LANES_PER_UNIT.get(kind, 64)
    flops = units * clock_hz * lanes * 2
    word = "SMs" if kind == "cuda" else "compute units"
    note = (
        f"not a known part: {units} {word} x {clock_hz / 1e9:.2f} GHz x {lanes} fp32 lanes x 2 FLOP "
        "(an upper estimate; give the datasheet figure)"
    )
    return flops, note
