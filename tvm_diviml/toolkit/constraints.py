"""The placement constraints every heuristic shares, kept while kernels are placed one by one.

A heuristic asks ``DeviceBudget.allowed(kernel)`` for the devices where placing the kernel now keeps
the problem feasible, picks one, and calls ``place``. The budget tracks allowed devices and infinite
costs, co-location (the first member of a group decides, and the whole group's weights are reserved
at once) and memory (weights once per device plus a per-device activation reserve). The reserve
stands in for the peak of live activations, which depends on a run order not yet fixed;
``place_within_memory`` simulates the plan and places again with a reserve raised where a device's
activations outgrew it.

Details: docs/solvers.md#constraints.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from ..errors import DivimlInputError
from ..graph import OpGraph
from ..plan import Plan
from ..problem import Problem
from ..simulator import Simulation, simulate
from ..units import format_bytes
from .deadline import Deadline, OutOfTime

log = logging.getLogger(__name__)


def model_inputs_of(graph: OpGraph) -> dict[str, list[float]]:
    """Kernel -> the bytes of each model input it reads (each input once per kernel)."""
    out: dict[str, list[float]] = {}
    for graph_input in graph.inputs:
        for consumer in dict.fromkeys(graph_input.consumers):
            out.setdefault(consumer, []).append(graph_input.bytes)
    return out


def working_set_bytes(graph: OpGraph, kernel: str, inputs_of: dict[str, list[float]]) -> float:
    """Activation bytes live while ``kernel`` runs: every tensor it reads and the one it writes.

    A tensor's size is its producer's ``output_bytes``, as in the simulator's memory sweep;
    ``inputs_of`` is ``model_inputs_of(graph)``.
    """
    read = sum(graph.kernels[e.src].output_bytes for e in graph.pred[kernel])
    return graph.kernels[kernel].output_bytes + read + sum(inputs_of.get(kernel, ()))


def default_reserve(problem: Problem) -> dict[str, float]:
    """Per device: the largest working set (inputs + output) of any kernel that may run there.

    Whatever a plan puts on a device, the simulator charges at least the working set of each
    kernel it runs, so a device whose free memory is below the largest one it may receive is
    likely to overflow. It is an estimate, not a bound: tensors that stay live across other
    kernels (skip connections) can push the peak higher, which ``place_within_memory`` repairs.
    Made once per problem (``Problem.memo``: a second on 100,000 kernels); each caller gets a copy.
    """
    if "default_reserve" not in problem.memo:
        graph = problem.graph
        inputs_of = model_inputs_of(graph)
        reserve = {d: 0.0 for d in problem.platform.device_names}
        for kernel in graph.kernels:
            need = working_set_bytes(graph, kernel, inputs_of)
            for device in problem.feasible_devices(kernel):
                reserve[device] = max(reserve[device], need)
        problem.memo["default_reserve"] = reserve
    return dict(problem.memo["default_reserve"])


class DeviceBudget:
    """What is already placed, and where the next kernel may go without breaking a constraint.

    ``reserve`` (device -> bytes kept free for activations) overrides ``default_reserve`` for the
    devices it names. A device never keeps less free than the largest working set of the kernels
    placed on it (or being placed): the simulator charges at least that. Past ``deadline``, placing
    a kernel raises ``OutOfTime`` (a list schedule of 100,000 kernels takes 10 s and more).
    """

    def __init__(self, problem: Problem, reserve: dict[str, float] | None = None, deadline: Deadline | None = None):
        self.problem, self.deadline = problem, deadline
        names = problem.platform.device_names
        for device in reserve or {}:
            if device not in names:
                raise DivimlInputError(
                    f"activation reserve names unknown device '{device}'",
                    field="reserve",
                    hint=f"platform '{problem.platform.name}' has: {', '.join(names)}",
                )
        self.reserve = {**default_reserve(problem), **(reserve or {})}
        self.capacity = {
            d.name: math.inf if d.memory_bytes is None else float(d.memory_bytes) for d in problem.platform.devices
        }
        self.device_of: dict[str, str] = {}
        self._weights_on: dict[str, set[str]] = {d: set() for d in names}
        self._weight_bytes_on = {d: 0.0 for d in names}
        self._working_on = {d: 0.0 for d in names}  # largest working set placed there
        self._inputs_of = model_inputs_of(problem.graph)
        self._groups: dict[str, list[str]] = {}
        for kernel in problem.graph.kernels.values():
            if kernel.colocate is not None:
                self._groups.setdefault(kernel.colocate, []).append(kernel.name)
        self._group_device: dict[str, str] = {}
        self._feasible: dict[str, list[str]] = {}

    def weight_bytes_on(self, device: str) -> float:
        """Bytes of the distinct weights placed (or reserved for a co-location group) on ``device``."""
        return self._weight_bytes_on[device]

    def moving_with(self, kernel: str) -> list[str]:
        """The kernels whose device placing ``kernel`` now decides: its whole co-location group at
        the group's first placement, otherwise the kernel alone."""
        group = self.problem.graph.kernels[kernel].colocate
        if group is None or group in self._group_device:
            return [kernel]
        return self._groups[group]

    def allowed(self, kernel: str) -> list[str]:
        """Devices (in platform order) where ``kernel`` may be placed now; raises if there is none."""
        group = self.problem.graph.kernels[kernel].colocate
        if group in self._group_device:
            return [self._group_device[group]]
        members = self.moving_with(kernel)
        candidates = self._common_feasible(members)
        what = f"co-location group '{group}' (placing '{kernel}')" if len(members) > 1 else f"kernel '{kernel}'"
        if not candidates:
            raise DivimlInputError(
                f"{what} can run on no device of '{self.problem.platform.name}'",
                field="allowed_devices",
                hint="allow a device, or give it a finite cost",
            )
        fits, shortfalls = [], []
        for device in candidates:
            extra = self._new_weight_bytes(members, device)
            kept = self._kept_free(device, members)
            need = self._weight_bytes_on[device] + extra + kept
            if need <= self.capacity[device]:
                fits.append(device)
            else:
                shortfalls.append(
                    f"'{device}' needs {format_bytes(need)} ({format_bytes(self._weight_bytes_on[device])} of weights "
                    f"already placed + {format_bytes(extra)} new weights + {format_bytes(kept)} "
                    f"reserved for activations), capacity {format_bytes(self.capacity[device])}"
                )
        if not fits:
            raise DivimlInputError(
                f"{what} fits on no device it may run on: {'; '.join(shortfalls)}",
                field="memory_bytes",
                hint="use devices with more memory, allow the kernel on more devices, or lower the activation reserve",
            )
        return fits

    def place(self, kernel: str, device: str) -> None:
        """Put ``kernel`` on ``device`` (one of ``allowed(kernel)``) and charge its weights there."""
        if self.deadline is not None:
            self.deadline.check("the list schedule")
        if kernel in self.device_of:
            raise ValueError(f"kernel '{kernel}' is already placed on '{self.device_of[kernel]}'")
        if device not in self.allowed(kernel):
            raise ValueError(f"kernel '{kernel}' may not be placed on '{device}' now")
        for member in self.moving_with(kernel):
            for weight in self.problem.graph.kernels[member].weights:
                if weight not in self._weights_on[device]:
                    self._weights_on[device].add(weight)
                    self._weight_bytes_on[device] += self.problem.graph.weights[weight]
        self._working_on[device] = self._kept_free(device, self.moving_with(kernel))
        group = self.problem.graph.kernels[kernel].colocate
        if group is not None:
            self._group_device[group] = device
        self.device_of[kernel] = device

    def _kept_free(self, device: str, kernels: list[str]) -> float:
        """Bytes kept free for activations on ``device`` once ``kernels`` join it."""
        working = max(working_set_bytes(self.problem.graph, k, self._inputs_of) for k in kernels)
        return max(self.reserve[device], self._working_on[device], working)

    def _common_feasible(self, kernels: list[str]) -> list[str]:
        common = set(self._feasible_devices(kernels[0]))
        for kernel in kernels[1:]:
            common &= set(self._feasible_devices(kernel))
        return [d for d in self._feasible_devices(kernels[0]) if d in common]

    def _feasible_devices(self, kernel: str) -> list[str]:
        if kernel not in self._feasible:
            self._feasible[kernel] = self.problem.feasible_devices(kernel)
        return self._feasible[kernel]

    def _new_weight_bytes(self, kernels: list[str], device: str) -> float:
        ids = {w for k in kernels for w in self.problem.graph.kernels[k].weights} - self._weights_on[device]
        return sum(self.problem.graph.weights[w] for w in ids)


