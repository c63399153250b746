"""What every CPU rule asks of a kernel, answered once: its blocks in normal form, the one reduction
block (the *contraction*: a matmul, convolution or pooling), how each input of that block is read
along an axis (contiguous, broadcast, or neither), and the target's vector lanes and registers."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tvm import ir, s_tir, sym, tirx
from tvm.runtime import DataType
from tvm.s_tir.dlight.analysis import SBlockInfo, normalize_prim_func
from tvm.sym.pattern import detect_linear_equation
from tvm.target import Target
from tvm.target.codegen import llvm_cpu_has_features, llvm_get_system_triple, llvm_get_vector_width
from tvm.tirx.analysis import undefined_vars

DATA_PARALLEL, REDUCTION = 0, 2  # tirx.IterVar iter_type values
# Below this single-thread time a loop nest runs on one thread even on a device with several: a
# parallel region costs 7 us to launch here with one thread, and waking a second one 10-400 us on this
# virtual machine (measured on 2 cores, 2026-12-02).
PARALLEL_MIN_S = 50e-6
# x86 vector registers by the widest feature the target's CPU has, widest first
X86_VECTOR_FEATURES = (("avx512f", 512), ("avx", 256))


def uses(expr, var) -> bool:
    return any(var.same_as(found) for found in undefined_vars(expr))


def linear_in(index, axis: Axis) -> tuple[int, Any] | None:
    """``index`` as ``step * axis + offset`` with a constant step: (step, offset), where the offset is
    free of ``axis`` (2 and ``ry`` for ``y * 2 + ry``); None where it is not linear in ``axis``."""
    coefficients = detect_linear_equation(index, [axis.var])
    if len(coefficients) != 2 or not isinstance(coefficients[0], tirx.IntImm):
        return None
    return int(coefficients[0]), coefficients[1]


@dataclass(frozen=True)
class Axis:
    """One iteration axis of the contraction block: its variable, static extent and loop."""

    var: Any
    extent: int
    loop: Any
    spatial: bool


@dataclass(frozen=True)
class Read:
    """One tensor the contraction block reads: its buffer and the index of each dimension."""

    buffer: Any
    indices: tuple

    def depends_on(self, axis: Axis) -> bool:
        return any(uses(index, axis.var) for index in self.indices)

    def contiguous_in(self, axis: Axis) -> bool:
        """Consecutive values of ``axis`` read consecutive elements: the last index is ``axis`` plus
        terms free of it, and no other index uses it."""
        *leading, last = self.indices
        if any(uses(index, axis.var) for index in leading):
            return False
        linear = linear_in(last, axis)
        return linear is not None and linear[0] == 1

    def constant_runs(self, axis: Axis) -> int:
        """The longest aligned run of consecutive values of ``axis`` (a power of two dividing its
        extent) along which every index stays the same; 1 where there is none. A grouped
        convolution reads input channel ``c // g * k + r`` for output channel ``c``: the same for
        each run of g output channels (groups of 16 in RegNet), so within a run it is a broadcast."""
        runs, dtype = 1, str(axis.var.ty)

        def constant(value: int):
            return tirx.IntImm(dtype, value)

        while axis.extent % (runs * 2) == 0:
            run = runs * 2
            analyzer = sym.Analyzer()
            start, lane = tirx.Var("start", dtype), tirx.Var("lane", dtype)
            analyzer.bind(start, ir.Range(constant(0), constant(axis.extent // run)))
            analyzer.bind(lane, ir.Range(constant(0), constant(run)))
            analyzer.bind(axis.var, start * constant(run) + lane)
            if any(uses(analyzer.simplify(index), lane) for index in self.indices):
                break
            runs = run
        return runs

    def windowed(self, spatial: list[Axis], reduction: list[Axis]) -> bool:
        """An index that moves with both a spatial and a reduction axis: a sliding window (the input
        of a convolution or a pooling)."""
        return any(
            any(uses(index, a.var) for a in spatial) and any(uses(index, r.var) for r in reduction)
            for index in self.indices
        )


@dataclass
class Contraction:
    """A kernel made of injective blocks around exactly one reduction block (``block``), in normal form
    (one loop per block axis, static extents)."""

    sch: Any
    blocks: list[SBlockInfo]
    main: SBlockInfo
    spatial: list[Axis]  # the block's data-parallel axes, in loop order
    reduction: list[Axis]
    output_axes: list[Axis]  # the spatial axes in the order the output buffer's dimensions use them
    reads: list[Read]
    dtype: str

    @property
    def producers(self) -> list[SBlockInfo]:
        return self.blocks[: self.blocks.index(self.main)]

    @property
    def epilogue(self) -> list[SBlockInfo]:
        return self.blocks[self.blocks.index(self.main) + 1 :]

    def window_reads(self) -> list[Read]:
        return [read for read in self.reads if read.windowed(self.spatial, self.reduction)]


def find_contraction(func: tirx.PrimFunc) -> Contraction | None:
    """The kernel's contraction, or None: not exactly one reduction block, other blocks not injective,
    symbolic extents, or an output not indexed by plain spatial axes."""
    sch = s_tir.Schedule(func)
    blocks = normalize_prim_func(sch)
    if not blocks:
        return None
    reductions = [b for b in blocks if not b.is_injective()]
    if len(reductions) != 1 or any(b.dom_kind().strip("S") for b in blocks if b is not reductions[0]):
        return None
    main = reductions[0]
    stmt = sch.get(main.block_rv)
    if len(stmt.writes) != 1 or stmt.init is None:
        return None
    axes = []
    for iter_var, loop in zip(stmt.iter_vars, sch.get_loops(main.block_rv), strict=False):
        if not isinstance(iter_var.dom.extent, tirx.IntImm) or iter_var.iter_type not in (DATA_PARALLEL, REDUCTION):
            return None
        axes.append(Axis(iter_var.var, int(iter_var.dom.extent), loop, iter_var.iter_type == DATA_PARALLEL))
    if len(axes) != len(stmt.iter_vars):
        return None
    spatial = [a for a in axes if a.spatial]
    output = stmt.writes[0]
    output_axes = []
    for dim in output.region:
        used = [a for a in spatial if uses(dim.min, a.var)]
        if len(used) > 1 or (used and not dim.min.same_as(used[0].var)):
            return None
        output_axes += used
    if len(output_axes) != len(spatial) or not spatial:
        return None
    reads = [
        Read(region.source, tuple(dim.min for dim in region.region))
        for region in stmt.reads
        if not region.source.same_as(output.source)
    ]
    if any(not isinstance(dim.extent, tirx.IntImm) or int(dim.extent) != 1 for r in stmt.reads for dim in r.region):
        return None
    return Contraction(
        sch, blocks, main, spatial, [a for a in axes if not a.spatial], output_axes, reads, str(output.source.dtype)
    )


# The layouts TOPI names its convolutions and poolings after ("conv2d_nchw", "pool_max" has none)
LAYOUT_SUFFIXES = ("nchw", "nhwc", "ncw", "nwc", "ncdhw", "ndhwc")


def main_operator(func: tirx.PrimFunc) -> tuple[str | None, str | None]:
    """What a kernel computes, as a report names it: its first reduction's block (the last block where
    nothing reduces), named after the TOPI operator, and the layout that name carries, if any:
    ("conv2d", "NCHW") for a convolution in NCHW; (None, None) for a kernel that is not in normal form."""
    blocks = normalize_prim_func(s_tir.Schedule(func))
    if not blocks:
        return None, None
    main = next((b for b in blocks if not b.is_injective()), blocks[-1])
    name = main.name.removeprefix("T_")
    operator, _, suffix = name.rpartition("_")
    return (operator, suffix.upper()) if suffix in LAYOUT_SUFFIXES and operator else (name, None)


def vector_bits(target: Target) -> int:
    """The width of ``target``'s vector registers: on x86 from its CPU's features (TVM 0.27's
    ``llvm_get_vector_width`` answers 512 for every x86 CPU, AVX2-only ones included, and tiles sized
    for 32 registers of 16 lanes spilled on a Zen 3: a 3x3 convolution at 36 GFLOP/s on one core),
    elsewhere LLVM's answer; 128 where there is none."""
    triple = str(target.attrs.get("mtriple") or llvm_get_system_triple())
    if triple.startswith(("x86_64", "i386", "i686")):
        return next((bits for feature, bits in X86_VECTOR_FEATURES if llvm_cpu_has_features([feature], target)), 128)
    bits = llvm_get_vector_width(target)
    return bits if bits and bits > 0 else 128


