"""The register-tiled vector reduction: how the convolution, pooling and matmul rules schedule a
contraction on a CPU.

The output's innermost axis ``v`` is vectorized: every input is read either contiguously along ``v``
(a weight row, an NHWC activation) or not at all (a value broadcast to every lane). A few other
output axes are unrolled around it, so that each vector loaded from memory feeds several
accumulators (a weight vector reused for several output pixels); the accumulators stay in
registers for the whole reduction, the epilogue (bias, activation, residual) runs on them before
they are stored, and the outer output loops run in parallel over the device's threads.

Sizes come from the target: vector lanes and registers (``CpuFacts``). Among the tilings that fit
the registers, the one that re-reads least wins: vector reads are re-read once per tile of the
reused axes, broadcast reads once per vector tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import tirx
from tvm_ffi import get_global_func

from .analysis import Axis, Contraction, CpuFacts, uses

SPARE_REGISTERS = 4  # for the loaded vector and the broadcasts
MAX_VECTORS = 4  # vector registers per row of the tile


@dataclass(frozen=True)
class Tiling:
    vector: Axis
    vector_tile: int
    width: int  # lanes of one vector register used (a power of two)
    tiles: dict[Axis, int]  # other output axes unrolled into the register tile -> their tile


def largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, max(1, limit)) + 1) if n % d == 0)


def vector_width(extent: int, lanes: int) -> int:
    """The widest vector, a power of two up to ``lanes``, that divides ``extent``."""
    width = 1
    while width * 2 <= lanes and extent % (width * 2) == 0:
        width *= 2
    return width


def vector_tiles(extent: int, width: int) -> list[int]:
    """Tiles of the vector axis worth trying: one to ``MAX_VECTORS`` whole vectors that divide it."""
    return [width * rows for rows in range(1, MAX_VECTORS + 1) if extent % (width * rows) == 0]


def choose_tiling(c: Contraction, facts: CpuFacts) -> Tiling | None:
    """The best register tile, or None when some input is read neither contiguously along the
    output's innermost axis nor independently of it (a transposed or strided read), nor the same
    along aligned runs of it (a grouped convolution's input: the vector tile then stays within a run,
    where that input is a broadcast)."""
    vector = c.output_axes[-1]
    moving = [read for read in c.reads if read.depends_on(vector)]
    vector_reads = [read for read in moving if read.contiguous_in(vector)]
    runs = [read.constant_runs(vector) for read in moving if not read.contiguous_in(vector)]
    if min(runs, default=vector.extent) == 1:
        return None
    tileable = math.gcd(vector.extent, *runs)  # a power of two where some read is grouped
    # an axis reuses a loaded vector when some vector read does not move with it
    reusing = [
        axis
        for axis in reversed(c.output_axes[:-1])
        if axis.extent > 1 and any(not read.depends_on(axis) for read in vector_reads)
    ]
    width = vector_width(tileable, facts.lanes(c.dtype))
    best, best_score = None, math.inf
    for vector_tile in vector_tiles(tileable, width):
        vectors = vector_tile // width
        budget = max(1, (facts.registers - SPARE_REGISTERS) // vectors)
        tiles = {}
        for axis in reusing:
            tiles[axis] = largest_divisor(axis.extent, budget)
            budget //= tiles[axis]
        positions = math.prod(tiles.values())
        rereads = math.prod(axis.extent for axis in reusing) / positions
        loads_per_fma = (positions + vectors) / (positions * vectors)
        score = rereads + 0.25 * vector.extent / vector_tile + 8 * loads_per_fma
        if score < best_score:
            best, best_score = Tiling(vector, vector_tile, width, tiles), score
    return best


def schedule_contraction(c: Contraction, facts: CpuFacts):
    """``c.sch`` scheduled with the best tiling, or None (no tiling, or an epilogue that cannot
    run on the register tile)."""
    tiling = choose_tiling(c, facts)
    if tiling is None:
        return None
    sch, block = c.sch, c.main.block_rv
    lanes = facts.lanes(c.dtype)
    for producer in c.producers:
        if folds_into(c, producer, tiling.vector):
            sch.compute_inline(producer.block_rv)
        else:
            schedule_injective(sch, producer.block_rv, facts)
    *folded, last = c.epilogue or [None]
    for consumer in folded:
        sch.compute_inline(consumer.block_rv)

    vector_outer, vector_inner = sch.split(tiling.vector.loop, [None, tiling.vector_tile])
    vector_rows, vector_inner = split_lanes(sch, vector_inner, tiling.vector_tile, tiling.width)
    tile_outer, tile_inner = [], []
    for axis in c.output_axes[:-1]:
        if axis in tiling.tiles:
            outer, inner = sch.split(axis.loop, [None, tiling.tiles[axis]])
            tile_outer.append(outer)
            tile_inner.append(inner)
    untiled = [axis.loop for axis in c.output_axes[:-1] if axis not in tiling.tiles]
    reductions = [axis.loop for axis in c.reduction]
    sch.reorder(*untiled, vector_outer, *tile_outer, *reductions, *tile_inner, *vector_rows, vector_inner)
    tile_loop = (tile_outer or [vector_outer])[-1]
    if last is not None:  # the accumulators live in registers, the epilogue reads them there
        sch.set_scope(block, 0, "local")
        stored = last.block_rv
    else:
        stored = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(stored, tile_loop, preserve_unit_loops=True)
    vectorize_innermost(sch, stored, lanes)
    for loop in [*tile_inner, *vector_rows]:
        sch.unroll(loop)
    sch.vectorize(vector_inner)
    outer = [*untiled, vector_outer, *tile_outer]
    work = math.prod(axis.extent for axis in [*c.spatial, *c.reduction])
    if facts.parallel(facts.contraction_seconds(work, c.dtype)):
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    if reductions:
        vectorize_innermost(sch, sch.decompose_reduction(block, reductions[0]), lanes)
    return sch


def split_lanes(sch, loop, extent: int, lanes: int) -> tuple[list, object]:
    """``loop`` (``extent`` long) as whole vectors of a power-of-two width up to ``lanes``: ([the loop
    over vectors], the loop over lanes). LLVM handles a 48-lane vector through memory, 25x slower
    than three 16-lane ones."""
    width = vector_width(extent, lanes)
    if extent > width:
        rows, inner = sch.split(loop, [None, width])
        return [rows], inner
    return [], loop


def vectorize_innermost(sch, block, lanes: int) -> None:
    """The block's innermost loop vectorized in whole vectors, the loop over them unrolled."""
    inner = sch.get_loops(block)[-1]
    rows, inner = split_lanes(sch, inner, int(sch.get(inner).extent), lanes)
    for row in rows:
        sch.unroll(row)
    sch.vectorize(inner)


