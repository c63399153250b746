"""The placement problem every solver, bound and report shares: what to place, where, at what prices,
for which objective, and the checks that fail early when no plan can exist.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .cost.base import CostModel
from .errors import DivimlInputError
from .graph import OpGraph
from .plan import OBJECTIVES, Mode, Objective
from .platform import Platform
from .units import format_bytes


def mode_for(objective: Objective, platform: Platform) -> Mode:
    """The simulator's cost mode for an objective on a platform."""
    if objective == "latency":
        return "latency"
    if objective == "pipeline":
        return "stage_serial"
    if objective == "throughput":
        return "host_staged" if platform.transfer_model == "host_staged" else "period_overlap"
    raise DivimlInputError(
        f"unknown objective '{objective}'", field="objective", hint=f"use one of {', '.join(OBJECTIVES)}"
    )


@dataclass
class Problem:
    """What to place (graph), where (platform), at what prices (costs), for which objective."""

    graph: OpGraph
    platform: Platform
    costs: CostModel
    objective: Objective = "latency"
    stages: int | None = None  # pipeline: the most stages to use
    # Results several steps of one solve derive from this problem (the list schedules: the split's
    # starting plan and the report's baselines), so that 20,000 kernels are scheduled once, not twice.
    # Derived from the fields above: a caller that changes one of them (or the prices its cost model
    # gives) makes a new Problem (not an init field, so that dataclasses.replace starts an empty one).
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def mode(self) -> Mode:
        return mode_for(self.objective, self.platform)

    def feasible_devices(self, kernel: str) -> list[str]:
        """Devices that may run ``kernel`` and have a finite cost for it (asked 440,000 times in a
        10,000-kernel pipeline solve: kept in ``memo``)."""
        feasible = self.memo.setdefault("feasible_devices", {})
        if kernel not in feasible:
            allowed = self.graph.kernels[kernel].allowed_devices
            feasible[kernel] = [
                d
                for d in self.platform.device_names
                if (allowed is None or d in allowed) and not math.isinf(self.costs.compute_s(kernel, d))
            ]
        return list(feasible[kernel])

    def output_return_s(self, kernel: str, device: str, *, empty_pays_latency: bool = False) -> float:
        """Seconds for ``kernel``'s model output to reach the host from ``device`` (0 for other kernels).
        An empty output costs nothing, except the link's latency where ``empty_pays_latency`` (pipelines:
        ``stage_serial`` charges a stage every copy it makes)."""
        nbytes = self.graph.kernels[kernel].output_bytes
        if kernel not in self.graph.output_set or (nbytes <= 0 and not empty_pays_latency):
            return 0.0
        return self.costs.transfer_s(nbytes, device, self.platform.host)

    def validate(self) -> None:
        """Fail early, naming the kernel or group, when no plan at all can satisfy the constraints:
        no device may run a kernel, a co-location group has no common device, the weights of one
        kernel or group exceed every device that may hold them, or the model's weights exceed all
        devices together. Costs made for another graph are refused here too (``check_made_for``)."""
        self.costs.check_made_for(self.graph)

        def roomiest(devices: list[str]) -> tuple[str, float]:
            capacity = {d: self.platform.device(d).memory_bytes for d in devices}
            device = max(devices, key=lambda d: math.inf if capacity[d] is None else capacity[d])
            return device, math.inf if capacity[device] is None else capacity[device]

        if not self.graph.kernels:
            raise DivimlInputError(
                f"graph '{self.graph.name}' has no kernels to place",
                field="kernels",
                hint="give a model with at least one operator",
            )
        groups: dict[str, list[str]] = {}
        for kernel in self.graph.kernels.values():
            devices = self.feasible_devices(kernel.name)
            if not devices:
                raise DivimlInputError(
                    f"kernel '{kernel.name}' can run on no device of '{self.platform.name}'",
                    field="allowed_devices",
                    hint="allow a device, or give it a finite cost",
                )
            need = self.graph.weight_bytes([kernel.name])
            device, capacity = roomiest(devices)
            if need > capacity:
                raise DivimlInputError(
                    f"kernel '{kernel.name}' needs {format_bytes(need)} of weights, but the "
                    f"largest device it may run on, '{device}', has {format_bytes(capacity)}",
                    field="memory_bytes",
                    hint="allow the kernel on a device with more memory",
                )
            if kernel.colocate is not None:
                groups.setdefault(kernel.colocate, []).append(kernel.name)
        for group, members in groups.items():
            common = set(self.feasible_devices(members[0]))
            for member in members[1:]:
                common &= set(self.feasible_devices(member))
            if not common:
                raise DivimlInputError(
                    f"co-location group '{group}' ({', '.join(members[:4])}"
                    f"{', ...' if len(members) > 4 else ''}) has no device that can run all of "
                    "its kernels",
                    field="colocate",
                    hint="allow a common device for those kernels, or split the group",
                )
            need = self.graph.weight_bytes(members)
            device, capacity = roomiest([d for d in self.platform.device_names if d in common])
            if need > capacity:
                raise DivimlInputError(
                    f"co-location group '{group}' needs {format_bytes(need)} of weights, but the "
                    f"largest device that can run all of it, '{device}', has "
                    f"{format_bytes(capacity)}",
                    field="colocate",
                    hint="split the group or use a device with more memory",
                )
        total = self.graph.weight_bytes(self.graph.kernels)
        capacities = [d.memory_bytes for d in self.platform.devices]
        if None not in capacities and total > sum(capacities):
            each = ", ".join(f"'{d.name}' {format_bytes(d.memory_bytes)}" for d in self.platform.devices[:8])
            raise DivimlInputError(
                f"the model's weights need {format_bytes(total)}, more than all devices hold "
                f"together: {format_bytes(sum(capacities))} ({each}"
                f"{', ...' if len(capacities) > 8 else ''})",
                field="memory_bytes",
                hint="add devices or use devices with more memory",
            )


class NoPlanError(DivimlInputError):
    """An exact method proved that no plan satisfies the constraints (not: ran out of time)."""


def no_plan_exists(method: str) -> NoPlanError:
    """The error for a problem an exact method proved infeasible with weights alone in memory."""
    return NoPlanError(
        f"no plan satisfies the constraints: the {method} proves that the weights within each "
        "device's memory, allowed devices and co-location cannot all hold",
        field="memory_bytes",
        hint="use devices with more memory, allow kernels on more devices, or co-locate less",
    )
