"""Builds of plans that give the kernels of one model more than one device: replicas and batch splits.

A replicated plan (``Plan.replicas``) is built as one executable per route (``Plan.routes``: the plain
assignment an input runs with, and the share of the stream it takes): the whole model replicated
gives one build per device, each on that device and its cores alone. A batch split (``Plan.batch_split``
R, kernels ``b{i}/name``) is built as one executable of the sub-batch model per distinct copy
assignment. ``runner(params)`` opens them side by side (``runtime.replicas``); one ``ConcurrentRunner``
per build.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import DivimlInputError
from ..jsonio import read_json
from ..plan import Plan
from ..writes import write_text
from .concurrent import ConcurrentRunner
from .replicas import ReplicatedRunner, SplitBatchRunner
from .vm import PlacedExecutable

MAX_ROUTES = 16  # a replicated plan with more routes than this is planned, not built
MANIFEST_SUFFIX = ".builds.json"  # beside an export: which library is which replica or copy


def part_path(path: str, index: int) -> str:
    """Where an export at ``path`` (``m.so``) keeps its ``index``-th library: ``m.part0.so``."""
    stem, ext = os.path.splitext(path)
    return f"{stem}.part{index}{ext}"


def export_parts(path: str, builds: list[PlacedExecutable], manifest: dict) -> str:
    """Each distinct build as ``part_path(path, i)`` (+ its placement), and ``path + MANIFEST_SUFFIX``
    naming, per replica or copy, the part it runs (``manifest`` adds what else a load needs)."""
    distinct = list({id(b): b for b in builds}.values())
    for index, built in enumerate(distinct):
        built.export(part_path(path, index))
    parts = [next(i for i, b in enumerate(distinct) if b is built) for built in builds]
    text = json.dumps({**manifest, "parts": parts}, sort_keys=True)
    write_text(path + MANIFEST_SUFFIX, text, "the exported manifest")
    return path


def load_parts(path: str, kind: str) -> tuple[list[PlacedExecutable], dict]:
    """What ``export_parts`` wrote at ``path``: the builds per replica or copy, and the manifest."""
    manifest = read_json(path + MANIFEST_SUFFIX)
    if not isinstance(manifest, dict) or manifest.get("kind") != kind or not isinstance(manifest.get("parts"), list):
        raise DivimlInputError(
            f"{path + MANIFEST_SUFFIX} does not describe a {kind} export", source=path, hint="export the build again"
        )
    loaded: dict[int, PlacedExecutable] = {}
    for index in manifest["parts"]:
        if index not in loaded:
            loaded[index] = PlacedExecutable.load(part_path(path, index))
    return [loaded[index] for index in manifest["parts"]], manifest


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

    def export(self, path: str) -> str:
        """Each replica's library as ``m.partI.so`` beside ``path`` (+ placements) and ``path.builds.json``
        (names, shares, policy); ``RoutedBuild.load(path)`` reads them back."""
        manifest = {"kind": "replicas", "names": self.names, "shares": self.shares, "policy": self.policy}
        return export_parts(path, self.builds, manifest)

    @classmethod
    def load(cls, path: str) -> RoutedBuild:
        builds, manifest = load_parts(path, "replicas")
        return cls(builds, list(manifest["shares"]), list(manifest["names"]), manifest.get("policy", "shares"))


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

    def export(self, path: str) -> str:
        """Each distinct copy build as ``m.partI.so`` beside ``path`` (+ placements) and
        ``path.builds.json`` (names, which inputs are batched); ``SplitBuild.load(path)`` reads them
        back (the weights are the caller's, as for any export)."""
        return export_parts(path, self.builds, {"kind": "batch split", "names": self.names, "batched": self.batched})

    @classmethod
    def load(cls, path: str) -> SplitBuild:
        builds, manifest = load_parts(path, "batch split")
        return cls(builds, list(manifest["names"]), list(manifest["batched"]))


def _lanes(builds: list[PlacedExecutable], params: list[np.ndarray]) -> list[ConcurrentRunner]:
    """A ConcurrentRunner per distinct build, in the order given (the same build twice: one runner), all
    reading one copy of the weights where their devices share the host's memory (``vm.on_device``)."""
    opened: dict[int, ConcurrentRunner] = {}
    prepared: dict = {}
    try:
        for built in builds:
            if id(built) not in opened:
                opened[id(built)] = ConcurrentRunner(built, params, prepared=prepared)
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
