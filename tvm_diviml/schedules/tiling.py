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

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import ScheduleError
from tvm_ffi import get_global_func

from ..errors import raise_if_interrupted
from ..runtime.packing import packed_index_map
from .analysis import Axis, Contraction, CpuFacts, find_contraction, linear_in, uses

SPARE_REGISTERS = 2  # besides the accumulators and the loaded vectors: for broadcasts and addresses
MAX_VECTORS = 4  # vector registers per row of the tile
# x86 L1 data caches (32 KB 8-way, 48 KB 12-way) have 64 sets of 64-byte lines
CACHE_LINE = 64
L1_SET_PERIOD = 64 * CACHE_LINE
L1_WAYS = 8
L2_BYTES = 1 << 20  # per core: AMD Zen 4 and 5; Intel's recent cores have 1.25-2 MB
# TVM keeps a "global" buffer declared inside a kernel on the stack below this many bytes
# (``kMaxStackAlloca``); a larger one, or any "local" one, is allocated and freed where it is declared
# (``TVMBackendAllocWorkspace``): see ``accumulator_scope``
STACK_BYTES = 1024
REDUCTION_CHUNK = 256  # a blocked reduction's run: 128 and 512 measured slower on T5's and BERT's products
MAX_BLOCKED_VECTORS = 3  # per position in a blocked tile: a run of 4 vectors of weights (64 KB) leaves L1
# What a line of the vector operands read from L2 costs a tile, in loads: with it, 2 vectors x 14 positions
# beat 1 x 28 on ResNet-50's convolutions over 56x56 and 28x28 images (10-37% faster, two threads)
L2_LINE_LOADS = 2
# The same beyond half of L2 (from L3 or memory), on CPUs of 16 vector registers: with it, 2 vectors x 4
# positions beat 1 x 8 on a Zen 3 (AVX2) in ResNet-18's and ResNet-50's convolutions (1.1-2x), Inception's
# 1x1s (2x) and transformers' products (1.3-2x; 0.9x on the 768 -> 3072 ones). With 32 registers, tiles of
# weights beyond L2 keep the absolute re-read count: there it would take T5's projection off its measured
# blocked path (2 x 14 did beat 1 x 28 by 10-15% on ResNet-50's 3x3 convolutions there; not yet re-measured)
MEMORY_LINE_LOADS = 4
# Independent accumulators that keep two FMA units of 4 cycles' latency busy: a tile of fewer waits on its
# own results. On a Zen 3, 1x1 convolutions over 7x7 images into 2048 channels ran 1.75x faster as 1 vector x
# 7 positions than as the 4 x 1 that the loads alone preferred (ResNet-50, MobileNetV2, RandWire)
FMA_IN_FLIGHT = 8
# What a broadcast costs a tile that shares it, in vector loads, where the tile's weights are re-read from L2
# or beyond. The score counted vector tiles instead (0.25 each), a count that grows with the columns: the
# products into 3072 columns took 4 vectors x 1-2 positions. Counted so on a Zen 3 (two threads): ConvNeXt-T's
# 49 x 768 -> 3072 took 1 x 7 (0.66x the time alone), ViT-B/16's and BERT's MLPs 2 x 5 and 2 x 4 (0.85-0.89x);
# whole models, old and new builds timed in pairs: ViT-B/16 and GPT-2 0.94x, ConvNeXt-T 0.955x, T5 0.97x
BROADCAST_LOADS = 2
MAX_UNROLLED_VECTORS = 256  # a row of 2048 channels in 8 lanes; longer rows keep their loop
SHORT_REDUCTION = 32  # multiply-adds per accumulator up to which that allocation weighs on a tile (a 5x5 window: 25)
# A depthwise window over a padded input reads it through a condition per multiply-add unless the padded input
# is written out first, a parallel copy inside the kernel that costs 12-15 us more on two threads: worth it
# from about this single-thread estimate (``CpuFacts.contraction_seconds``) up. Zen 3, two threads, stride 1:
# 3x3 over 112x112x32 and 56x56x144 0.53x and 0.67x the time, 5x5 over 28x28x240 and 14x14x672 0.38x and 0.40x,
# 7x7 over 56x56x96 and 14x14x384 0.22x and 0.30x (estimates 300-1,230 us); 3x3 over 14x14x576 and 28x28x192
# alike (85 and 113 us); 3x3 over 7x7x960 and 7x7 over 7x7x768 1.7x and 1.25x (35 and 153 us)
PAD_APART_MIN_S = 200e-6
# On one thread, where the copy is not split between two cores' caches, 3x3 windows gained and lost alike from it
# (0.70-1.33x over 112x112x32, 56x56x144 and 28x28x192) and 5x5 and 7x7 ones gained (0.25-0.46x)
SERIAL_PAD_APART_MIN_TAPS = 25
# A PrimFunc attribute set by extraction: the positions of the parameters every call fills with a weight
WEIGHT_PARAMS_ATTR = "diviml.weight_params"


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


