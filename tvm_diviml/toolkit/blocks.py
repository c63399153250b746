"""Repeated blocks: the transformer layers of a model, found in its kernel graph (TVM-free).

A block is a run of consecutive kernels in topological order; the blocks of a model are the longest
run of identical, chained consecutive blocks (same PrimFuncs, weights, devices, times and wiring),
between a *head* (embedding) and a *tail* (final norm, LM head). The symmetric solver places one
block once and reuses it. ``find_blocks`` returns None, with the reason, when blocks cover less than
half of the kernels; the symmetric solver then falls back.

What "identical" means and how ties are broken: docs/solvers.md#blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost.base import CostModel
from ..graph import OpGraph
from ..platform import Platform


@dataclass
class Blocks:
    """``head`` kernels, then ``blocks`` (each a list of kernels, position by position alike), then ``tail``."""

    head: list[str]
    blocks: list[list[str]]
    tail: list[str]

    @property
    def block_size(self) -> int:
        return len(self.blocks[0])

    def position(self) -> dict[str, tuple[int, int]]:
        """Kernel -> (block index, position in its block), for the kernels of blocks."""
        return {k: (b, j) for b, block in enumerate(self.blocks) for j, k in enumerate(block)}


def kernel_identity(graph: OpGraph, costs: CostModel, platform: Platform, kernel: str) -> tuple:
    """What must agree for two kernels to be interchangeable in a repeated block."""
    k = graph.kernels[kernel]
    what = k.attrs.get("primfunc_hash") or (k.flops, k.bytes_moved)
    return (
        what,
        k.output_bytes,
        tuple(graph.weights.get(w, 0.0) for w in k.weights),
        k.allowed_devices,
        k.colocate is not None,
        tuple(costs.compute_s(kernel, d) for d in platform.device_names),
    )


def longest_repeat(keys: list[int]) -> tuple[int, int, int]:
    """(start, period, repeats) of the run of identical consecutive pieces covering most of ``keys``;
    ties go to the shorter period, then the earlier start. repeats < 2 when nothing repeats."""
    values = np.asarray(keys)
    n = len(values)
    best = (0, 0, 0, 1)  # coverage, start, period, repeats
    for period in range(1, n // 2 + 1):
        match = values[:-period] == values[period:]
        # run[i]: consecutive matches from i on (the next mismatch's index minus i)
        index = np.arange(len(match))
        mismatch = np.where(match, len(match), index)
        next_mismatch = np.minimum.accumulate(mismatch[::-1])[::-1]
        repeats = 1 + (next_mismatch - index) // period
        coverage = repeats * period
        start = int(np.argmax(coverage))
        if repeats[start] >= 2 and coverage[start] > best[0]:
            best = (int(coverage[start]), start, period, int(repeats[start]))
    return best[1], best[2], best[3]


def find_blocks(graph: OpGraph, costs: CostModel, platform: Platform) -> tuple[Blocks | None, str]:
    """The model's repeated blocks, or None and why not."""
    order = graph.topo_order
    identities: dict[tuple, int] = {}
    keys = [identities.setdefault(kernel_identity(graph, costs, platform, k), len(identities)) for k in order]
    start, period, repeats = longest_repeat(keys)
    if repeats < 2:
        return None, "no sequence of kernels repeats"
    if repeats * period * 2 < len(order):
        return None, (
            f"the longest repeat ({repeats} x {period} kernels) covers less than half of the {len(order)} kernels"
        )
    blocks = Blocks(
        order[:start],
        [order[start + b * period : start + (b + 1) * period] for b in range(repeats)],
        order[start + repeats * period :],
    )
    problem = _wiring_problem(graph, blocks)
    if problem:
        return None, f"{repeats} repeats of {period} kernels, but {problem}"
    if any(graph.kernels[k].colocate is not None for block in blocks.blocks for k in block):
        return None, f"{repeats} repeats of {period} kernels, but blocks hold co-location groups"
    return blocks, f"{repeats} blocks of {period} kernels, head {len(blocks.head)}, tail {len(blocks.tail)}"


def _wiring_problem(graph: OpGraph, blocks: Blocks) -> str:
    """Why the blocks are not a chain of identically wired blocks ('' when they are)."""
    position = blocks.position()
    head, tail = set(blocks.head), set(blocks.tail)
    inputs_of: dict[str, list[float]] = {}
    for graph_input in graph.inputs:
        for consumer in graph_input.consumers:
            inputs_of.setdefault(consumer, []).append(graph_input.bytes)
    signatures = []
    for b, block in enumerate(blocks.blocks):
        signature = []
        for kernel in block:
            inside, outside = [], []
            for edge in graph.pred[kernel]:
                src = position.get(edge.src)
                if src is not None and src[0] == b:
                    inside.append((src[1], edge.bytes))
                elif edge.src in head or (src is not None and src[0] == b - 1):
                    outside.append(edge.bytes)
                else:
                    return f"block {b}'s kernel '{kernel}' reads '{edge.src}', outside the head and the block before"
            leaving = []
            for edge in graph.succ[kernel]:
                dst = position.get(edge.dst)
                if dst is None and edge.dst not in tail or dst is not None and dst[0] not in (b, b + 1):
                    return f"block {b}'s kernel '{kernel}' feeds '{edge.dst}', beyond the next block"
                if dst is None or dst[0] != b:
                    leaving.append(edge.bytes)
            signature.append(
                (
                    sorted(inside),
                    (sorted(set(outside)), sorted(inputs_of.get(kernel, []))),
                    (sorted(set(leaving)), kernel in graph.output_set),
                )
            )
        signatures.append(signature)
    last = len(signatures) - 1
    for b, signature in enumerate(signatures):
        for j, (mine, first, second) in enumerate(zip(signature, signatures[0], signatures[min(1, last)])):
            alike = mine[0] == first[0] and (b == 0 or mine[1] == second[1]) and (b == last or mine[2] == first[2])
            if not alike:
                other = 0 if mine[0] != first[0] else 1
                return f"block {b} is wired unlike block {other} at kernel '{blocks.blocks[b][j]}'"
    return ""
