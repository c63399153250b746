"""``diviml profile``'s job: every kernel of a model timed on the platform's present devices (roofline
estimates for the rest), with how far to trust the figures: the roofline fitted to each measured device,
the links, the executor's own overheads and the model's time as a whole against its kernels'; and, per
kernel class, the FLOP/s achieved on each timed CPU device against that CPU's measured peak."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..cost.fit import fit_costs
from ..cost.table import TableCostModel
from ..machine import available_cores
from ..passes.extract import Extraction
from ..profiling.peak import measured_peak_flops_per_s
from ..schedules.analysis import find_contraction, linear_in, uses
from ..units import format_seconds
from .job import AS_GIVEN, LoadOptions
from .run import fallback_warnings
from .workload import load_workload

DEFAULT_PLATFORM = "cpu2"  # this machine's CPU as two single-thread devices
# Classes whose kernels move bytes rather than multiply-add: a fraction of the FMA peak says nothing of them.
BYTES_BOUND_CLASSES = ("Injective", "RowReduction")


@dataclass
class ProfileReport:
    """What a profile found: a row per kernel and device and a row per kernel class and timed CPU device
    (``--json``), the report as ``diviml profile`` prints it (``text``), warnings of kernels left to the
    Fallback schedule, and the costs (``export``)."""

    rows: list[dict[str, Any]]
    classes: list[dict[str, Any]]
    text: str
    warnings: list[str]
    costs: TableCostModel  # measured here: its provenance says how

    def to_json(self) -> dict[str, Any]:
        return {"kernels": self.rows, "classes": self.classes}

    def export(self, path: str) -> str:
        """Every cost (kernels and links) written as a cost table that ``--cost PATH`` reads; the line that
        says so."""
        self.costs.save(path)
        return f"all costs written to {path}: plan anywhere with --cost {path}"


def profile_report(model: str, platform: str | None = None, *, load: LoadOptions = AS_GIVEN) -> ProfileReport:
    """Time every kernel of ``model`` on ``platform``'s present devices (default cpu2, this machine),
    from the profile cache where it was timed before."""
    workload = load_workload(model, platform or DEFAULT_PLATFORM, "measured", **load.keywords())
    costs = workload.costs
    provenance = costs.provenance
    rows = [
        kernel_row(costs, kernel, device)
        for kernel in workload.graph.topo_order
        for device in workload.platform.device_names
    ]
    extraction = workload.loaded.extraction
    classes = class_rows(extraction, costs, cpu_peaks(costs))
    lines = [*table_lines(rows), *class_table_lines(classes)]
    lines += [*roofline_fit_lines(workload.graph, costs), *link_lines(costs)]
    lines += [*executor_lines(costs), *in_context_lines(costs)]
    lines.append(f"\n{provenance.measured_now} kernels timed now, the rest from the cache ({provenance.cache_path})")
    if provenance.absent:
        lines.append(f"estimated by the roofline (not present here): {', '.join(provenance.absent)}")
    return ProfileReport(rows, classes, "\n".join(lines), fallback_warnings(costs, extraction), costs)


def kernel_row(costs, kernel: str, device: str) -> dict[str, Any]:
    """One kernel on one device: its median and spread, where the figure comes from, its schedule."""
    spread = costs.provenance.spread_s(kernel, device)
    return {
        "kernel": kernel,
        "device": device,
        "median_us": costs.compute_s(kernel, device) * 1e6,
        "spread_us": None if spread is None else spread * 1e6,
        "source": costs.source(kernel, device),
        "schedule": costs.provenance.schedule_of(kernel, device),
    }


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'kernel':<44}{'device':<12}{'median us':>14}{'spread us':>12}  {'source':<10}schedule"]
    for row in rows:
        spread = "-" if row["spread_us"] is None else f"{row['spread_us']:.1f}"
        lines.append(
            f"{row['kernel'][:43]:<44}{row['device']:<12}{row['median_us']:>14.1f}{spread:>12}  "
            f"{row['source']:<10}{row['schedule']}"
        )
    return lines


@dataclass(frozen=True)
class CpuPeak:
    flops: float  # FLOP/s
    threads: int


def cpu_peaks(costs: TableCostModel) -> dict[str, CpuPeak]:
    """Each timed CPU device's measured fp32 peak at its threads (all usable cores where it names none)."""
    threads = {
        device.name: device.num_threads or available_cores()
        for device in costs.platform.devices
        if device.kind == "cpu" and device.name in costs.provenance.timed
    }
    return {device: CpuPeak(measured_peak_flops_per_s(count), count) for device, count in threads.items()}


