"""``diviml profile``'s job: every kernel of a model timed on the platform's present devices (roofline
estimates for the rest), with how far to trust the figures: the roofline fitted to each measured device,
the links, the executor's own overheads and the model's time as a whole against its kernels'."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..cost.fit import fit_costs
from ..cost.table import TableCostModel
from ..units import format_seconds
from .job import AS_GIVEN, LoadOptions
from .run import fallback_warnings
from .workload import load_workload

DEFAULT_PLATFORM = "cpu2"  # this machine's CPU as two single-thread devices


@dataclass
class ProfileReport:
    """What a profile found: a row per kernel and device (``--json``), the report as ``diviml profile``
    prints it (``text``), warnings of kernels left to the Fallback schedule, and the costs (``export``)."""

    rows: list[dict[str, Any]]
    text: str
    warnings: list[str]
    costs: TableCostModel  # measured here: its provenance says how

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
    lines = [*table_lines(rows), *roofline_fit_lines(workload.graph, costs), *link_lines(costs)]
    lines += [*executor_lines(costs), *in_context_lines(costs)]
    lines.append(f"\n{provenance.measured_now} kernels timed now, the rest from the cache ({provenance.cache_path})")
    if provenance.absent:
        lines.append(f"estimated by the roofline (not present here): {', '.join(provenance.absent)}")
    return ProfileReport(rows, "\n".join(lines), fallback_warnings(costs, workload.loaded.extraction), costs)


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
