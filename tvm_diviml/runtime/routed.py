"""Builds of plans that give the kernels of one model more than one device: replicas and batch splits.

A replicated plan (``Plan.replicas``) is built as one executable per route (``Plan.routes``: the plain
assignment an input runs with, and the share of the stream it takes): the whole model replicated
gives one build per device, each on that device and its cores alone. A batch split (``Plan.batch_split``
R, kernels ``b{i}/name``) is built as one executable of the sub-batch model per distinct copy
assignment. ``runner(params)`` opens them side by side (``runtime.replicas``); one ``ConcurrentRunner``
per build.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import DivimlInputError
from ..plan import Plan
from .concurrent import ConcurrentRunner
from .replicas import ReplicatedRunner, SplitBatchRunner
from .vm import PlacedExecutable

MAX_ROUTES = 16  # a replicated plan with more routes than this is planned, not built


@dataclass
class RoutedBuild:
    """One build per route of a replicated plan, with the route's share of the stream."""

    builds: list[PlacedExecutable]
    shares: list[float]
    names: list[str]
    policy: str = "shares"

    @property
    def devices(self) -> list[str]:
        return list(dict.fromkeys(d for b in self.builds for d in b.placement.devices))

    def runner(self, params: list[np.ndarray]) -> ReplicatedRunner:
        return ReplicatedRunner(_lanes(self.builds, params), self.shares, self.names, self.policy)


@dataclass
class SplitBuild:
    """A batch split: the sub-batch model's build of each copy (copies placed alike share one)."""

    builds: list[PlacedExecutable]  # per copy, in copy order
    names: list[str]
    batched: list[bool]  # per model input: axis 0 is the batch
    sub_params: list[np.ndarray] = field(default_factory=list)  # the sub-batch model's weights

    @property
    def devices(self) -> list[str]:
        return list(dict.fromkeys(d for b in self.builds for d in b.placement.devices))

    def runner(self, params: list[np.ndarray]) -> SplitBatchRunner:
        """``params``: the batch model's weights; the sub-batch model's own, when kept, go first (a
        zoo model at a sub-batch draws the same values, but an importer may order them otherwise)."""
        return SplitBatchRunner(_lanes(self.builds, self.sub_params or params), self.names, self.batched)


def _lanes(builds: list[PlacedExecutable], params: list[np.ndarray]) -> list[ConcurrentRunner]:
    """A ConcurrentRunner per distinct build, in the order given (the same build twice: one runner)."""
    opened: dict[int, ConcurrentRunner] = {}
    try:
        for built in builds:
            if id(built) not in opened:
                opened[id(built)] = ConcurrentRunner(built, params)
    except BaseException:
        for runner in opened.values():
            runner.close()
        raise
    return [opened[id(built)] for built in builds]


def route_names(routes: list[tuple[dict[str, str], float]]) -> list[str]:
    """A route on one device is named by it; others by their number and devices."""
    names = []
    for index, (assignment, _) in enumerate(routes):
        devices = sorted(set(assignment.values()))
        names.append(devices[0] if len(devices) == 1 else f"route {index} ({', '.join(devices)})")
    return names


def build_routes(plan: Plan, build_one: Callable[[Plan], PlacedExecutable], policy: str = "shares") -> RoutedBuild:
    """``plan``'s routes, each built by ``build_one`` (a plain plan in, its executable out)."""
    routes = plan.routes()
    if len(routes) > MAX_ROUTES:
        raise DivimlInputError(
            f"this plan gives an input {len(routes)} routes through its replicas; a build makes at most {MAX_ROUTES}",
            field="replicas",
            hint="plan with fewer replicated stages (e.g. --solver milp, without replicas)",
        )
    builds = [build_one(route_plan(plan, assignment)) for assignment, _ in routes]
    return RoutedBuild(builds, [share for _, share in routes], route_names(routes), policy)


def route_plan(plan: Plan, assignment: dict[str, str]) -> Plan:
    """One route of ``plan`` as a plain plan of the same objective."""
    return Plan(dict(assignment), objective=plan.objective, mode=plan.mode, solver=plan.solver)
