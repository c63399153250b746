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
        """Fail early, naming the kernel or group, when no plan at all can satisfy the constraints:
        no device may run a kernel, a co-location group has no common device, the weights of one
        kernel or group exceed every device that may hold them, or the model's weights exceed all
        devices together."""
        def roomiest(devices: list[str]) -> tuple[str, float]:
            capacity = {d: self.platform.device(d).memory_bytes for d in devices}
            device = max(devices, key=lambda d: math.inf if capacity[d] is None else capacity[d])
            return device, math.inf if capacity[device] is None else capacity[device]

        if not self.graph.kernels:
            raise DivimlInputError(f"graph '{self.graph.name}' has no kernels to place", field="kernels",
                                   hint="give a model with at least one operator")
        groups: dict[str, list[str]] = {}
        for kernel in self.graph.kernels.values():
            devices = self.feasible_devices(kernel.name)
            if not devices:
                raise DivimlInputError(f"kernel '{kernel.name}' can run on no device of '{self.platform.name}'",
                                       field="allowed_devices", hint="allow a device, or give it a finite cost")
            need = self.graph.weight_bytes([kernel.name])
            device, capacity = roomiest(devices)
            if need > capacity:
                raise DivimlInputError(f"kernel '{kernel.name}' needs {format_bytes(need)} of weights, but the "
                                       f"largest device it may run on, '{device}', has {format_bytes(capacity)}",
                                       field="memory_bytes", hint="allow the kernel on a device with more memory")
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
            device, capacity = roomiest([d for d in self.platform.device_names if d in common])
            if need > capacity:
                raise DivimlInputError(f"co-location group '{group}' needs {format_bytes(need)} of weights, but the "
                                       f"largest device that can run all of it, '{device}', has "
                                       f"{format_bytes(capacity)}", field="colocate",
                                       hint="split the group or use a device with more memory")
        total = self.graph.weight_bytes(self.graph.kernels)
        capacities = [d.memory_bytes for d in self.platform.devices]
        if None not in capacities and total > sum(capacities):
            each = ", ".join(f"'{d.name}' {format_bytes(d.memory_bytes)}" for d in self.platform.devices[:8])
            raise DivimlInputError(f"the model's weights need {format_bytes(total)}, more than all devices hold "
                                   f"together: {format_bytes(sum(capacities))} ({each}"
                                   f"{', ...' if len(capacities) > 8 else ''})", field="memory_bytes",
                                   hint="add devices or use devices with more memory")


class Solver(ABC):
    name: str = ""
    objectives: tuple[str, ...] = OBJECTIVES       # the objectives this solver can place for

    def check_objective(self, problem: Problem) -> None:
        """Refuse an objective this solver does not do, naming the solvers that do it."""
        if problem.objective in self.objectives:
            return
        from . import SOLVERS                      # the registry imports the solver modules

        others = [name for name, cls in SOLVERS.items() if problem.objective in cls.objectives]
        raise DivimlInputError(f"solver {self.name} does {' and '.join(self.objectives)}, not '{problem.objective}'",
                               field="objective", hint=f"for {problem.objective} use --solver "
                               + " or ".join(others) + (" (with --stages K)" if problem.objective == "pipeline" else ""))

    def __init__(self, *, time_limit_s: float = 60.0, seed: int = 0):
        self.time_limit_s = time_limit_s
        self.seed = seed

    @abstractmethod
    def solve(self, problem: Problem) -> Plan:
        """Return a Plan in ``problem.mode`` with ``value_s`` set to the solver's claim."""


class NoPlanError(DivimlInputError):
    """An exact method proved that no plan satisfies the constraints (not: ran out of time)."""


def no_plan_exists(method: str) -> NoPlanError:
    """The error for a problem an exact method proved infeasible with weights alone in memory."""
    return NoPlanError(f"no plan satisfies the constraints: the {method} proves that the weights within each "
                       "device's memory, allowed devices and co-location cannot all hold", field="memory_bytes",
                       hint="use devices with more memory, allow kernels on more devices, or co-locate less")