def vector_registers(target: Target, bits: int) -> int:
    """The vector registers of ``target``: 32 with AVX-512 and on AArch64 (NEON and SVE both have 32),
    16 on x86 without AVX-512 and wherever else it is not known (the fewer: a tile sized for too
    many spills)."""
    triple = str(target.attrs.get("mtriple") or llvm_get_system_triple())
    return 32 if bits >= 512 or triple.startswith(("aarch64", "arm64")) else 16


@dataclass(frozen=True)
class CpuFacts:
    """What a schedule needs to know of an llvm target: vector width, registers and the threads of
    the device it runs on (the target's ``num-cores``; all of this machine's when it names none)."""

    vector_bits: int
    registers: int
    threads: int

    @staticmethod
    def of(target: Target) -> CpuFacts:
        bits = vector_bits(target)
        threads = int(target.attrs.get("num-cores") or os.cpu_count() or 1)
        return CpuFacts(bits, vector_registers(target, bits), threads)

    def lanes(self, dtype: str) -> int:
        return max(1, self.vector_bits // DataType(dtype).bits)

    def parallel(self, seconds: float) -> bool:
        """Whether a loop nest of about ``seconds`` on one thread is worth spreading over the
        device's threads: waking the other threads costs ``PARALLEL_MIN_S`` here and more on a
        loaded machine."""
        return self.threads > 1 and seconds >= PARALLEL_MIN_S

    def contraction_seconds(self, multiply_adds: int, dtype: str) -> float:
        """A rough single-thread time of a vectorized contraction: a quarter of the FMA peak
        (two FMA pipes, ~3 GHz)."""
        return multiply_adds / (self.lanes(dtype) * 2 * 3e9 / 4)

    @staticmethod
    def copy_seconds(elements: int, dtype: str) -> float:
        """A rough single-thread time of an injective loop nest: read and write each element at
        ~10 GB/s."""
        return elements * 2 * DataType(dtype).bits / 8 / 10e9
