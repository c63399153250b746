"""Row kernels (softmax, layer and RMS norms, and what is fused around them) computed a row at a time:
every block inside the output's loop over rows, parallel where that pays, and each reduction along a row
summed in vector accumulators (``rfactor``) rather than one scalar chain.

Block by block, each block sweeps the whole tensor before the next starts, and a scalar sum over 768
elements waits on each add in turn: ViT-B/16's 197 x 768 layer norm took 190 us on two threads this
way and 22-33 us a row at a time (ONNX Runtime: ~80 us); a ConvNeXt 3136 x 96 one 247 against 71 us,
an attention softmax over 2364 rows of 197 1333 against 510 us.

A row whose reduction is not a whole number of vectors (197) keeps a scalar reduction: TVM 0.27's
``compute_at`` drops the predicate of a block whose split did not divide its loop, and the vector
accumulators then read past the row's end.
"""

from __future__ import annotations

import math

from tvm import s_tir
from tvm.s_tir import ScheduleError

from ..errors import raise_if_interrupted
from .analysis import CpuFacts
from .tiling import vectorize_innermost

MAX_ACCUMULATORS = 4  # vector accumulators per reduction along a row
MIN_STEPS = 8  # vector adds into each accumulator: fewer, and summing the lanes at the end dominates


def accumulator_lanes(extent: int, lanes: int) -> int | None:
    """How many lanes a reduction of ``extent`` elements sums into: the most vectors, up to
    ``MAX_ACCUMULATORS``, that divide it and still take ``MIN_STEPS`` adds each (one vector where
    none does); None where no whole number of vectors covers it twice. Timed on a 3136 x 96 layer norm,
    one vector ran 75 us and four 122; on 197 x 768 four ran 22 us and one 38."""
    if extent % lanes or extent < 2 * lanes:
        return None
    for count in range(MAX_ACCUMULATORS, 0, -1):
        if extent % (lanes * count) == 0 and extent // (lanes * count) >= MIN_STEPS:
            return lanes * count
    return lanes


def schedule_row_by_row(func, blocks_of, facts: CpuFacts):
    """``func`` scheduled a row at a time, or None where TVM refuses a step or where a block would be
    computed more often than once per element (a block that reads across rows: each row would
    recompute it). ``blocks_of(sch)`` gives the blocks to schedule, the output's last."""
    sch = s_tir.Schedule(func)
    try:
        return sch if _schedule(sch, blocks_of(sch), facts) else None
    except ScheduleError:  # a block TVM will not move under the rows: an output, or read in another order
        raise_if_interrupted()
        return None


def _schedule(sch, blocks, facts: CpuFacts) -> bool:
    out, producers = blocks[-1], blocks[:-1]
    out_loops = sch.get_loops(out.block_rv)
    if not out.is_injective() or len(out_loops) < 2 or not producers:
        return False
    work = {sch.get(b.block_rv).name_hint: _iterations(sch, b.block_rv) for b in blocks}
    accumulated = {}
    for block in producers:
        if block.is_injective():
            continue
        reduction = sch.get_loops(block.block_rv)[-1]
        width = accumulator_lanes(int(sch.get(reduction).extent), facts.lanes(_dtype(sch, block.block_rv)))
        if width is not None:
            _, lane = sch.split(reduction, [None, width])
            accumulated[sch.get(block.block_rv).name_hint] = (sch.rfactor(lane, factor_axis=1), width)
    row = sch.fuse(*out_loops[:-1]) if len(out_loops) > 2 else out_loops[0]
    vectorize_innermost(sch, out.block_rv, facts.lanes(_dtype(sch, out.block_rv)))
    for block in reversed(producers):
        sch.compute_at(block.block_rv, row)
        name = sch.get(block.block_rv).name_hint
        if name in accumulated:
            sch.compute_at(accumulated[name][0], row)
    for name, (partial, width) in accumulated.items():
        if not _lanes_innermost(sch, partial, width):
            return False
        work[sch.get(partial).name_hint] = work[name]
    for block in producers:
        inner = sch.get_loops(block.block_rv)[1:]
        if block.is_injective() and inner and int(sch.get(inner[-1]).extent) > 1:
            vectorize_innermost(sch, block.block_rv, facts.lanes(_dtype(sch, block.block_rv)))
    computed = [b.block_rv for b in blocks] + [partial for partial, _ in accumulated.values()]
    if any(_iterations(sch, b) > work[sch.get(b).name_hint] for b in computed):
        return False
    if facts.parallel(facts.copy_seconds(_iterations(sch, out.block_rv), _dtype(sch, out.block_rv))):
        sch.parallel(row)
    for partial, _ in accumulated.values():  # after parallel, which a reduction's separate init blocks
        sch.decompose_reduction(partial, sch.get_loops(partial)[-2])
    return True


def _lanes_innermost(sch, partial, width: int) -> bool:
    """The partial sums' loops under the row, (lanes, steps) as ``compute_at`` makes them, reordered
    with the lanes innermost and vectorized; False where the loops are not that pair."""
    inner = sch.get_loops(partial)[1:]
    if len(inner) != 2 or int(sch.get(inner[0]).extent) != width:
        return False
    sch.reorder(inner[1], inner[0])
    sch.vectorize(inner[0])
    return True


def _iterations(sch, block) -> int:
    return math.prod(int(sch.get(loop).extent) for loop in sch.get_loops(block))


def _dtype(sch, block) -> str:
    return str(sch.get(block).writes[0].source.dtype)
