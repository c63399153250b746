"""The interface every solver shares: a Problem in, a Plan out.

Options are keyword arguments with defaults (scikit-learn style); every random choice takes a
seed. A solver's claimed ``value_s`` must equal the simulator's value of its plan in the plan's
cost mode (tests check that).
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..cost.base import CostModel
from ..errors import DivimlInputError
from ..graph import OpGraph
from ..plan import OBJECTIVES, Plan
from ..platform import Platform
from ..simulator import format_bytes


def mode_for(objective: str, platform: Platform) -> str:
    """The simulator's cost mode for an objective on a platform."""
    if objective == "latency":
        return "latency"
    if objective == "pipeline":
        return "stage_serial"
    if objective == "throughput":
        return "host_staged" if platform.transfer_model == "host_staged" else "period_overlap"
    raise DivimlInputError(f"unknown objective '{objective}'", field="objective",
                           hint=f"use one of {', '.join(OBJECTIVES)}")


@dataclass
class Problem:
    """What to place (graph), where (platform), at what prices (costs), for which objective."""

    graph: OpGraph
    platform: Platform
    costs: CostModel
    objective: str = "latency"
    stages: int | None = None          # pipeline: the most stages to use

    @property
    def mode(self) -> str:
        return mode_for(self.objective, self.platform)

    def feasible_devices(self, kernel: str) -> list[str]:
        """Devices that may run ``kernel`` and have a finite cost for it."""
        allowed = self.graph.kernels[kernel].allowed_devices
        return [d for d in self.platform.device_names
                if (allowed is None or d in allowed) and not math.isinf(self.costs.compute_s(kernel, d))]


    def validate(self) -> None:
        """Fail early, naming the kernel or group, when no plan at all can satisfy the constraints."""
        groups: dict[str, list[str]] = {}
        for kernel in self.graph.kernels.values():
            if not self.feasible_devices(kernel.name):
                raise DivimlInputError(f"kernel '{kernel.name}' can run on no device of '{self.platform.name}'",
                                       field="allowed_devices", hint="allow a device, or give it a finite cost")
            if kernel.colocate is not None:
                groups.setdefault(kernel.colocate, []).append(kernel.name)
        for group, members in groups.items():
            common = set(self.feasible_devices(members[0]))
            for member in members[1:]:
                common &= set(self.feasible_devices(member))
            if not common:
                raise DivimlInputError(f"co-location group '{group}' ({', '.join(members[:4])}"
                                       f"{', ...' if len(members) > 4 else ''}) has no device that can run all of "
                                       "its kernels", field="colocate",
                                       hint="allow a common device for those kernels, or split the group")
            need = self.graph.weight_bytes(members)
            fits = [d for d in common if (self.platform.device(d).memory_bytes or float("inf")) >= need]
            if not fits:
                raise DivimlInputError(f"co-location group '{group}' needs {format_bytes(need)} of weights, more "
                                       "than any device that can run it has", field="colocate",
                                       hint="split the group or use a device with more memory")


class Solver(ABC):
    name: str = ""

    def __init__(self, *, time_limit_s: float = 60.0, seed: int = 0):
        self.time_limit_s = time_limit_s
        self.seed = seed

    @abstractmethod
    def solve(self, problem: Problem) -> Plan:
        """Return a Plan in ``problem.mode`` with ``value_s`` set to the solver's claim."""
