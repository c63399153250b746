"""Plan: what a solver decided, in the cost mode it is to be judged in. JSON in and out.

The simulator (``tvm_diviml.simulator``) scores every Plan; a Plan carries the solver's own claim
(``value_s``) only so that the two can be compared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from .errors import DivimlInputError
from .jsonio import JsonFile
from .tolerances import MEETS, meets

FORMAT = "diviml.plan/1"
Objective = Literal["latency", "throughput", "pipeline"]
Mode = Literal["latency", "period_overlap", "stage_serial", "host_staged"]  # the simulator's cost modes
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)
MODES: tuple[Mode, ...] = get_args(Mode)


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
    attrs: dict[str, Any] = field(default_factory=dict)

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
        return out

    @classmethod
    def from_json(cls, data: Any) -> Plan:
        if not isinstance(data, dict) or not isinstance(data.get("assignment"), dict):
            raise DivimlInputError(
                "not a plan: expected an object with 'assignment': {kernel: device}", field="assignment"
            )
        known = set(cls.__dataclass_fields__)
        fields = {k: v for k, v in data.items() if k in known}
        fields["replicas"] = [ReplicaGroup(list(g["kernels"]), dict(g["shares"])) for g in data.get("replicas", [])]
        return cls(**fields)


def better_of(plan: Plan, other: Plan) -> Plan:
    """The faster of two plans for one problem, with the better of their bounds (each holds for both),
    proven optimal where either proof holds for it."""
    best = other if other.value_s < plan.value_s else plan
    bounds = [b for b in (plan.lower_bound_s, other.lower_bound_s) if b is not None]
    best.lower_bound_s = min(max(bounds), best.value_s) if bounds else None
    best.optimal = best.optimal or (bool(bounds) and meets(best.value_s, max(bounds)))
    return best
