"""An exported artefact: one folder with everything another machine needs to run a placed model, and
``load``, which runs it there.

``diviml run --export DIR`` writes the library (one per replica or copy for a replicated or split
build) with its placement, the weights as the runner takes them (``weights.npz``, in order, by name),
and ``manifest.json``: the format, the versions that built it, the executor the plan was kept with,
the devices, the inputs' and outputs' names, shapes and dtypes, and every file's SHA-256. The folder
is written whole or not at all; a folder whose files do not match its manifest is refused.

Loading reads ``tvm.runtime`` and this package's runtime only: no compiler, frontend or solver
(docs/deploy.md).
"""

from __future__ import annotations

import json
import os
import weakref
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import __version__
from ..errors import DivimlInputError
from ..jsonio import read_json
from ..writes import folder_written_whole, write_text
from .concurrent import ConcurrentRunner
from .placement import file_sha256
from .routed import RoutedBuild, SplitBuild
from .vm import PlacedExecutable, SingleVMRunner

FORMAT = "tvm-diviml artefact"
# 2: weights of kind "packed" in the placement (packing.py), which a reader of format 1 cannot make
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
WEIGHTS = "weights.npz"
# the library, beside its placement (model.so.placement.json); a replicated or split build keeps one
# library per distinct replica or copy (model.partN.so) and model.so.builds.json
LIBRARY = "model.so"
LOCAL_KINDS = ("placed", "replicas", "batch split")  # builds that run on this machine's devices
SERVER_KINDS = ("servers", "replicated servers")  # builds across RPC servers, run by those servers
EXECUTORS = ("single VM", "concurrent")  # how a placed build runs (``diviml run`` keeps the one it timed)
RELOAD_HINT = "export it again, or copy the folder whole"


@dataclass(frozen=True)
class TensorSpec:
    """A model input's or output's name, shape and dtype (a dimension None: known only when it runs)."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str

    def describe(self) -> str:
        return "(" + ", ".join("?" if d is None else str(d) for d in self.shape) + f") {self.dtype}"

    def fits(self, array: np.ndarray) -> bool:
        return (
            str(array.dtype) == self.dtype
            and array.ndim == len(self.shape)
            and all(want is None or want == got for want, got in zip(self.shape, array.shape, strict=True))
        )

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, entry: Any, field: str) -> TensorSpec:
        name, shape, dtype = (
            (entry.get(key) for key in ("name", "shape", "dtype")) if isinstance(entry, dict) else [None] * 3
        )
        dimensions = isinstance(shape, list) and all(d is None or (isinstance(d, int) and d >= 0) for d in shape)
        if not (isinstance(name, str) and dimensions and isinstance(dtype, str)):
            raise DivimlInputError("each entry needs a name, a shape and a dtype", field=field, hint=RELOAD_HINT)
        return cls(name, tuple(shape), dtype)


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` says, checked: how to open the build and what it takes and gives."""

    kind: str  # LOCAL_KINDS or SERVER_KINDS
    executor: dict[str, Any]  # name (EXECUTORS for a placed build), objective, stream, in_flight, threads
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    weight_keys: list[str]  # the runner's weights in order, as keys of weights.npz
    devices: dict[str, str]  # platform device name -> TVM device ("cpu:1")
    versions: dict[str, str]

    @property
    def in_flight(self) -> int:
        return self.executor.get("in_flight") or 1


def is_artefact(folder: str) -> bool:
    """Whether ``folder`` holds an export (one an export may replace)."""
    return os.path.isfile(os.path.join(folder, MANIFEST))


def write_artefact(
    folder: str,
    write_build: Callable[[str], Any],
    *,
    kind: str,
    weights: Sequence[tuple[str, np.ndarray]],
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    executor: dict[str, Any],
    devices: dict[str, str],
) -> list[str]:
    """Write an artefact to ``folder``, whole or not at all: ``write_build(staging)`` writes the libraries
    and placements into the new folder, then come the weights and the manifest naming every file's
    SHA-256. Returns the files written, relative to ``folder``."""
    import tvm

    with folder_written_whole(folder, "the export", is_artefact) as staging:
        write_build(staging)
        names = [name for name, _ in weights]
        keys = _weight_keys(names)
        arrays = [np.asarray(array) for _, array in weights]
        _save_weights(os.path.join(staging, WEIGHTS), keys, arrays)
        files = {name: file_sha256(os.path.join(staging, name)) for name in _files_under(staging)}
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "versions": {"tvm": tvm.__version__, "tvm_diviml": __version__},
            "kind": kind,
            "executor": executor,
            "devices": [{"name": name, "tvm_device": spec} for name, spec in devices.items()],
            "inputs": [spec.to_json() for spec in inputs],
            "outputs": [spec.to_json() for spec in outputs],
            "weights": [
                {"name": name, "key": key, "shape": list(array.shape), "dtype": str(array.dtype)}
                for name, key, array in zip(names, keys, arrays, strict=True)
            ],
            "files": files,
        }
        write_text(os.path.join(staging, MANIFEST), json.dumps(manifest, indent=1) + "\n", "the export's manifest")
    return [*files, MANIFEST]


