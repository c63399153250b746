"""The registry of solvers by name, loaded lazily: naming a solver imports only its module.

Each entry is ``module:Class`` under ``tvm_diviml.solvers``; a class declares the objectives and cost
modes it places for.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

CLASSES = {
    "fastest_single_device": "fastest_single_device:FastestSingleDevice",
    "milp": "milp:Milp",
    "greedy": "greedy:Greedy",
    "heft": "heft:Heft",
    "split": "split:Split",
    "cpsat": "cpsat:Cpsat",
    "slicegraph": "slicegraph:SliceGraph",
    "pipeline_mip": "pipeline_mip:PipelineMip",
    "replicas": "replicas:Replicas",
    "downsets": "downsets:Downsets",
    "symmetric": "symmetric:Symmetric",
}


class SolverRegistry(Mapping):
    """Name -> solver class; a class is imported the first time it is asked for."""

    def __getitem__(self, name: str) -> type:
        module, cls = CLASSES[name].split(":")
        return getattr(importlib.import_module(f"{__package__}.{module}"), cls)

    def __iter__(self) -> Iterator[str]:
        return iter(CLASSES)

    def __len__(self) -> int:
        return len(CLASSES)


SOLVERS = SolverRegistry()


def solvers_for(objective: str) -> list[str]:
    """The names of the solvers that place for ``objective``, in registry order."""
    return [name for name, cls in SOLVERS.items() if objective in cls.objectives]
