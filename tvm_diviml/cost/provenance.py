"""How a measured cost table's figures were made (TVM-free): what the profiling floor hands the table.

``tvm_diviml.profiling.profile`` times each present device's kernels alone (``DeviceTimings``), its
links and the executor's own overheads, prices the kernels as they run inside the whole model
(``InContext``) and leaves absent devices to the roofline estimate. ``Provenance`` keeps all of it,
and ``TableCostModel.from_provenance`` prices from it: the table that plans, with the record that
reports read beside it (a table read from a file has none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..platform import Link
from .base import ExecutorOverheads


@dataclass(frozen=True)
class MeasureOptions:
    repeats: int = 5  # timed repeats; the median is the cost
    min_repeat_ms: int = 20  # each repeat runs the kernel enough times to last this long
    progress: bool = True


@dataclass(frozen=True)
class DeviceTimings:
    """A present device's kernels, each timed alone, by kernel name."""

    source: str  # "measured", or "tuned" where a MetaSchedule database scheduled them
    seconds: dict[str, float]  # the median of the timed repeats
    spread_s: dict[str, float]  # their standard deviation
    schedules: dict[str, str]  # what scheduled each: a rule of ``schedules/``, "tuned", "unscheduled"


@dataclass(frozen=True)
class InContext:
    """What running inside the whole model does to a device's kernels: each is priced at ``scale``
    (<= 1) of its time alone plus ``per_kernel_s`` (the VM's call, allocations, colder caches)."""

    per_kernel_s: float
    scale: float = 1.0

    @classmethod
    def fitted(cls, alone_s: float, whole_model_s: float, kernels: int) -> InContext:
        """The figures under which kernels that take ``alone_s`` together alone sum to the whole model's
        measured time: what the whole takes beyond them is spread evenly over the kernels; where they sum
        to more than the whole (they were timed while the machine was busier), each is scaled down by
        the same factor, which keeps their ratios."""
        per_kernel_s = max(0.0, (whole_model_s - alone_s) / max(1, kernels))
        return cls(per_kernel_s, min(1.0, whole_model_s / alone_s) if alone_s > 0 else 1.0)

    def price(self, alone_s: float) -> float:
        return alone_s * self.scale + self.per_kernel_s


@dataclass(frozen=True)
class Provenance:
    """Everything measured for a cost table, and how: ``timed`` devices (present here), ``absent`` ones
    (the roofline estimate), the links timed between present devices of one server (copy time plus the
    executor's hand-off), the executor's overheads as the machine's no-op segments gave them
    (``machine_overheads``) and as the model's own timings in context raised them (``executor_overheads``,
    what prices), the devices priced in context, and how far a whole-model timing strays
    (``prediction_error``)."""

    timed: dict[str, DeviceTimings]
    absent: list[str]
    links: dict[tuple[str, str], Link]
    machine_overheads: ExecutorOverheads
    executor_overheads: ExecutorOverheads
    in_context: dict[str, InContext] = field(default_factory=dict)
    prediction_error: float = 0.0
    measured_now: int = 0  # kernels timed in this run, not read from the profile cache
    cache_path: str | None = None  # the profile cache the figures went through
    options: MeasureOptions = MeasureOptions()
    # device -> the tuning result (``profiling.tuning.TuningResult``) whose MetaSchedule database scheduled
    # its kernels, and which the build applies
    tuning: Mapping[str, Any] = field(default_factory=dict)

    def how(self, device: str) -> str:
        """How ``device``'s kernel figures were made: "timed" or "tuned" (then maybe ", priced in context"),
        or "roofline estimate"."""
        timings = self.timed.get(device)
        if timings is None:
            return "roofline estimate"
        how = "tuned" if timings.source == "tuned" else "timed"
        return f"{how}, priced in context" if device in self.in_context else how

    def schedule_of(self, kernel: str, device: str) -> str:
        """What schedules ``kernel`` on ``device``: a rule, "tuned", "unscheduled", or "-" (estimated)."""
        timings = self.timed.get(device)
        return "-" if timings is None else timings.schedules[kernel]

    def spread_s(self, kernel: str, device: str) -> float | None:
        """The spread of ``kernel``'s timing on ``device``; None where it was estimated."""
        timings = self.timed.get(device)
        return None if timings is None else timings.spread_s[kernel]