def place_within_memory(
    problem: Problem,
    place: Callable[[DeviceBudget], Plan],
    reserve: dict[str, float] | None = None,
    attempts: int = 3,
    deadline: Deadline | None = None,
) -> tuple[Plan, Simulation]:
    """Run the heuristic ``place`` under a DeviceBudget and simulate its plan; while a device
    overflows because its activations outgrew the reserve, raise that device's reserve to the
    activation peak the simulator measured and place again.

    Returns the first plan that fits, or else the last plan made (the simulator lists its
    problems), so a heuristic always answers once a first placement succeeded (past ``deadline`` it
    places no more; before a first placement ends, it raises ``OutOfTime``).
    """
    if deadline is not None:  # the default reserve prices every kernel's working set: seconds at scale
        deadline.check("the list schedule")
    budget_reserve = {**default_reserve(problem), **(reserve or {})}
    plan: Plan | None = None
    sim: Simulation | None = None
    lowered = False
    attempt = 0
    while attempt < attempts:
        try:
            candidate = place(DeviceBudget(problem, budget_reserve, deadline))
        except OutOfTime:
            if plan is None:
                raise
            log.info("the time limit ended a placement again: keeping the plan that overflows")
            break
        except DivimlInputError as error:
            if plan is None and not lowered and error.field == "memory_bytes":
                # the reserve stood in for activations a device may never hold: keep free only the
                # working sets of what is placed there, and let the simulation below raise it
                log.info(
                    "no placement with the default activation reserve (%s); placing with the working sets "
                    "of the kernels placed",
                    error,
                )
                budget_reserve, lowered = dict.fromkeys(budget_reserve, 0.0), True
                continue
            if plan is None:
                raise
            log.warning("a larger activation reserve leaves no placement (%s); keeping the plan that overflows", error)
            break
        attempt += 1
        plan, sim = candidate, simulate(problem, candidate)
        overflow = activation_overflow(problem, plan, sim)
        if not overflow:
            break
        for device, peak in overflow.items():
            log.info(
                "attempt %d: activations on '%s' peak at %s, above the %s reserved; placing again",
                attempt,
                device,
                format_bytes(peak),
                format_bytes(budget_reserve[device]),
            )
            budget_reserve[device] = peak
    assert plan is not None and sim is not None
    return plan, sim


def activation_overflow(problem: Problem, plan: Plan, sim: Simulation) -> dict[str, float]:
    """Device -> its activation peak, for each device over capacity. The budget kept weights plus
    reserve within capacity, so an overflow means the activations outgrew the reserve."""
    over = {}
    for device, used in sim.memory_bytes.items():
        capacity = problem.platform.device(device).memory_bytes
        if capacity is not None and used > capacity:
            weights = problem.graph.weight_bytes(k for k, d in plan.assignment.items() if d == device)
            over[device] = used - weights
    return over