@dataclass
class ClassTotals:
    kernels: int = 0
    flops: float = 0.0
    seconds: float = 0.0


def class_rows(extraction: Extraction, costs: TableCostModel, peaks: Mapping[str, CpuPeak]) -> list[dict[str, Any]]:
    """Per device of ``peaks`` and kernel class (the rule that scheduled
    the kernel there, convolutions split by kind), dearest first: the kernels, their share of the
    model's time there, FLOPs, time, FLOP/s and its fraction of the peak (None where bytes bound)."""
    kinds: dict[str, str] = {}  # PrimFunc -> its convolution's kind, analysed once for every device
    rows = []
    for device, peak in peaks.items():
        totals = class_totals(extraction, costs, device, kinds)
        model_s = sum(total.seconds for total in totals.values())
        for name, total in sorted(totals.items(), key=lambda item: -item[1].seconds):
            achieved = total.flops / total.seconds if total.seconds > 0 else 0.0
            bytes_bound = name in BYTES_BOUND_CLASSES or total.flops == 0
            rows.append(
                {
                    "device": device,
                    "class": name,
                    "kernels": total.kernels,
                    "share": total.seconds / model_s if model_s > 0 else 0.0,
                    "gflop": total.flops / 1e9,
                    "ms": total.seconds * 1e3,
                    "gflops_per_s": achieved / 1e9,
                    "peak_fraction": None if bytes_bound else achieved / peak.flops,
                    "peak_gflops_per_s": peak.flops / 1e9,
                    "peak_threads": peak.threads,
                }
            )
    return rows


def class_totals(extraction: Extraction, costs: TableCostModel, device: str, kinds: dict) -> dict[str, ClassTotals]:
    """A timed device's kernels summed by class, each at its time alone: what its schedule achieves,
    without the executor's overhead per kernel that pricing in context spreads over them all."""
    timings = costs.provenance.timed[device]
    totals: dict[str, ClassTotals] = defaultdict(ClassTotals)
    for name, kernel in extraction.graph.kernels.items():
        total = totals[kernel_class(timings.schedules[name], extraction, extraction.kernel_func[name], kinds)]
        total.kernels += 1
        total.flops += kernel.flops
        total.seconds += timings.seconds[name]
    return totals


def kernel_class(schedule: str, extraction: Extraction, func: str, kinds: dict[str, str]) -> str:
    """The rule that scheduled a kernel; for ``Conv2d``, with the convolution's kind where it is known."""
    if schedule != "Conv2d":
        return schedule
    if func not in kinds:
        kinds[func] = convolution_kind(extraction.mod[func])
    return f"Conv2d {kinds[func]}" if kinds[func] else schedule


def convolution_kind(func) -> str:
    """A convolution's kind, read from its contraction's indices: "depthwise" (each output channel reads
    one input channel), "grouped" (a group of them), "1x1" (whatever its stride: a matmul over the pixels
    it reads), "strided", "direct", "transposed"; "" where the kernel has no contraction to read. An
    output one pixel wide leaves no pixel axis to see a stride by: it counts as direct."""
    contraction = find_contraction(func)
    if contraction is None or len(contraction.reads) < 2:
        return ""
    if "transpose" in contraction.main.name:
        return "transposed"
    axes = contraction.spatial + contraction.reduction
    image, weight = sorted(contraction.reads, key=lambda read: -sum(read.depends_on(a) for a in axes))[:2]
    pixels = [a for a in contraction.spatial if not weight.depends_on(a)]  # batch and output positions
    out_channels = [a for a in contraction.spatial if weight.depends_on(a)]
    summed = [r for r in contraction.reduction if r.extent > 1]

    def read_by(indices) -> list:
        return [r for r in summed if any(uses(index, r.var) for index in indices)]

    def moves_with(index, moving) -> bool:
        return any(uses(index, axis.var) for axis in moving)

    group_channels = [index for index in image.indices if moves_with(index, out_channels)]
    if group_channels:
        return "grouped" if read_by(group_channels) else "depthwise"
    windows = [index for index in image.indices if moves_with(index, pixels) and moves_with(index, summed)]
    if len(read_by(image.indices)) <= 1 and not windows:
        return "1x1"
    return "strided" if any(stride(index, axis) > 1 for index in windows for axis in pixels) else "direct"


