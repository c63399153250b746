"""``diviml run --export``: the kept build written as an artefact folder that ``tvm_diviml.load`` runs
(``runtime.artefact``, docs/deploy.md). A path ending in ``.so`` keeps the library form: the library and
its placement (one per replica or copy, with ``PATH.builds.json``), the weights left to the caller."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tvm_diviml.runtime.artefact import LIBRARY, MANIFEST, WEIGHTS, TensorSpec, is_artefact, write_artefact
from tvm_diviml.runtime.placement import Placement, placement_path
from tvm_diviml.runtime.routed import RoutedBuild, SplitBuild
from tvm_diviml.runtime.vm import PlacedExecutable
from tvm_diviml.writes import check_folder_replaceable

from .files import Written

if TYPE_CHECKING:  # the checks before a run import no TVM
    from tvm_diviml.zoo import BuiltModel

    from .run import MeasuredRun

# what runs a build of each kind (a placed build: the executor the run timed, "single VM" or "concurrent")
RUNNERS = {
    "replicas": "a concurrent executor per replica, side by side",
    "batch split": "a concurrent executor per copy, side by side",
    "servers": "rpc",
    "replicated servers": "rpc, per replica",
}


def library_form(path: str, across_servers: bool) -> bool:
    """Whether ``--export path`` asks for the library alone: a path ending in ``.so`` (an export across
    servers is always a folder)."""
    return path.endswith(".so") and not across_servers


def export_writes(path: str, servers: Sequence[str] | None = None) -> list[Written]:
    """What ``--export path`` writes, for the checks made before the run (``app.files``); ``servers``: the
    platform's, for a run across RPC servers. A folder that holds anything but an earlier export is
    refused now: an export replaces its folder whole."""
    if library_form(path, servers is not None):
        return [Written(path, "--export"), Written(placement_path(path), "--export's placement")]
    check_folder_replaceable(path, "--export", is_artefact)
    if servers is None:
        inside = [os.path.join(path, name) for name in (LIBRARY, placement_path(LIBRARY))]
    else:
        from tvm_diviml.runtime.rpc import export_files  # TVM enters here: the RPC runtime loads only for --rpc

        inside = export_files(path, servers)
    inside += [os.path.join(path, name) for name in (WEIGHTS, MANIFEST)]
    return [Written(path, "--export", folder=True), *(Written(f, f"--export's {os.path.basename(f)}") for f in inside)]


def export_run(
    path: str,
    built: Any,
    model: BuiltModel,
    measured: MeasuredRun,
    weights: Sequence[tuple[str, np.ndarray]] | None = None,
) -> str:
    """Export the build a run kept (a PlacedExecutable, RoutedBuild or SplitBuild, or a build across
    servers) to ``path``; returns the line the run prints. ``model``: the model run (its inputs and
    outputs); ``weights``: what the runner takes, where not the model's (a batch split's sub-batch model's)."""
    local = isinstance(built, PlacedExecutable | RoutedBuild | SplitBuild)
    if library_form(path, not local):
        built.export(path)
        if isinstance(built, PlacedExecutable):
            return f"build exported to {path} (+ .placement.json; no weights: export to a folder for an artefact)"
        return (
            f"builds exported beside {path}: one library per replica or copy ({os.path.basename(path)} with .partN "
            f"before its suffix, + placements) and {path}.builds.json (load with "
            f"tvm_diviml.runtime.{type(built).__name__}.load; no weights: export to a folder for an artefact)"
        )
    kind = build_kind(built)
    placements = build_placements(built)
    files = write_artefact(
        path,
        (lambda staging: built.export(os.path.join(staging, LIBRARY))) if local else built.export,
        kind=kind,
        weights=list(weights or model.params),
        inputs=[TensorSpec(name, tuple(shape), dtype) for name, shape, dtype in model.inputs],
        outputs=output_signature(model),
        executor={
            "name": measured.executor if kind == "placed" else RUNNERS[kind],
            "objective": measured.objective,
            "stream": measured.objective != "latency",
            "in_flight": measured.in_flight,
            "threads": {d: n for p in placements for d, n in zip(p.devices, p.num_threads, strict=True)},
        },
        devices={d: spec for p in placements for d, spec in zip(p.devices, p.tvm_devices, strict=True)},
    )
    folder = os.path.join(path, "")  # with one trailing separator
    if local:
        return (
            f"exported to {folder} ({len(files)} files: {kind} build, weights, manifest): "
            f"run it with tvm_diviml.load({path!r}) (docs/deploy.md)"
        )
    return (
        f"exported to {folder} ({len(files)} files: one library per server with servers.json, weights, manifest): "
        "it runs across RPC servers (tvm_diviml.runtime.rpc)"
    )


def build_kind(built: Any) -> str:
    """The manifest's name for a build: ``runtime.artefact.LOCAL_KINDS`` or ``SERVER_KINDS``."""
    if isinstance(built, PlacedExecutable):
        return "placed"
    if isinstance(built, RoutedBuild):
        return "replicas"
    if isinstance(built, SplitBuild):
        return "batch split"
    return "replicated servers" if hasattr(built, "routes") else "servers"


def build_placements(built: Any) -> list[Placement]:
    """Every library's placement, in the build's order."""
    if isinstance(built, PlacedExecutable):
        return [built.placement]
    if isinstance(built, RoutedBuild | SplitBuild):
        return [b.placement for b in built.builds]
    routes = getattr(built, "routes", [built])  # across servers: one ServersBuild, or one per replica
    return [b.placement for route in routes for b in route.builds.values()]


def output_signature(model: BuiltModel) -> list[TensorSpec]:
    """The entry's outputs as the runners return them (a tuple flattened), named ``output0``, ``output1``,
    ...: a Relax function keeps no output names. A dimension not known before the run is None."""

    def tensors(ty) -> list:
        fields = getattr(ty, "fields", None)  # a tuple's
        return [t for field in fields for t in tensors(field)] if fields is not None else [ty]

    return [
        TensorSpec(
            f"output{index}",
            tuple(getattr(d, "value", None) for d in getattr(ty.shape, "values", None) or [None] * ty.ndim),
            str(ty.dtype),
        )
        for index, ty in enumerate(tensors(model.mod[model.entry].ret_ty))
    ]
