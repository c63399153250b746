"""Plan: what a solver decided, in the cost mode it is to be judged in. JSON in and out.

The simulator (``tvm_diviml.simulator``) scores every Plan; a Plan carries the solver's own claim
(``value_s``) only so that the two can be compared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from .errors import DivimlInputError
from .jsonio import JsonFile
from .tolerances import MEETS, meets

if TYPE_CHECKING:
    from .graph import OpGraph
    from .platform import Platform

FORMAT = "diviml.plan/1"
Objective = Literal["latency", "throughput", "pipeline"]
Mode = Literal["latency", "period_overlap", "stage_serial", "host_staged"]  # the simulator's cost modes
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)
MODES: tuple[Mode, ...] = get_args(Mode)
# The typed fields that a plan file keeps under "attrs", beside the free-form details (the file's format).
ATTRS_FIELDS = (
    "optimal_among",
    "method",
    "infeasible",
    "series",
    "replicas_option",
    "stopped_by_time",
    "simulated_value_s",
)


class PlanError(DivimlInputError):
    """A plan that does not fit its graph or platform (unknown kernel or device, bad order)."""


@dataclass
class ReplicaGroup:
    """Kernels that run on several devices, each taking ``shares[device]`` of the input stream.

    The kernels of one group move together: an input whose first kernel of the group runs on a
    device runs every kernel of the group there (a replicated stage, or the whole model).
    """

    kernels: list[str]
    shares: dict[str, float]


@dataclass
class Plan(JsonFile):
    assignment: dict[str, str]  # kernel -> device (primary device for replicas)
    objective: Objective = "latency"
    mode: Mode = "latency"
    order: dict[str, list[str]] | None = None  # device -> kernels in run order (latency)
    stages: list[list[str]] | None = None  # pipeline stages, first to last
    stage_devices: list[str] | None = None  # device of each stage
    replicas: list[ReplicaGroup] = field(default_factory=list)
    batch_split: int = 1  # data-parallel sub-batch copies of the graph
    solver: str = ""
    value_s: float | None = None  # the solver's claim (latency or period)
    lower_bound_s: float | None = None
    optimal: bool = False
    solve_s: float = 0.0
    optimal_among: str | None = None  # the proof holds among these plans only, not every placement
    method: str | None = None  # the steps that reached the plan, ", "-separated (downsets)
    infeasible: str | None = None  # why the plan breaks a constraint its method relaxes (downsets' DP)
    series: dict[str, Any] | None = None  # the series decomposition that placed it: cuts, segment solves
    replicas_option: str | None = None  # the replication chosen: "whole_model" or "stages"
    stopped_by_time: bool | None = None  # the pipeline MIP stopped at its time limit
    simulated_value_s: float | None = None  # the simulator's value, kept with a plan that leaves the process
    attrs: dict[str, Any] = field(default_factory=dict)  # details for reports: read by people, not by code

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise DivimlInputError(
                f"unknown objective '{self.objective}'", field="objective", hint=f"use one of {', '.join(OBJECTIVES)}"
            )
        if self.mode not in MODES:
            raise DivimlInputError(
                f"unknown cost mode '{self.mode}'", field="mode", hint=f"use one of {', '.join(MODES)}"
            )
        if self.batch_split < 1:
            raise DivimlInputError("batch_split must be at least 1", field="batch_split")
        for group in self.replicas:
            total = sum(group.shares.values())
            if not group.kernels or any(s < 0 for s in group.shares.values()) or abs(total - 1) > MEETS:
                raise DivimlInputError(
                    "a replica group needs kernels and non-negative shares that sum to 1", field="replicas"
                )

    def copy(self, solver: str = "") -> Plan:
        """The placement alone (assignment, order, stages, replicas; the claim kept), sharing nothing
        mutable: how a solver adopts another's plan as its own answer."""
        return Plan(
            dict(self.assignment),
            objective=self.objective,
            mode=self.mode,
            order={d: list(v) for d, v in self.order.items()} if self.order else None,
            stages=[list(s) for s in self.stages] if self.stages else None,
            stage_devices=list(self.stage_devices) if self.stage_devices else None,
            replicas=[ReplicaGroup(list(g.kernels), dict(g.shares)) for g in self.replicas],
            batch_split=self.batch_split,
            solver=solver,
            value_s=self.value_s,
        )

    def check(self, graph: OpGraph, platform: Platform | None = None) -> None:
        """Raise ``PlanError`` unless the plan places every kernel of ``graph`` and no other, each on a
        device of ``platform`` (where given), and shares replicas only among its devices: what every
        reader of a plan (the simulator, segments, a build) relies on."""
        missing = [k for k in graph.kernels if k not in self.assignment]
        unknown = [k for k in self.assignment if k not in graph.kernels]
        if missing or unknown:
            what = (
                f"leaves kernel '{missing[0]}' unassigned"
                if missing
                else f"names kernel '{unknown[0]}', which graph '{graph.name}' does not have"
            )
            raise PlanError(
                f"the plan {what}: it does not match the graph's {len(graph)} kernels "
                f"({len(missing)} missing, {len(unknown)} unknown)",
                field="assignment",
                hint="make the plan from this very model (same options and granularity)",
            )
        grouped: set[str] = set()
        for group in self.replicas:
            for kernel in group.kernels:
                if kernel not in graph.kernels:
                    raise PlanError(f"replica group names unknown kernel '{kernel}'", field="replicas")
                if kernel in grouped:
                    raise PlanError(f"kernel '{kernel}' is in two replica groups", field="replicas")
                grouped.add(kernel)
        if platform is None:
            return
        placed = [(f"kernel '{k}' is assigned to", d) for k, d in self.assignment.items()]
        placed += [("a replica group shares the stream with", d) for g in self.replicas for d in g.shares]
        for what, device in placed:
            if device not in platform.by_name:
                raise PlanError(
                    f"{what} unknown device '{device}', which platform '{platform.name}' lacks",
                    field="assignment",
                    hint=f"devices: {', '.join(platform.device_names)}",
                )

    def devices_used(self) -> list[str]:
        return sorted(set(self.assignment.values()))

    def routes(self) -> list[tuple[dict[str, str], float]]:
        """The plain assignments an input of the stream runs with, and the share of inputs each takes:
        each replica group's device is drawn with its share, independently of the other groups (as
        the simulator prices it); the same assignment reached twice is one route. A plan without
        replicas has one route, its assignment."""
        routes: dict[tuple, tuple[dict[str, str], float]] = {(): (dict(self.assignment), 1.0)}
        for group in self.replicas:
            grown: dict[tuple, tuple[dict[str, str], float]] = {}
            for assignment, share in routes.values():
                for device, part in group.shares.items():
                    if part <= 0:
                        continue
                    routed = {**assignment, **dict.fromkeys(group.kernels, device)}
                    name = tuple(sorted(routed.items()))
                    grown[name] = (routed, grown.get(name, (routed, 0.0))[1] + share * part)
            routes = grown
        return list(routes.values())

    def to_json(self) -> dict:
        out = {"format": FORMAT, **asdict(self)}
        out["replicas"] = [asdict(g) for g in self.replicas]
        typed = {name: out.pop(name) for name in ATTRS_FIELDS}
        out["attrs"] = {**out["attrs"], **{name: value for name, value in typed.items() if value is not None}}
        return out

    @classmethod
    def from_json(cls, data: Any) -> Plan:
        if not isinstance(data, dict) or not isinstance(data.get("assignment"), dict):
            raise DivimlInputError(
                "not a plan: expected an object with 'assignment': {kernel: device}", field="assignment"
            )
        known = set(cls.__dataclass_fields__) - set(ATTRS_FIELDS)
        fields = {k: v for k, v in data.items() if k in known}
        fields["replicas"] = [ReplicaGroup(list(g["kernels"]), dict(g["shares"])) for g in data.get("replicas", [])]
        attrs = dict(fields.get("attrs") or {})
        fields.update({name: attrs.pop(name) for name in ATTRS_FIELDS if name in attrs}, attrs=attrs)
        return cls(**fields)


def better_of(plan: Plan, other: Plan) -> Plan:
    """The faster of two plans for one problem, with the better of their bounds (each holds for both),
    proven optimal where either proof holds for it."""
    best = other if other.value_s < plan.value_s else plan
    bounds = [b for b in (plan.lower_bound_s, other.lower_bound_s) if b is not None]
    best.lower_bound_s = min(max(bounds), best.value_s) if bounds else None
    best.optimal = best.optimal or (bool(bounds) and meets(best.value_s, max(bounds)))
    return best