def stride(index, axis) -> int:
    """How far ``index`` moves per step of ``axis``: 2 for ``y * 2 + ry``; 0 where not linear in it."""
    linear = linear_in(index, axis)
    return linear[0] if linear is not None else 0


def class_table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The per-class table, with each device's peak stated once."""
    if not rows:
        return []
    peaks = {row["device"]: (row["peak_gflops_per_s"], row["peak_threads"]) for row in rows}
    stated = "; ".join(
        f"{device} {gflops:.1f} GFLOP/s on {threads} thread{'s' * (threads != 1)}"
        for device, (gflops, threads) in peaks.items()
    )
    lines = [
        f"\nkernel classes (kernels timed alone) against this CPU's measured fp32 peak ({stated}; '-': bytes bound)",
        f"{'device':<12}{'class':<20}{'kernels':>8}{'share':>8}{'GFLOP':>10}{'ms':>10}{'GFLOP/s':>10}{'of peak':>9}",
    ]
    for row in rows:
        fraction = "-" if row["peak_fraction"] is None else f"{row['peak_fraction']:.2f}"
        lines.append(
            f"{row['device']:<12}{row['class'][:19]:<20}{row['kernels']:>8}{row['share']:>8.1%}{row['gflop']:>10.3f}"
            f"{row['ms']:>10.3f}{row['gflops_per_s']:>10.1f}{fraction:>9}"
        )
    return lines


def roofline_fit_lines(graph, costs) -> list[str]:
    """How far to trust the roofline: its figures fitted to each measured device, and the error."""
    lines = []
    for device in costs.provenance.timed:
        try:
            fit = fit_costs(graph, costs, device)
        except ValueError as error:
            lines.append(f"roofline fit for {device}: not possible ({error})")
            continue
        lines.append(
            f"roofline fit for {device}: {fit.peak_flops / 1e9:.2f} GFLOP/s, {fit.bandwidth_Bps / 1e9:.2f} GB/s, "
            f"{fit.overhead_s * 1e6:.1f} us per kernel; error per kernel: median {100 * fit.median_rel_error:.0f}%, "
            f"90th percentile {100 * fit.p90_rel_error:.0f}%"
        )
    return lines


def link_lines(costs) -> list[str]:
    return [
        f"link {src} -> {dst}: {format_seconds(link.latency_s)} + bytes / {link.bandwidth_Bps / 1e9:.2f} GB/s "
        "(measured)"
        for (src, dst), link in costs.links.items()
    ]


def executor_lines(costs) -> list[str]:
    """What the concurrent executor adds, where more than one device is present to run it."""
    if len(costs.platform.devices) - len(costs.provenance.absent) <= 1:
        return []
    overheads = costs.executor_overheads
    return [
        f"the concurrent executor adds {format_seconds(overheads.run_s)} per inference, "
        f"{format_seconds(overheads.segment_s)} per segment call and {format_seconds(overheads.handoff_s)} "
        "per tensor handed to another device's worker (in the links' latency above)",
        f"a CPU kernel takes {overheads.corun_factor:.2f}x as long while another CPU device's worker computes "
        "(each worker pinned to cores of its own)",
    ]


def in_context_lines(costs) -> list[str]:
    """The model's time as a whole against its kernels' alone, per device, and how much a whole timing strays."""
    lines = []
    for device, in_context in costs.provenance.in_context.items():
        seconds, scale = in_context.per_kernel_s, in_context.scale
        share = math.floor(scale * 100) / 100  # 0.996 is not "1.00 of their time"
        lines.append(
            f"inside the model, {device} adds {format_seconds(seconds)} per kernel to its time alone "
            "(from the whole model's run)"
            if scale == 1.0
            else f"inside the model, {device}'s kernels take {share:.2f} of their time alone (the whole model's "
            "run took less than its kernels timed alone: they were timed while the machine was busier)"
        )
    if costs.provenance.in_context:
        lines.append(
            f"a timing of the whole model strays by {100 * costs.prediction_error:.1f}% (half its interquartile "
            "range): --solver auto splits the model only for a predicted gain beyond that"
        )
    return lines