def folds_into(c: Contraction, producer, vector: Axis) -> bool:
    """Whether to compute ``producer`` inside the contraction's reads rather than first, on its own:
    it must keep the innermost index (a transpose would make contiguous reads strided), and padding
    (a condition per element) only where it is read as vectors: read one scalar per multiply-add,
    its condition would cost as much as the multiply-add."""
    sch = c.sch
    stmt = sch.get(producer.block_rv)
    written = stmt.writes[0].source
    if not keeps_innermost(stmt):
        return False
    if not has_condition(stmt):
        return True
    return all(read.contiguous_in(vector) for read in c.reads if read.buffer.same_as(written))


def has_condition(stmt) -> bool:
    return bool(get_global_func("s_tir.schedule.HasIfThenElse")(stmt))


def keeps_innermost(stmt) -> bool:
    """Whether the injective block ``stmt`` reads its inputs at the same innermost index it writes
    (or independently of it)."""
    innermost = stmt.writes[0].region[-1].min
    if not isinstance(innermost, tirx.Var):
        return False
    for region in stmt.reads:
        *leading, last = (dim.min for dim in region.region)
        if any(uses(index, innermost) for index in leading):
            return False
        if uses(last, innermost) and not last.same_as(innermost):
            return False
    return True


def schedule_injective(sch, block, facts: CpuFacts) -> None:
    """One injective block at the root: its innermost loop vectorized in whole vectors, its outer
    loops fused and parallel when it is long enough. A scalar (a mean's division) has no loop."""
    loops = sch.get_loops(block)
    if not loops:
        return
    dtype = str(sch.get(block).writes[0].source.dtype)
    elements = math.prod(int(sch.get(loop).extent) for loop in loops)
    if len(loops) > 1 and facts.parallel(facts.copy_seconds(elements, dtype)):
        sch.parallel(sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0])
    if int(sch.get(loops[-1]).extent) > 1:
        vectorize_innermost(sch, block, facts.lanes(dtype))