def positions_budget(registers: int, vectors: int) -> int:
    """How many positions a tile of ``vectors`` vectors per position may hold: the accumulators and
    the loaded vectors in registers, with ``SPARE_REGISTERS`` left. One more and LLVM spills: a 1x1
    convolution over a 7x7 image with 4 vectors by 7 positions (28 accumulators, 4 loaded) ran at 45
    GFLOP/s, with 2 by 7 at 114."""
    return max(1, (registers - SPARE_REGISTERS - vectors) // vectors)


def stack_positions(vector_tile: int, dtype: str) -> int:
    """How many positions of ``vector_tile`` accumulators keep the tile's buffer on the stack (one
    at least: a tile of 4 vectors of 64-bit lanes is 512 bytes a position)."""
    return max(1, (STACK_BYTES - 1) // (vector_tile * _itemsize(dtype)))


def choose_tiling(c: Contraction, facts: CpuFacts, blocked: bool = False) -> Tiling | None:
    """The best register tile, or None when some input is read neither contiguously along the
    output's innermost axis nor independently of it (a transposed or strided read), nor the same
    along aligned runs of it (a grouped convolution's input: the vector tile then stays within a run,
    where that input is a broadcast). A short reduction (a depthwise convolution's 9 taps) keeps its
    accumulators' buffer small enough for the stack (``accumulator_scope``): allocating it took a third
    of a depthwise tile's time.
    ``blocked``: the tile of a blocked reduction (``schedule_blocked``), whose re-reads come from L1
    and L2: the fewest loads per multiply-add wins, up to ``MAX_BLOCKED_VECTORS`` vectors wide."""
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
    on_stack = short_reduction(c)
    # re-reading the vector operands once per tile of positions costs their lines from L2 where they stay in
    # half of it, from L3 or memory where not (``MEMORY_LINE_LOADS``); None: the absolute re-read count (a
    # short reduction without broadcasts, as a depthwise window, or one whose weights leave L2; weights beyond
    # L2 with 32 registers). A short one with broadcasts (a 1x1 convolution over 16-32 channels, a stem over 3)
    # took 2 vectors x 4 positions rather than 1 x 8: MobileNetV2's 1.2-1.4x faster each on one thread. In these
    # line-loads scores a shared broadcast counts as ``BROADCAST_LOADS`` loads
    in_l2 = _read_bytes(vector_reads) <= L2_BYTES // 2
    broadcasts = len(moving) < len(c.reads)  # some read does not move with the vector axis
    if on_stack:
        line_loads = L2_LINE_LOADS if broadcasts and in_l2 else None
    else:
        line_loads = L2_LINE_LOADS if in_l2 else MEMORY_LINE_LOADS if facts.registers <= 16 else None
    for vector_tile in vector_tiles(tileable, width):
        vectors = vector_tile // width
        if blocked and vectors > MAX_BLOCKED_VECTORS:
            continue
        budget = positions_budget(facts.registers, vectors)
        if on_stack:
            budget = min(budget, stack_positions(vector_tile, c.dtype))
        tiles = {}
        for axis in reusing:
            tiles[axis] = largest_divisor(axis.extent, budget)
            budget //= tiles[axis]
        positions = math.prod(tiles.values())
        rereads = math.prod(axis.extent for axis in reusing) / positions
        loads_per_fma = (positions + vectors) / (positions * vectors)
        score = rereads + 0.25 * vector.extent / vector_tile + 8 * loads_per_fma
        if line_loads is not None:  # a multiply-add streams 1 / positions of a vector operand's line
            latency = max(1.0, FMA_IN_FLIGHT / (positions * vectors))  # waiting on too few accumulators
            position_loads = BROADCAST_LOADS * positions if broadcasts else positions
            # a window of vectors alone (a 7x7 depthwise one) still weighs its count of vector tiles
            sweeps = 0 if broadcasts else 0.25 * vector.extent / vector_tile
            score = 8 * ((position_loads + vectors) / (positions * vectors) + line_loads / positions) * latency + sweeps
        if blocked:  # re-reads come from L1 and L2: what limits a tile is its loads
            score = loads_per_fma + 1e-3 * rereads
        if score < best_score:
            best, best_score = Tiling(vector, vector_tile, width, tiles), score
    return best


POSITION_ROUND = 8  # a positions axis without a divisor of 4 or more up to this is padded to its multiple


def padded_for_tiles(c: Contraction, facts: CpuFacts) -> Contraction | None:
    """``c`` computed over a padded domain, where an axis has no good tile: the vector axis (197
    tokens: one lane) to whole vectors, an axis of positions (197 again: one position a tile) to a
    multiple of ``POSITION_ROUND``; the padded rows and columns are computed and dropped. None where
    no axis needs it or TVM cannot pad (a windowed read: ``pad_einsum`` takes plain indices only).
    ViT-B/16's attention scores ran at 4 GFLOP/s unpadded."""
    lanes = facts.lanes(c.dtype)
    vector = c.output_axes[-1]
    rounds = {}
    if vector.extent > lanes and vector_width(vector.extent, lanes) < lanes // 2:
        rounds[vector] = lanes
    for axis in c.output_axes[:-1]:
        if axis.extent > POSITION_ROUND and largest_divisor(axis.extent, POSITION_ROUND) < POSITION_ROUND // 2:
            rounds[axis] = POSITION_ROUND
    if not rounds:
        return None
    stmt = c.sch.get(c.main.block_rv)
    padding = [
        next((factor for axis, factor in rounds.items() if axis.var.same_as(iter_var.var)), 1)
        for iter_var in stmt.iter_vars
    ]
    sch = c.sch.copy()  # ``c`` stays whole where the padded kernel is no contraction after all
    try:
        sch.pad_einsum(c.main.block_rv, padding)
    except ScheduleError:  # not an einsum: a window, a stride or a sum of axes in some index
        raise_if_interrupted()
        return None
    return find_contraction(sch.mod["main"])


def schedule_contraction(c: Contraction, facts: CpuFacts):
    """``c.sch`` scheduled with the best tiling, or None (no tiling, or an epilogue that cannot
    run on the register tile)."""
    tiling = choose_tiling(c, facts)
    if tiling is None:
        return None
    work = math.prod(axis.extent for axis in [*c.spatial, *c.reduction])
    threads = facts.threads if facts.parallel(facts.contraction_seconds(work, c.dtype)) else 1
    blocking = None
    if restreams_vectors(c, tiling) and (blocked_tiling := choose_tiling(c, facts, blocked=True)) is not None:
        blocking = reduction_blocking(c, blocked_tiling, threads)
        tiling = blocked_tiling if blocking is not None else tiling
    sch, block = c.sch, c.main.block_rv
    lanes = facts.lanes(c.dtype)
    pack_weights(c, tiling)
    padding_apart = pads_apart(c, facts)
    for producer in c.producers:
        if folds_into(c, producer, tiling.vector, padding_apart):
            padding_as_select(sch, producer.block_rv)
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
    if blocking is not None:
        loops = BlockedLoops(vector_outer, vector_rows, vector_inner, untiled, tile_outer, tile_inner)
        return schedule_blocked(c, tiling, blocking, loops, last, lanes)
    packed = packable_read(c, tiling)
    packed = packed if packed is not None and pack_pays(c, tiling) else None
    positions_first = packed is not None or (channelwise_slide(c) and short_reduction(c))
    outer = [*untiled, *tile_outer, vector_outer] if positions_first else [*untiled, vector_outer, *tile_outer]
    sch.reorder(*outer, *reductions, *tile_inner, *vector_rows, vector_inner)
    tile_loop = outer[-1]
    if last is not None:  # the accumulators live in registers, the epilogue reads them there
        sch.set_scope(block, 0, accumulator_scope(threads))
        stored = last.block_rv
    else:
        stored = sch.cache_write(block, 0, accumulator_scope(threads))
    sch.reverse_compute_at(stored, tile_loop, preserve_unit_loops=True)
    vectorize_innermost(sch, stored, lanes)
    for loop in [*tile_inner, *vector_rows]:
        sch.unroll(loop)
    sch.vectorize(vector_inner)
    if packed is not None:
        pack_broadcasts(sch, block, c, tiling, packed, tile_outer[-1])
        outer = outer[:-1]  # the vector tiles run after the pack, in the thread that packed
    if threads > 1:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    if reductions:
        vectorize_innermost(sch, sch.decompose_reduction(block, reductions[0]), lanes)
    return sch


def channelwise_slide(c: Contraction) -> bool:
    """Whether ``c`` is a depthwise convolution or a pooling whose window moves one element per position:
    every read moves with the output's innermost axis (the channel), so no operand is shared across
    channels, and no window is strided. There a 3x3 or 5x5 window's channel tiles run innermost among its
    parallel loops, not outermost: each of the input's cache lines then serves every channel of it at
    once instead of once per tile of channels (Zen 3, two threads, 3x3 over 112x112x32 unpadded 0.58x the
    time; 7x7 windows, which stay in L1 along a row of one tile of channels, ran 1.8x slower so); and a
    long one reads a padded copy of its input (``pads_apart``)."""
    vector = c.output_axes[-1]
    channelwise = bool(c.window_reads()) and all(read.depends_on(vector) for read in c.reads)
    return channelwise and not strided_window(c)


def short_reduction(c: Contraction) -> bool:
    return math.prod(axis.extent for axis in c.reduction) <= SHORT_REDUCTION


def strided_window(c: Contraction) -> bool:
    """Whether some window of ``c`` moves by more than one element per output position."""
    for read in c.window_reads():
        for index in read.indices:
            for axis in c.spatial:
                linear = linear_in(index, axis) if uses(index, axis.var) else None
                if linear is not None and linear[0] > 1:
                    return True
    return False


def pads_apart(c: Contraction, facts: CpuFacts) -> bool:
    """Whether ``c``'s padded input is written out before the window reads it (``PAD_APART_MIN_S``):
    a ``channelwise_slide`` in a kernel long enough to pay for the copy. Strided windows keep the
    condition: their padded copy is about their stride squared times the output (3x3, stride 2, over
    112x112x96: 1.6-2x slower with it); on one thread, so do windows under ``SERIAL_PAD_APART_MIN_TAPS``."""
    taps = math.prod(axis.extent for axis in c.reduction)
    work = math.prod(axis.extent for axis in c.spatial) * taps
    return (
        channelwise_slide(c)
        and facts.contraction_seconds(work, c.dtype) >= PAD_APART_MIN_S
        and (facts.threads > 1 or taps >= SERIAL_PAD_APART_MIN_TAPS)
    )


def accumulator_scope(threads: int) -> str:
    """The scope of the register tile's accumulator buffer. TVM 0.27 allocates a "local" buffer from its
    workspace pool wherever it is declared: once per call in serial code, but once per iteration of a
    parallel loop, where MobileNetV2's 1x1 convolutions over 16 channels then took 2.5x their serial
    time on one thread. A "global" one under ``STACK_BYTES`` is a stack array that LLVM keeps in
    registers: whole CPU (two threads), MobileNetV2 10.97 -> 7.94 ms, ResNet-50 73.3 -> 64.1. Serial
    code keeps "local": there the stack array measured 2-7% slower on the same models (LLVM spilled an
    accumulator of the unrolled reduction)."""
    return "global" if threads > 1 else "local"


@dataclass(frozen=True)
class ReductionBlocking:
    """A long reduction cut in blocks: ``axis`` in runs of ``chunk`` steps, the outer loop over them
    outside the register tiles, and the vector tiles in ``groups`` (one per thread)."""

    axis: Axis
    chunk: int
    groups: int


def restreams_vectors(c: Contraction, tiling: Tiling) -> bool:
    """Whether ``tiling``'s loop order would read the vector operands (the weights) from memory once per
    tile of positions: the broadcasts are packed (``pack_pays``), so the tiles of positions run
    outermost, and the vector operands do not fit in half of L2. T5's feed-forward output projection
    (128 x 2048 x 512, 4 MB of weights) re-read them eight times."""
    if packable_read(c, tiling) is None or not pack_pays(c, tiling):
        return False
    return _read_bytes(read for read in c.reads if read.depends_on(tiling.vector)) > L2_BYTES // 2


def blocked_axis(c: Contraction) -> Axis | None:
    """The reduction axis to cut in runs, or None: a window (a convolution's reads move with the
    output as well), a reduction of fewer than ``2 * REDUCTION_CHUNK`` steps, or one with no run of at
    least a quarter of ``REDUCTION_CHUNK`` that divides it."""
    axis = c.reduction[-1] if c.reduction else None
    if axis is None or c.window_reads() or axis.extent < 2 * REDUCTION_CHUNK:
        return None
    if largest_divisor(axis.extent, REDUCTION_CHUNK) < REDUCTION_CHUNK // 4:
        return None
    return axis


def reduction_blocking(c: Contraction, tiling: Tiling, threads: int) -> ReductionBlocking | None:
    """How to block a matrix product's reduction, or None where ``blocked_axis`` finds no axis to cut
    or the vector tiles do not split evenly over ``threads``. Unblocked,
    a tile reads its operands' whole rows (8 KB each for 2048 steps) once per tile, from L2 or memory;
    blocked, a tile's share of a run of the reduction (its broadcasts, its weight vectors) stays in L1
    for every vector tile of a thread's group, and the weights come from memory once. Taken only where
    the unblocked order would re-read the weights from memory (``restreams_vectors``): elsewhere
    (BERT's and T5's other products, reductions of 512-768 steps) blocking measured 0-20% slower.
    Measured, two threads, caches flushed: T5's feed-forward output projection (128 x 2048 x 512)
    1,771 -> 1,338 us; the whole T5 encoder 31.2 -> 28.6 ms; ResNet-50 45.5 -> 44.6 ms."""
    axis = blocked_axis(c)
    if axis is None or (tiling.vector.extent // tiling.vector_tile) % threads:
        return None
    return ReductionBlocking(axis, largest_divisor(axis.extent, REDUCTION_CHUNK), threads)


@dataclass(frozen=True)
class BlockedLoops:
    """The loops ``schedule_contraction`` has split, handed to ``schedule_blocked``."""

    vector_outer: object
    vector_rows: list
    vector_inner: object
    untiled: list
    tile_outer: list
    tile_inner: list


def schedule_blocked(
    c: Contraction, tiling: Tiling, blocking: ReductionBlocking, loops: BlockedLoops, last, lanes: int
):
    """``schedule_contraction``'s loop nest for a blocked reduction: per thread a group of vector tiles,
    then the runs of the reduction, then the tiles of positions (the broadcast operand's run packed
    once for each), then the group's vector tiles. The accumulators live in the output across the
    runs (LLVM keeps a tile's in registers within a run), and the epilogue runs once the whole
    reduction is done, on the thread's group."""
    sch, block = c.sch, c.main.block_rv
    run_outer, run_inner = sch.split(blocking.axis.loop, [None, blocking.chunk])
    vector_outer, group = loops.vector_outer, []
    if blocking.groups > 1:
        group_loop, vector_outer = sch.split(vector_outer, [blocking.groups, None])
        group = [group_loop]
    reductions = [run_inner if axis is blocking.axis else axis.loop for axis in c.reduction]
    inner = [*reductions, *loops.tile_inner, *loops.vector_rows, loops.vector_inner]
    sch.reorder(*loops.untiled, *group, run_outer, *loops.tile_outer, vector_outer, *inner)
    for loop in [*loops.tile_inner, *loops.vector_rows]:
        sch.unroll(loop)
    sch.vectorize(loops.vector_inner)
    packed = packable_read(c, tiling, conflicts_only=False)
    if packed is not None and loops.tile_outer:
        pack_broadcasts(sch, block, c, tiling, packed, loops.tile_outer[-1])
    parallel = [*loops.untiled, *group]
    if last is not None and parallel:
        sch.reverse_compute_at(last.block_rv, parallel[-1], preserve_unit_loops=True)
    if last is not None:  # a whole group's row: its vectors in a loop, not unrolled (96 for BERT's 1536)
        inner = sch.get_loops(last.block_rv)[-1]
        sch.vectorize(split_lanes(sch, inner, int(sch.get(inner).extent), lanes)[1])
    if parallel and blocking.groups > 1:
        sch.parallel(sch.fuse(*parallel) if len(parallel) > 1 else parallel[0])
    vectorize_innermost(sch, sch.decompose_reduction(block, run_outer), lanes)
    return sch


def pack_weights(c: Contraction, tiling: Tiling) -> None:
    """Lay out each weight that the tile reads as vectors in blocks of the tile's width
    (``runtime/packing.py``): each tile's weights one contiguous run instead of a few vectors per
    row. Weights come from memory once per inference; measured with the caches flushed before each
    call (two threads), ResNet-50's contractions 49.3 -> 45.2 ms, a LLaMA decoding step's 14.3 -> 6.9.
    Only parameters marked as weights (``WEIGHT_PARAMS_ATTR``), read directly by the contraction."""
    func = c.sch.mod["main"]
    marked = func.attrs.get(WEIGHT_PARAMS_ATTR) if func.attrs is not None else None
    if not marked:
        return
    lanes = tiling.vector_tile
    for position in (int(p) for p in marked):
        buffer = func.params[position]
        stmt = c.sch.get(c.main.block_rv)
        index = next((i for i, r in enumerate(stmt.reads) if r.source.same_as(buffer)), None)
        read = next((r for r in c.reads if r.buffer.same_as(buffer)), None)
        if index is None or read is None or not read.contiguous_in(tiling.vector):
            continue
        if any(read.depends_on(axis) for axis in tiling.tiles) or int(buffer.shape[-1]) != tiling.vector.extent:
            continue
        c.sch.transform_layout(c.main.block_rv, ("read", index), packed_index_map(lanes))


def packable_read(c: Contraction, tiling: Tiling, conflicts_only: bool = True) -> int | None:
    """The index (among the block's reads) of the operand read as broadcasts by a register tile of
    several positions, when its rows share sets of the L1 cache: read without a window, each index a
    constant or an axis times a stride, whole rows. Unpacked, each broadcast of a tile comes from its
    own row: with rows 4 KB apart (1024 channels) all of them fall in one set, and ResNet-50's 1x1
    convolution over them ran at 23 GFLOP/s where its 3x3 neighbour ran at 113."""
    if not tiling.tiles:
        return None
    stmt = c.sch.get(c.main.block_rv)
    output = stmt.writes[0].source
    for index, region in enumerate(stmt.reads):
        if region.source.same_as(output):
            continue
        dims = strided_dims(region, [*c.spatial, *c.reduction])
        if dims is None or any(axis is tiling.vector for axis, _ in dims):
            continue
        if not any(axis in tiling.tiles for axis, _ in dims):
            continue
        shape = [int(d) for d in region.source.shape]
        if any(axis is not None and axis.extent * step != extent for (axis, step), extent in zip(dims, shape)):
            continue
        if not conflicts_only or broadcasts_per_cache_set(dims, shape, tiling, region.source.dtype) > L1_WAYS:
            return index
    return None


def strided_dims(region, axes: list[Axis]) -> list[tuple[Axis | None, int]] | None:
    """Per dimension of the read, the axis that indexes it and its stride ((None, 0) for a constant),
    or None where an index is anything else (a window, a sum of axes)."""
    dims = []
    for dim in region.region:
        if isinstance(dim.min, tirx.IntImm):
            dims.append((None, 0))
            continue
        used = [axis for axis in axes if uses(dim.min, axis.var)]
        if len(used) != 1:
            return None
        linear = linear_in(dim.min, used[0])
        if linear is None or linear[0] < 1 or not (isinstance(linear[1], tirx.IntImm) and int(linear[1]) == 0):
            return None
        step = linear[0]
        dims.append((used[0], step))
    return dims


def broadcasts_per_cache_set(dims: list, shape: list[int], tiling: Tiling, dtype) -> int:
    """The most broadcasts of one reduction step of the register tile that fall in one set of the L1
    cache (addresses ``L1_SET_PERIOD`` apart share a set)."""
    itemsize = _itemsize(dtype)
    strides = [math.prod(shape[i + 1 :]) * itemsize for i in range(len(shape))]
    offsets = [0]
    for (axis, step), stride in zip(dims, strides, strict=True):
        if axis in tiling.tiles:
            offsets = [o + position * step * stride for o in offsets for position in range(tiling.tiles[axis])]
    sets = [(offset % L1_SET_PERIOD) // CACHE_LINE for offset in offsets]
    return max(sets.count(s) for s in set(sets))


def pack_pays(c: Contraction, tiling: Tiling) -> bool:
    """Whether packing the broadcasts pays: a pack serves every vector tile only with the tiles of
    positions outside those of the vector axis, which re-reads the vector operands once per tile of
    positions where they do not fit in L2; that must not move more bytes than the usual order, which
    re-reads the broadcast operands once per vector tile. (A pack inside each vector tile copies the
    operand that often: slower than none, measured on ResNet-50's 1x1 convolutions, as was the
    positions-first order without a pack wherever the rows did not share a cache set.)"""
    broadcast = _read_bytes(read for read in c.reads if not read.depends_on(tiling.vector))
    vectors = _read_bytes(read for read in c.reads if read.depends_on(tiling.vector))
    position_tiles = math.prod(axis.extent // tile for axis, tile in tiling.tiles.items())
    vector_tiles = tiling.vector.extent // tiling.vector_tile
    return vectors * (1 if vectors <= L2_BYTES // 2 else position_tiles) <= broadcast * vector_tiles


def _read_bytes(reads) -> int:
    """The bytes of the buffers ``reads`` read, whole."""
    return sum(_bytes(read.buffer) for read in reads)


def _bytes(buffer) -> int:
    return math.prod(int(d) for d in buffer.shape) * _itemsize(buffer.dtype)


def _itemsize(dtype) -> int:
    return tvm.DataType(str(dtype)).bits // 8


def pack_broadcasts(sch, block, c: Contraction, tiling: Tiling, index: int, tile_loop) -> None:
    """Copy the tile's rows of the broadcast operand, once per tile of positions, into a buffer laid out
    reduction first, positions last: the broadcasts of one step of the reduction are then adjacent
    (a strided read copies the rows it skips too: s - 1 of every s)."""
    dims = strided_dims(sch.get(block).reads[index], [*c.spatial, *c.reduction])
    tiles = {axis: tile for axis, tile in tiling.tiles.items() if tile > 1}
    order = [axis for axis in c.output_axes[:-1] if axis in tiles]
    cache = sch.cache_read(block, index, "global")
    sch.compute_at(cache, tile_loop)

    def packed(*coordinates):
        leading, inner = [], {}
        for coordinate, (axis, step) in zip(coordinates, dims, strict=True):
            if axis in tiles:
                block_rows = step * tiles[axis]
                leading.append(coordinate // block_rows)
                inner[axis] = coordinate % block_rows
            else:
                leading.append(coordinate)
        return [*leading, *(inner[axis] for axis in order)]

    sch.transform_layout(cache, ("write", 0), packed)


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
    """The block's innermost loop vectorized in whole vectors, the loop over them unrolled up to
    ``MAX_UNROLLED_VECTORS``: a transpose of GPT-2's 50257 x 768 embedding, unrolled 50257 times (an
    odd row: one lane), kept LLVM busy for over ten minutes."""
    inner = sch.get_loops(block)[-1]
    extent = int(sch.get(inner).extent)
    rows, inner = split_lanes(sch, inner, extent, lanes)
    if extent // vector_width(extent, lanes) <= MAX_UNROLLED_VECTORS:
        for row in rows:
            sch.unroll(row)
    sch.vectorize(inner)


def folds_into(c: Contraction, producer, vector: Axis, padding_apart: bool) -> bool:
    """Whether to compute ``producer`` inside the contraction's reads rather than first, on its own:
    it must keep the innermost index (a transpose would make contiguous reads strided), and padding
    (a condition per element) only where it is read as vectors: read one scalar per multiply-add,
    its condition would cost as much as the multiply-add. ``padding_apart``: padding never
    (``pads_apart``)."""
    sch = c.sch
    stmt = sch.get(producer.block_rv)
    written = stmt.writes[0].source
    if not keeps_innermost(stmt):
        return False
    if not has_condition(stmt):
        return True
    if padding_apart:
        return False
    if condition_on_innermost(stmt):
        return False  # a vector straddling the edge (``padded_for_tiles``' 197 of 208): a masked load per step
    return all(read.contiguous_in(vector) for read in c.reads if read.buffer.same_as(written))


def padding_as_select(sch, block_rv) -> None:
    """A block that stores ``if_then_else(inside, x[i], c)`` (padding with a constant) stores
    ``select(inside, x[clamp(i)], c)`` instead: both sides computed, the read kept in bounds. LLVM
    makes the first a branch per read, around which it stored every accumulator of the register
    tile after each multiply-add; the second is a masked vector load, the accumulators stay in
    registers (3x3 depthwise convolutions over 112x112x32, 56x56x144 and 14x14x576, two threads:
    1.3x, 1.4x and 2.0x faster). The clamped read is bound by a ``Let`` outside the select: inside it,
    TVM's simplifier assumes the condition and drops the clamp, and the kernel read up to a row before
    its input (a segfault where that memory was not mapped)."""
    block = sch.get(block_rv)
    store = block.body
    value = getattr(store, "value", None)
    if not (isinstance(store, tirx.BufferStore) and _is_call(value, "prim.if_then_else")):
        return
    inside, read, other = value.args
    if not isinstance(read, tvm.ir.expr.TensorLoad) or not isinstance(other, tirx.IntImm | tirx.FloatImm):
        return
    clamped = [
        index
        if _axis_within(block, index, int(extent))
        else tirx.max(tirx.min(index, tirx.IntImm(str(index.ty), int(extent) - 1)), tirx.IntImm(str(index.ty), 0))
        for index, extent in zip(read.indices, read.source.shape, strict=True)
    ]
    loaded = tirx.Var("padded_read", read.source.dtype)
    value = tirx.Let(loaded, tirx.BufferLoad(read.source, clamped), tirx.Select(inside, loaded, other))
    body = tirx.BufferStore(store.buffer, value, store.indices)
    new = s_tir.SBlock(
        block.iter_vars,
        block.reads,
        block.writes,
        block.name_hint,
        body,
        block.init,
        block.alloc_buffers,
        block.match_buffers,
        block.annotations,
    )
    sch.state.replace(sch.get_sref(block_rv), new, {block: new})


def _axis_within(block, index, extent: int) -> bool:
    """Whether ``index`` is one of the block's axes and never leaves ``[0, extent)`` (a dimension
    padded only after its end reads the axis itself, up to the padded extent)."""
    dom = next((iv.dom for iv in block.iter_vars if iv.var.same_as(index)), None)
    return dom is not None and int(dom.min) >= 0 and int(dom.min) + int(dom.extent) <= extent


def _is_call(expr, name: str) -> bool:
    return isinstance(expr, tvm.ir.expr.Call) and getattr(expr.op, "name", None) == name


def condition_on_innermost(stmt) -> bool:
    """Whether the block's value is chosen by a condition on the index of its innermost dimension."""
    value = getattr(stmt.body, "value", None)
    innermost = stmt.writes[0].region[-1].min
    if not _is_call(value, "prim.if_then_else"):
        return False
    return isinstance(innermost, tirx.Var) and uses(value.args[0], innermost)


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
