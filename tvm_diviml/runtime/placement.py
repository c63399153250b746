"""Placement: how to call a module that ApplyPlan placed (TVM-free, JSON in and out).

It travels beside an exported library (``lib.so`` + ``lib.so.placement.json``), so a placed build
can be loaded and run without the compiler side: which devices the VM gets, in which order, and
which weight goes to which device before the first inference.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

SUFFIX = ".placement.json"


def placement_path(library: str) -> str:
    """Where an exported library's placement lives: beside it, ``lib.so.placement.json``."""
    return library + SUFFIX


def file_sha256(path: str) -> str:
    """The SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class Placement:
    entry: str
    devices: list[str]  # platform device names, host first: the VM's device list
    tvm_devices: list[str]  # "kind:index" of each
    num_threads: list[int | None]  # CPU threads per device (None: TVM's default)
    inputs: list[str]  # model inputs; they arrive on the host
    weight_params: list[list[str]]  # [kind ("weight"|"const"|"packed"), id, device] per parameter after the inputs
    num_params: int  # the weights a user gives (before the weight preparation)
    weight_ids: list[str]  # the entry's weights in order: what the weight preparation returns
    transform_params: str | None  # that preparation (run once, on the host), if any
    constant_ids: list[str]  # what the constants function returns, in order
    constants_func: str | None  # a function returning the module's constants (on the host)
    num_outputs: int
    copies_per_run: int  # to_vdevice copies one inference makes (weights excluded)
    assignment: dict[str, str] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)  # the outputs' tensor keys (segments write them)
    segments: list[dict] = field(default_factory=list)  # per segment function: name, device, kernels,
    # reads, writes (tensor keys), weights
    library_sha256: str | None = None  # the library exported with it: a pair from two exports is refused
    versions: dict[str, str] = field(default_factory=dict)  # what built it: {"tvm": ..., "tvm_diviml": ...}

    @property
    def kernel_devices(self) -> list[str]:
        """The devices the kernels run on, in the VM's order (a build on cpu1 alone has the host cpu0
        too, for its inputs and outputs)."""
        used = set(self.assignment.values()) or {seg["device"] for seg in self.segments}
        return [d for d in self.devices if d in used]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Placement:
        return cls(**json.loads(text))
