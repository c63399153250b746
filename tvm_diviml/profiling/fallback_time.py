"""Kernels that no class rule scheduled and that take a large share of a model's measured time.

The fallback schedule is never wrong but can be 80x slower than a class rule (a strided convolution
left in NCHW took 24 ms of a model's 39 ms, where NHWC under the ``Conv2d`` rule took 0.2 ms), and a
profile shows which rule took a kernel only in its last column: ``diviml profile`` and ``diviml run``
warn with what ``fallback_hotspots`` finds. ``work_shares`` says which rule takes each kernel and
what share of the model's work it holds, counted rather than timed, for checks that must hold on a
machine busy with other jobs (the model-coverage suite, the tests).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

import tvm

from ..cost.base import CostModel
from ..passes.extract import Extraction
from ..presets import get_platform
from ..schedules.analysis import main_operator
from ..schedules.apply import FALLBACKS, schedule_module, schedule_names
from ..schedules.target import device_target

WARN_SHARE = 0.10  # of the model's time on a device
FALLBACK_SHARE = 0.05  # the most of a model's work that one kernel on a fallback schedule may hold


class WorkShare(NamedTuple):
    """What scheduled a kernel, and its share of the model's work in ``measure``: its FLOPs, or, for a
    kernel that computes nothing (a transpose, a gather), the bytes it moves, of all the kernels' bytes."""

    rule: str
    share: float
    measure: str  # "FLOPs" or "bytes"


def work_shares(extraction: Extraction, target: tvm.target.Target | None = None) -> dict[str, WorkShare]:
    """Each kernel of ``extraction``: the rule that schedules it for ``target`` (by default cpu2's first
    device, where the coverage suite builds) and its share of the model's work. Counted, not timed: a
    2-core machine shared with other jobs cannot time a 5% share reliably. Bytes weigh a kernel without
    FLOPs, so that a fallback transpose of a big tensor is not invisible. A rule that raises propagates."""
    target = target or device_target(get_platform("cpu2").devices[0])
    funcs = {name: extraction.mod[name] for name in set(extraction.kernel_func.values())}
    rules = schedule_names(schedule_module(tvm.IRModule(funcs), target))
    kernels = extraction.graph.kernels
    total_flops = sum(kernel.flops for kernel in kernels.values()) or 1.0
    total_bytes = sum(kernel.bytes_moved for kernel in kernels.values()) or 1.0
    shares = {}
    for name, kernel in kernels.items():
        rule = rules[extraction.kernel_func[name]]
        if kernel.flops > 0:
            shares[name] = WorkShare(rule, kernel.flops / total_flops, "FLOPs")
        else:
            shares[name] = WorkShare(rule, kernel.bytes_moved / total_bytes, "bytes")
    return shares


def on_fallback(shares: dict[str, WorkShare]) -> dict[str, WorkShare]:
    """The kernels of ``shares`` that no class rule took and that hold some work, the largest first."""
    left = {name: share for name, share in shares.items() if share.rule in FALLBACKS and share.share > 0}
    return dict(sorted(left.items(), key=lambda item: -item[1].share))


@dataclass(frozen=True)
class FallbackHotspot:
    """One PrimFunc (all the graph's kernels that call it) on a fallback schedule, with its share of
    the model's time on each measured device where that share passes the threshold."""

    kernel: str
    operator: str | None  # its main computation as TOPI names it ("conv2d"), None where unknown
    layout: str | None  # "NCHW" where the operator's name carries one
    schedule: str  # "Fallback" or "unscheduled"
    shares: dict[str, float]  # device -> share of the model's time there

    def message(self) -> str:
        scheduled = "Fallback rule" if self.schedule == "Fallback" else self.schedule
        what = ", ".join(part for part in (self.operator, self.layout, scheduled) if part)
        (first, first_share), *others = self.shares.items()
        also = f" ({', '.join(f'{share:.0%} on {device}' for device, share in others)})" if others else ""
        runs_as = (
            "plain loops, parallel outside and vectorized inside where legal"
            if self.schedule == "Fallback"
            else "single-threaded scalar loops"
        )
        return (
            f"{self.kernel} ({what}) takes {first_share:.0%} of the model's time on {first}{also}: no class rule "
            f"of tvm-diviml's schedules matched it, so it runs as {runs_as}; try --tune to search a schedule for "
            "it, and report the model so that a rule can cover it"
        )


def fallback_hotspots(costs: CostModel, extraction: Extraction, share: float = WARN_SHARE) -> list[FallbackHotspot]:
    """The PrimFuncs of ``extraction`` scheduled by the fallback rule (or by none) that take more than
    ``share`` of the model's time on some device whose kernels were measured, dearest first. A model's
    time on a device is the sum of its kernels' there, as the profile prints them. Costs that measured
    nothing (the roofline, a table read from a file) find none."""
    provenance = costs.provenance
    if provenance is None:
        return []
    shares: dict[str, dict[str, float]] = defaultdict(dict)
    schedules: dict[str, str] = {}
    for device in provenance.timed:
        seconds = {kernel: costs.compute_s(kernel, device) for kernel in extraction.graph.kernels}
        total = sum(seconds.values())
        by_func: dict[str, float] = defaultdict(float)
        for kernel, kernel_s in seconds.items():
            schedule = provenance.schedule_of(kernel, device)
            if schedule in FALLBACKS:
                by_func[extraction.kernel_func[kernel]] += kernel_s / total
                schedules[extraction.kernel_func[kernel]] = schedule
        for func, func_share in by_func.items():
            if func_share > share:
                shares[func][device] = func_share
    hotspots = []
    for func, on_devices in shares.items():
        operator, layout = main_operator(extraction.mod[func])
        ordered = dict(sorted(on_devices.items(), key=lambda item: -item[1]))
        hotspots.append(FallbackHotspot(func, operator, layout, schedules[func], ordered))
    return sorted(hotspots, key=lambda hotspot: -max(hotspot.shares.values()))