def _weight_keys(names: list[str]) -> list[str]:
    """Each weight's key in weights.npz: its name, with its position before it where two share one."""
    count = Counter(names)
    return [name if count[name] == 1 else f"{index}:{name}" for index, name in enumerate(names)]


def _save_weights(path: str, keys: list[str], arrays: list[np.ndarray]) -> None:
    """An .npz that ``numpy.load`` reads, keys in order. Not ``numpy.savez(**named)``: a weight named
    ``file`` or ``allow_pickle`` would be taken for that argument."""
    with zipfile.ZipFile(path, "w", allowZip64=True) as archive:
        for key, array in zip(keys, arrays, strict=True):
            with archive.open(f"{key}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)


def _files_under(folder: str) -> list[str]:
    """Every file below ``folder``, as a relative path with ``/``, sorted."""
    found = []
    for root, _, names in os.walk(folder):
        relative = os.path.relpath(root, folder)
        found += [name if relative == "." else f"{relative}/{name}".replace(os.sep, "/") for name in names]
    return sorted(found)


# ---------------------------------------------------------------------- loading
def load(folder: str) -> Artefact:
    """The artefact ``diviml run --export`` wrote to ``folder``, opened on this machine's devices with the
    executor the plan was kept with: ``model = tvm_diviml.load(folder); outputs = model(x)``."""
    manifest = read_manifest(folder)
    if manifest.kind in SERVER_KINDS:
        raise DivimlInputError(
            "this export runs across RPC servers (one library per server), not on this machine alone",
            source=folder,
            hint="run it with tvm_diviml.runtime.rpc (ServersBuild.load and RpcRunner), or export a run without --rpc",
        )
    with np.load(os.path.join(folder, WEIGHTS), allow_pickle=False) as archive:
        try:
            weights = [archive[key] for key in manifest.weight_keys]
        except KeyError as error:
            raise DivimlInputError(f"{WEIGHTS} has no weight {error}", source=folder, hint=RELOAD_HINT) from None
    return Artefact(folder, manifest, _open_runner(folder, manifest, weights))


def read_manifest(folder: str) -> Manifest:
    """``folder``'s manifest, once every file it names is there with its SHA-256."""
    if not os.path.isdir(folder):
        raise DivimlInputError(
            "no such folder" if not os.path.exists(folder) else "not a folder",
            source=folder,
            hint="give the folder `diviml run --export DIR` wrote",
        )
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        raise DivimlInputError(
            f"no {MANIFEST}: not an export, or one cut short",
            source=folder,
            hint="give the folder `diviml run --export DIR` wrote (a .so alone loads with PlacedExecutable.load)",
        )
    raw = read_json(path)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or not isinstance(raw.get("format_version"), int):
        raise DivimlInputError(f"{MANIFEST} is not a {FORMAT}'s manifest", source=folder, hint=RELOAD_HINT)
    if raw["format_version"] > FORMAT_VERSION:
        raise DivimlInputError(
            f"written in format {raw['format_version']} by tvm-diviml "
            f"{raw.get('versions', {}).get('tvm_diviml', '?')}; this one reads format {FORMAT_VERSION}",
            source=folder,
            hint="load it with a tvm-diviml as new as the one that wrote it",
        )
    _check_files(folder, raw.get("files"))
    try:
        kind, executor = raw["kind"], raw["executor"]
        if kind not in LOCAL_KINDS + SERVER_KINDS or not isinstance(executor, dict):
            raise TypeError(f"kind {kind!r}")
        if kind == "placed" and executor.get("name") not in EXECUTORS:
            raise TypeError(f"executor {executor.get('name')!r}")
        return Manifest(
            kind=kind,
            executor=executor,
            inputs=[TensorSpec.from_json(entry, "inputs") for entry in raw["inputs"]],
            outputs=[TensorSpec.from_json(entry, "outputs") for entry in raw["outputs"]],
            weight_keys=[str(entry["key"]) for entry in raw["weights"]],
            devices={str(entry["name"]): str(entry["tvm_device"]) for entry in raw["devices"]},
            versions=dict(raw.get("versions", {})),
        )
    except (KeyError, TypeError) as error:
        raise DivimlInputError(
            f"{MANIFEST} does not describe an export this version runs ({error})", source=folder, hint=RELOAD_HINT
        ) from None


def _check_files(folder: str, files: Any) -> None:
    """Every file the manifest names is inside ``folder``, there, and has its SHA-256."""
    if not isinstance(files, dict) or WEIGHTS not in files or MANIFEST in files:
        raise DivimlInputError(f"{MANIFEST} does not list the export's files", source=folder, hint=RELOAD_HINT)
    for name, digest in files.items():
        relative = os.path.normpath(name)
        if os.path.isabs(relative) or relative.split(os.sep)[0] == "..":
            raise DivimlInputError(f"{MANIFEST} names a file outside the folder ({name})", source=folder)
        path = os.path.join(folder, relative)
        if not os.path.isfile(path):
            raise DivimlInputError(
                f"the export is incomplete: {name} is missing", source=folder, hint="copy the folder whole"
            )
        if file_sha256(path) != digest:
            raise DivimlInputError(
                f"{name} differs from the file exported (its SHA-256 does not match {MANIFEST})",
                source=folder,
                hint=RELOAD_HINT,
            )


def _open_runner(folder: str, manifest: Manifest, weights: list[np.ndarray]):
    """The runner ``diviml run`` kept: a replicated or split build's, or one VM or the concurrent
    executor for a placed build."""
    library = os.path.join(folder, LIBRARY)
    if manifest.kind == "replicas":
        return RoutedBuild.load(library).runner(weights)
    if manifest.kind == "batch split":
        return SplitBuild.load(library).runner(weights)
    built = PlacedExecutable.load(library)
    if manifest.executor["name"] == "single VM":
        return SingleVMRunner(built, weights)
    return ConcurrentRunner(built, weights)


class Artefact:
    """A loaded export. ``model(x)``, ``model(*arrays)`` or ``model(**named)`` runs one inference: numpy
    arrays in (checked against the signature), a list of numpy arrays out, or the array itself when
    the model has one output. ``model.stream(many)`` runs a stream with the inputs in flight the run
    measured. ``close()`` (or a ``with`` block, or the process's end) stops the executor's workers."""

    def __init__(self, folder: str, manifest: Manifest, runner):
        self.folder, self.manifest, self._runner = folder, manifest, runner
        close = getattr(runner, "close", None)  # one VM holds no workers
        self._closer = weakref.finalize(self, close) if close else None

    @property
    def inputs(self) -> list[TensorSpec]:
        return self.manifest.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self.manifest.outputs

    def __call__(self, *arrays, **named):
        return self._result(self._runner(self._arguments(arrays, named)))

    def stream(self, inputs: Iterable, in_flight: int | None = None) -> Iterator:
        """The outputs of each of ``inputs`` (per inference a list of arrays, or one array for a model of
        one input), in order, with up to ``in_flight`` inputs in the devices (default: as measured)."""
        checked = (self._arguments(tuple(x) if isinstance(x, list | tuple) else (x,), {}) for x in inputs)
        for outputs in self._runner.stream(checked, in_flight or self.manifest.in_flight):
            yield self._result(outputs)

    def _result(self, outputs: list[np.ndarray]):
        return outputs[0] if len(outputs) == 1 else outputs

    def _arguments(self, arrays: tuple, named: dict[str, Any]) -> list[np.ndarray]:
        """The inputs in the model's order, each checked against its name, shape and dtype."""
        specs = self.inputs
        if len(arrays) > len(specs):
            raise DivimlInputError(
                f"the model takes {len(specs)} inputs, {len(arrays)} were given",
                source=self.folder,
                field="inputs",
                hint=f"its inputs: {self.signature()}",
            )
        given = {spec.name: array for spec, array in zip(specs, arrays)}
        for name, array in named.items():
            if name not in {spec.name for spec in specs}:
                raise DivimlInputError(
                    "the model has no input of that name",
                    source=self.folder,
                    field=name,
                    hint=f"its inputs: {self.signature()}",
                )
            if name in given:
                raise DivimlInputError("given twice, by position and by name", source=self.folder, field=name)
            given[name] = array
        missing = [spec for spec in specs if spec.name not in given]
        if missing:
            raise DivimlInputError(
                f"missing: the model takes {missing[0].describe()} here",
                source=self.folder,
                field=missing[0].name,
                hint=f"its inputs: {self.signature()}",
            )
        return [self._checked(spec, np.asarray(given[spec.name])) for spec in specs]

    def _checked(self, spec: TensorSpec, array: np.ndarray) -> np.ndarray:
        if spec.fits(array):
            return array
        got = TensorSpec(spec.name, array.shape, str(array.dtype)).describe()
        cast = f"cast it with .astype('{spec.dtype}')" if str(array.dtype) != spec.dtype else ""
        reshape = "the build is for that shape; export the model again for another (--shape NAME=VALUE)"
        raise DivimlInputError(
            f"got {got}, the model takes {spec.describe()}",
            source=self.folder,
            field=spec.name,
            hint=cast or reshape,
        )

    def signature(self) -> str:
        """The inputs as ``name (shape) dtype``, comma separated."""
        return ", ".join(f"{spec.name} {spec.describe()}" for spec in self.inputs)

    def close(self) -> None:
        if self._closer:
            self._closer()

    def __enter__(self) -> Artefact:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        devices = ", ".join(self.manifest.devices)
        return f"<tvm_diviml artefact {self.folder}: {self.manifest.kind} on {devices}; inputs {self.signature()}>"
