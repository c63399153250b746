"""Weights packed for the vector loads: one layout, shared by the schedule that reads it and the runtime
that writes it (TVM-free: the runtime packs with numpy when it uploads the weights).

A CPU contraction's register tile reads the weight along its last axis (the output channels), a few
vectors at a time, for every step of the reduction: in the weight's own layout those vectors are a row
apart (2-8 KB in ResNet-50's late stages), so the weights, read once per inference from memory, stream
in scattered lines. Packed, the last axis is cut in blocks of ``lanes`` (the tile's width) and the block
index moved in front: ``w[..., c]`` lives at ``packed[c // lanes, ..., c % lanes]``, so each tile's
weights are one contiguous run. The weights are packed once, when they are uploaded, never per
inference.

A packed weight is a parameter of its own, named ``"<lanes>:<kind>:<id>"`` with kind ``"packed"``
beside the ``"weight"`` and ``"const"`` parameters it comes from.
"""

from __future__ import annotations

import numpy as np

PACKED = "packed"


def packed_name(kind: str, name: str, lanes: int) -> str:
    """The parameter id of weight (``kind`` "weight" or "const") ``name`` packed in blocks of ``lanes``."""
    return f"{lanes}:{kind}:{name}"


def packed_source(name: str) -> tuple[str, str, int]:
    """(kind, id, lanes) of the tensor a packed parameter is made from."""
    lanes, kind, source = name.split(":", 2)
    return kind, source, int(lanes)


def unpacked(kind: str, name: str) -> tuple[str, str]:
    """(kind, id) of the weight or constant a parameter holds, packed or not."""
    return packed_source(name)[:2] if kind == PACKED else (kind, name)


def packed_shape(shape: list[int], lanes: int) -> list[int]:
    """The shape of a tensor of ``shape`` packed in blocks of ``lanes``."""
    *leading, last = shape
    if lanes < 1 or last % lanes:
        raise ValueError(f"a last axis of {last} does not split in blocks of {lanes}")
    return [last // lanes, *leading, lanes]


def packed_index_map(lanes: int):
    """The index map from the unpacked tensor's indices to the packed one's, for ``lanes``."""

    def index_map(*index):
        *leading, last = index
        return [last // lanes, *leading, last % lanes]

    return index_map


def pack_array(array: np.ndarray, lanes: int) -> np.ndarray:
    """``array`` packed in blocks of ``lanes`` (a contiguous copy)."""
    *leading, last = array.shape
    packed_shape(list(array.shape), lanes)  # refuses a last axis that does not split
    blocks = array.reshape(*leading, last // lanes, lanes)
    return np.ascontiguousarray(np.moveaxis(blocks, -2, 0))
