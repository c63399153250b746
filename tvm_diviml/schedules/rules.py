"""CPU schedule rules in dlight's form, one per kernel class: ``apply(func, target, tunable)`` returns
a Schedule, or None when the rule does not apply (the next one is tried). A rule declines by that
check alone, never by raising: an error is a bug and reaches the caller.

``Conv2d``, ``Pool`` and ``Matmul`` recognise their class from how the contraction reads its inputs
(a sliding window and weights; a window alone, or a whole-axis reduction of one input; plain
operands) and share the register-tiled schedule of ``tiling.py``. Matrix-vector products with the
reduction innermost are TVM's own ``dlight.cpu.GEMV`` (declining where TVM asserts); softmax, layer
and RMS norms ``RowReduction``. ``Injective`` covers elementwise, broadcast and layout kernels;
``Fallback`` any other kernel: its outer loops parallel and its innermost spatial loop vectorized
where that is legal.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad  # a buffer read (tirx.BufferLoad builds one)
from tvm.s_tir import ScheduleError, dlight
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base.common_schedules import try_inline_contiguous_spatial
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule

from ..errors import raise_if_interrupted
from .analysis import REDUCTION, Contraction, CpuFacts, find_contraction, uses
from .rowwise import schedule_row_by_row
from .tiling import padded_for_tiles, schedule_contraction, schedule_injective


class _ContractionRule(CPUScheduleRule):
    """A rule for one class of contraction; subclasses say which (``matches``)."""

    def matches(self, c: Contraction) -> bool:
        raise NotImplementedError

    def apply(self, func, target, _tunable):
        if not self.is_target_available(target):
            return None
        c = find_contraction(func)
        if c is None or not self.matches(c):
            return None
        facts = CpuFacts.of(target)
        return schedule_contraction(padded_for_tiles(c, facts) or c, facts)


class Conv2d(_ContractionRule):
    """Convolutions of any layout, grouped and depthwise: a window read and a weight read."""

    def matches(self, c: Contraction) -> bool:
        windowed = c.window_reads()
        return len(windowed) == 1 and len(c.reads) == 2


class Pool(_ContractionRule):
    """Max, sum and average pooling: one input, read through a window or reduced along whole axes."""

    def matches(self, c: Contraction) -> bool:
        return len(c.reads) == 1


class Matmul(_ContractionRule):
    """Dense, matmul and batched matmul: operands read without a window."""

    def matches(self, c: Contraction) -> bool:
        return len(c.reads) >= 2 and not c.window_reads()


class RowReduction(CPUScheduleRule):
    """Softmax, layer and RMS norms: reductions along rows, and elementwise steps. Copies and casts
    fold into their readers; the rest is computed a row at a time (``rowwise``), or, where TVM refuses
    that or a block would be computed again for each row, each block on its own, rows in parallel
    where that pays and elementwise blocks vectorized. (TVM's ``dlight.cpu.Reduction`` computes every
    block inside the output's innermost loop, which for an RMS norm whose unit axes normalization
    removed meant the whole row once per element: 0.6 us became 182 us.)"""

    def apply(self, func, target, _tunable):
        if not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        blocks = normalize_prim_func(sch)
        if not blocks or all(b.is_injective() for b in blocks) or not all(_reduces_rows(sch, b) for b in blocks):
            return None
        facts = CpuFacts.of(target)
        import os

        rowwise = (
            None
            if os.environ.get("SWEEP") == "base"
            else schedule_row_by_row(func, lambda rows: inline_copies(rows, normalize_prim_func(rows)), facts)
        )
        if rowwise is not None:
            return rowwise
        schedule_blockwise(sch, inline_copies(sch, blocks), facts)
        return sch


class Injective(CPUScheduleRule):
    """Kernels with no reduction: each block parallel over its outer loops, vectorized inside. A
    reduction over unit axes only (a mean over a 1x1 image, a matmul with K = 1, a 1x1 depthwise
    convolution) is one too once normalized, but it keeps its init, and dlight's inlining would fold
    the epilogue into both the init and the update (the bias added twice: a torch Linear(1, 32),
    ReLU, Linear(32, 4) came out 0.19 off); there every block is scheduled where it is."""

    def apply(self, func, target, _tunable):
        if not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        blocks = normalize_prim_func(sch)
        if not blocks or not all(b.is_injective() for b in blocks):
            return None
        facts = CpuFacts.of(target)
        if all(sch.get(b.block_rv).init is None for b in blocks):
            blocks = try_inline_contiguous_spatial(sch, blocks)
        for block in blocks:
            schedule_injective(sch, block.block_rv, facts)
        return sch


class Fallback(CPUScheduleRule):
    """Any other kernel, block by block as ``RowReduction`` schedules them. Slower than a class rule,
    never wrong."""

    def apply(self, func, target, _tunable):
        if not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        blocks = normalize_prim_func(sch)
        if not blocks:
            return None
        schedule_blockwise(sch, inline_copies(sch, blocks), CpuFacts.of(target))
        return sch


def declining_where_it_asserts(dlight_rule: type) -> type:
    """``dlight_rule`` with its AssertionError taken for the decline it should have been, under the
    same name. TVM 0.27's GEMV analysis (``s_tir/dlight/analysis/gemv.py``, ``normalize``) asserts
    that a matrix-vector product has a spatial axis some buffer does not share, where a depthwise
    convolution over a 1x1 image (MobileNetV2's last ones) has none; any other error propagates."""

    class Declining(dlight_rule):
        def apply(self, func, target, tunable):
            try:
                return super().apply(func, target, tunable)
            except AssertionError:
                return None

    Declining.__name__ = Declining.__qualname__ = dlight_rule.__name__
    return Declining


GEMV = declining_where_it_asserts(dlight.cpu.GEMV)


def inline_copies(sch, blocks) -> list:
    """``blocks`` less the copies and casts, folded into their readers (an expensive elementwise
    step, an exponential, stays a block of its own: folded into two reductions it would be computed
    twice, and as a reduction's operand it would no longer vectorize)."""
    kept = []
    for block in blocks:
        value = sch.get(block.block_rv).body
        value = getattr(value, "value", None)
        while isinstance(value, tirx.Cast):
            value = value.value
        if block.is_injective() and isinstance(value, TensorLoad):
            try:
                sch.compute_inline(block.block_rv)
                continue
            except ScheduleError:  # TVM refuses: an output block, or one read in a way inlining cannot fold
                raise_if_interrupted()
        kept.append(block)
    return kept


def schedule_blockwise(sch, blocks, facts: CpuFacts) -> None:
    """Each block at the root on its own: an injective one vectorized (and parallel when long), a
    reduction's leading spatial loops fused and parallel when the device has threads for them."""
    for block in blocks:
        kinds = block.dom_kind()
        leading = len(kinds) - len(kinds.lstrip("S"))
        if leading == len(kinds):
            schedule_injective(sch, block.block_rv, facts)
        elif leading and facts.threads > 1:
            loops = sch.get_loops(block.block_rv)
            sch.parallel(sch.fuse(*loops[:leading]) if leading > 1 else loops[0])


def _reduces_rows(sch, block) -> bool:
    """Whether ``block`` is elementwise or reduces only along the innermost dimension of what it reads."""
    if block.is_injective():
        return True
    stmt = sch.get(block.block_rv)
    reduced = [iv.var for iv in stmt.iter_vars if iv.iter_type == REDUCTION]
    return all(not any(uses(dim.min, var) for dim in region.region[:-1] for var in reduced) for region in stmt.reads)


def cpu_rules() -> list[CPUScheduleRule]:
    """The rules in the order they are tried (the first that applies schedules the kernel)."""
    return [Conv2d(), Pool(), Matmul(), GEMV(), RowReduction(), Injective(), Fallback()]
