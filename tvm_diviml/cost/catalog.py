"""The cost models by what a user writes (``--cost``, ``PartitionForDevices(cost=...)``): "roofline", a
cost table's path, or "measured".

Measuring needs TVM and this machine, a floor above this package: "measured" is made by the measuring
factory that the caller passes (``tvm_diviml.profiling.profile`` with the model bound to it), so that
naming it here imports nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..errors import DivimlInputError
from ..graph import OpGraph
from ..platform import Platform
from .base import CostModel
from .roofline import RooflineCostModel
from .table import TableCostModel

# (graph, platform) -> the costs of graph's kernels on platform's devices
Factory = Callable[[OpGraph, Platform], CostModel]

BUILT_IN: dict[str, Factory] = {"roofline": RooflineCostModel}
MEASURED = "measured"
NAMES = (*BUILT_IN, MEASURED)
HINT = "use 'roofline', 'measured' or a cost table .json file (or, from Python, a CostModel object)"


def check(spec: str) -> None:
    """Refuse a cost that is neither a name of the catalog nor an existing file, before any work."""
    if spec in NAMES or (isinstance(spec, str) and os.path.isfile(spec)):
        return
    raise DivimlInputError(f"unknown cost '{spec}'", field="cost", hint=HINT)


def create(spec: str, graph: OpGraph, platform: Platform, *, measure: Factory | None = None) -> CostModel:
    """The costs ``spec`` names for ``graph`` on ``platform``: a built-in model, the costs ``measure``
    makes ("measured"), or the cost table at the path ``spec`` (checked to cover ``graph``)."""
    if spec in BUILT_IN:
        return BUILT_IN[spec](graph, platform)
    if spec == MEASURED:
        if measure is None:
            raise DivimlInputError(
                "measured costs need a model that TVM builds",
                field="cost",
                hint="measure with tvm_diviml.profiling.profile, or use 'roofline' or a cost table .json file",
            )
        return measure(graph, platform)
    return TableCostModel.load(spec, platform, graph)
