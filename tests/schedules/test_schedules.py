"""The default CPU schedules (tvm_diviml/schedules): each rule claims its kernel class and computes
what the unscheduled kernel computes (relative 1e-5) on random shapes, never reading outside a
buffer; targets name this machine's CPU and the device's threads; a one-thread device gets no
parallel loop; every kernel of the zoo gets a class rule, not the fallback; a rule that raises fails
the scheduling (it is no decline); the rules' digest follows their code, not their comments."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import s_tir, te, topi
from tvm.s_tir import dlight
from tvm.s_tir.analysis import OOBChecker

from tests.helpers import examples
from tvm_diviml.app.load import load_model
from tvm_diviml.passes.apply_plan import packed_params
from tvm_diviml.platform import Device
from tvm_diviml.presets import get_platform
from tvm_diviml.runtime.packing import pack_array
from tvm_diviml.schedules import apply, tiling
from tvm_diviml.schedules.analysis import CpuFacts, find_contraction
from tvm_diviml.schedules.apply import (
    UNSCHEDULED,
    GpuGEMV,
    apply_rules,
    rules_digest,
    rules_for,
    schedule_module,
    schedule_names,
    schedules_digest,
)
from tvm_diviml.schedules.rules import GEMV, Conv2d
from tvm_diviml.schedules.target import device_target
from tvm_diviml.schedules.tiling import (
    FMA_IN_FLIGHT,
    MAX_UNROLLED_VECTORS,
    MAX_VECTORS,
    SPARE_REGISTERS,
    WEIGHT_PARAMS_ATTR,
    choose_tiling,
)
from tvm_diviml.zoo import SMALL_OPTIONS, zoo_names

HOST = device_target(get_platform("cpu1").devices[0]).export()


def target(threads: int) -> tvm.target.Target:
    return tvm.target.Target({**{k: v for k, v in HOST.items() if k not in ("tag", "keys")}, "num-cores": threads})


def epilogue(out: te.Tensor) -> te.Tensor:
    """A bias and a ReLU after the kernel, as fusion leaves them."""
    bias = te.placeholder((out.shape[-1],), "float32", name="bias")
    return topi.nn.relu(topi.add(out, bias)), bias


def conv(draw, layout: str, kind: str):
    n, size = draw(st.integers(1, 2)), draw(st.integers(3, 12))
    groups = 1
    channels = draw(st.sampled_from([3, 8, 16, 24, 32]))
    out_channels = draw(st.sampled_from([8, 16, 24, 48]))
    if kind == "depthwise":
        groups = out_channels = channels
    elif kind == "grouped":
        groups = draw(st.sampled_from([2, 4]))
        channels, out_channels = channels * groups, out_channels * groups
    # a 1x1 depthwise convolution reduces nothing: an elementwise product, not this class
    k = draw(st.sampled_from([3, 5] if kind == "depthwise" else [1, 3, 5]))
    stride = draw(st.sampled_from([1, 2]))
    # symmetric, or all after (the input's axis itself read up to the padded extent) or all before
    pad = draw(st.sampled_from([k // 2, (0, 0, k - 1, k - 1), (k - 1, k - 1, 0, 0)]))
    if layout == "NHWC":
        data = te.placeholder((n, size, size, channels), name="data")
        weight = te.placeholder((k, k, channels // groups, out_channels), name="weight")
        out = topi.nn.group_conv2d_nhwc(data, weight, stride, pad, 1, groups)
    else:
        data = te.placeholder((n, channels, size, size), name="data")
        weight = te.placeholder((out_channels, channels // groups, k, k), name="weight")
        out = topi.nn.group_conv2d_nchw(data, weight, stride, pad, 1, groups)
    if layout == "NHWC":
        out, bias = epilogue(out)
        return [data, weight, bias], out
    return [data, weight], topi.nn.relu(out)


def matmul(draw, batched: bool):
    m = draw(st.sampled_from([1, 3, 16, 40, 64]))
    # a reduction of one is an elementwise product, one output column a dot product per row
    k, n = (draw(st.sampled_from([3, 16, 40, 64])) for _ in range(2))
    if batched:
        b = draw(st.integers(1, 3))
        a, w = te.placeholder((b, m, k), name="a"), te.placeholder((b, k, n), name="w")
        out = topi.nn.batch_matmul(a, w, transpose_b=False)
    else:
        a, w = te.placeholder((m, k), name="a"), te.placeholder((k, n), name="w")
        out = topi.matmul(a, w)
    out, bias = epilogue(out)
    return [a, w, bias], out


def matmul_on_aliased_rows(draw):
    """A matmul or a 1x1 convolution (strided too) whose rows lie a multiple of 2 KB apart (512 to 2048 channels):
    the register tile's broadcasts fall in a few sets of the L1 cache, so the rule packs them."""
    k = draw(st.sampled_from([512, 1024, 2048]))
    n = draw(st.sampled_from([16, 48, 64]))
    if draw(st.booleans()):
        a, w = te.placeholder((draw(st.sampled_from([14, 28, 49])), k), name="a"), te.placeholder((k, n), name="w")
        out, bias = epilogue(topi.matmul(a, w))
        return [a, w, bias], out
    size, stride = draw(st.sampled_from([4, 14, 28])), draw(st.sampled_from([1, 2]))
    data, weight = te.placeholder((1, size, size, k), name="data"), te.placeholder((1, 1, k, n), name="weight")
    out, bias = epilogue(topi.nn.conv2d_nhwc(data, weight, stride, 0, 1))
    return [data, weight, bias], out


def matmul_over_weights_larger_than_l2(draw):
    """A (batched) matmul over 128 rows or a 1x1 convolution over 14x14 positions, whose weights (1-4 MB)
    do not fit in half of L2 and whose rows share cache sets: the rule blocks the reduction rather than
    re-read the weights once per tile of rows (its loop nests pinned in test_schedules_golden.py)."""
    k, n = draw(st.sampled_from([1024, 2048])), draw(st.sampled_from([256, 512]))
    kind = draw(st.sampled_from(["matmul", "batch matmul", "conv"]))
    if kind == "conv":
        data, weight = te.placeholder((1, 14, 14, k), name="data"), te.placeholder((1, 1, k, 256), name="weight")
        return [data, weight], topi.nn.conv2d_nhwc(data, weight, 1, 0, 1)
    if kind == "batch matmul":
        a, w = te.placeholder((2, 128, k), name="a"), te.placeholder((2, k, n), name="w")
        out, bias = epilogue(topi.nn.batch_matmul(a, w, transpose_b=False))
    else:
        a, w = te.placeholder((128, k), name="a"), te.placeholder((k, n), name="w")
        out, bias = epilogue(topi.matmul(a, w))
    return [a, w, bias], out


def matmul_of_prime_sizes(draw):
    """A (batched) matmul whose rows or columns have no good tile (197 tokens, as ViT's): the rule pads
    them to whole tiles and drops the padding."""
    m, n = draw(st.sampled_from([(197, 197), (197, 64), (37, 197), (16, 131)]))
    k, b = draw(st.sampled_from([16, 64])), draw(st.integers(1, 2))
    a, w = te.placeholder((b, m, k), name="a"), te.placeholder((b, k, n), name="w")
    out = topi.multiply(topi.nn.batch_matmul(a, w, transpose_b=False), te.const(0.125, "float32"))
    return [a, w], out


def pool(draw, kind: str):
    n, size, channels = draw(st.integers(1, 2)), draw(st.integers(4, 12)), draw(st.sampled_from([3, 16, 32, 40]))
    data = te.placeholder((n, size, size, channels), name="data")
    if kind == "global":
        return [data], topi.nn.adaptive_pool(data, (1, 1), "avg", layout="NHWC")
    k, pad = draw(st.sampled_from([2, 3])), draw(st.integers(0, 1))  # ResNet's max pool: 3x3, padded by 1
    stride = draw(st.sampled_from([1, 2]))  # Inception's average pools: 3x3, stride 1, padded by 1
    return [data], topi.nn.pool2d(data, (k, k), (stride, stride), (1, 1), (pad,) * 4, kind, layout="NHWC")


def rows(draw, kind: str):
    """Rows summed in vector accumulators (16, 40, 128, 1024 columns) or one scalar (8, 197); 80 x 1024
    is long enough to run its rows in parallel. A norm whose output is transposed reads every row
    for each output row."""
    shape = (draw(st.sampled_from([1, 3, 80])), draw(st.sampled_from([8, 16, 40, 128, 197, 1024])))
    data = te.placeholder(shape, name="data")
    weight = te.placeholder(shape[-1:], name="weight")
    if kind == "softmax":
        return [data], topi.nn.softmax(data)
    if kind == "layer_norm":
        return [data, weight], topi.nn.layer_norm(data, weight, weight, [1])
    if kind == "transposed_layer_norm":
        return [data, weight], topi.transpose(topi.nn.layer_norm(data, weight, weight, [1]))
    return [data, weight], topi.nn.rms_norm(data, weight, [1])


def injective(draw, kind: str):
    shape = tuple(draw(st.lists(st.sampled_from([1, 3, 8, 16, 33]), min_size=2, max_size=4)))
    data = te.placeholder(shape, name="data")
    if kind == "transpose":
        return [data], topi.transpose(data)
    return [data], topi.nn.relu(topi.multiply(data, te.const(2.0, "float32")))


def unit_reduction(draw):
    """A reduction over unit axes only, then an epilogue: normalized, it looks injective but keeps its
    init (a Linear(1, n) with bias, a sum over an axis of one, a 1x1 depthwise convolution)."""
    kind, n = draw(st.sampled_from(["matmul", "sum", "depthwise"])), draw(st.sampled_from([8, 16, 33]))
    if kind == "matmul":
        a, w = te.placeholder((draw(st.integers(1, 4)), 1), name="a"), te.placeholder((1, n), name="w")
        out, bias = epilogue(topi.matmul(a, w))
        return [a, w, bias], out
    if kind == "sum":
        data = te.placeholder((draw(st.integers(1, 4)), 1, n), name="data")
        out, bias = epilogue(topi.sum(data, axis=1))
        return [data, bias], out
    data, weight = te.placeholder((1, 4, 4, n), name="data"), te.placeholder((1, 1, 1, n), name="weight")
    out, bias = epilogue(topi.nn.group_conv2d_nhwc(data, weight, 1, 0, 1, n))
    return [data, weight, bias], out


CONV = {"Conv2d", "Matmul"}  # a 1x1 convolution is a matmul
KERNELS = {  # kernel class -> (its TE, the rules that may claim it; None: any but the fallback)
    "conv2d NHWC": (lambda d: conv(d, "NHWC", "plain"), CONV),
    "conv2d NCHW": (lambda d: conv(d, "NCHW", "plain"), None),  # strided NCHW reads: no vector axis
    # the input channel moves with the output channel's group: a broadcast within each group (ResNeXt, RegNet)
    "grouped conv2d NHWC": (lambda d: conv(d, "NHWC", "grouped"), CONV),
    "depthwise conv2d NHWC": (lambda d: conv(d, "NHWC", "depthwise"), CONV),
    "depthwise conv2d NCHW": (lambda d: conv(d, "NCHW", "depthwise"), None),
    "matmul": (lambda d: matmul(d, False), {"Matmul"}),
    "batch matmul": (lambda d: matmul(d, True), {"Matmul"}),
    "matmul on rows in one cache set": (matmul_on_aliased_rows, {"Matmul"}),
    "matmul of prime sizes": (matmul_of_prime_sizes, {"Matmul"}),
    "matmul over weights larger than L2": (matmul_over_weights_larger_than_l2, {"Matmul"}),
    "max pool": (lambda d: pool(d, "max"), {"Pool"}),
    "average pool": (lambda d: pool(d, "avg"), {"Pool"}),
    "global average pool": (lambda d: pool(d, "global"), {"Pool"}),
    "softmax": (lambda d: rows(d, "softmax"), {"RowReduction"}),
    "layer norm": (lambda d: rows(d, "layer_norm"), {"RowReduction"}),
    "rms norm": (lambda d: rows(d, "rms_norm"), {"RowReduction"}),
    "transposed layer norm": (lambda d: rows(d, "transposed_layer_norm"), {"RowReduction"}),
    "elementwise": (lambda d: injective(d, "elementwise"), {"Injective"}),
    "transpose": (lambda d: injective(d, "transpose"), {"Injective"}),
    "reduction over unit axes": (unit_reduction, None),
}


@tvm.instrument.pass_instrument
class NoAccessOutOfBounds:
    """Fails a build whose loops, as TVM has simplified them, read or write outside a buffer. A padded
    read clamped inside a ``Select`` lost its clamp to the simplifier (which assumes the condition there)
    and read up to a row before the input: a segfault where that memory was not mapped. TVM's checker
    does not see an ``if_then_else``'s guard, so a kernel with one (a padding block of its own) is left
    to the equality check."""

    def run_after_pass(self, mod, info):
        if info.name == "s_tir.LowerOpaqueBlock" and "if_then_else" not in mod.script():
            OOBChecker()(mod)


def run(func, t, arrays):
    with tvm.transform.PassContext(instruments=[NoAccessOutOfBounds()]):
        lib = tvm.tirx.build(tvm.IRModule({"main": func}), target=t)
    device = tvm.cpu()
    args = [tvm.runtime.tensor(a, device) for a in arrays]
    lib["main"](*args)
    return args[-1].numpy()


WEIGHTS = ("weight", "w", "bias")  # the tensors a model would pass as weights


@pytest.mark.parametrize("kernel", list(KERNELS))
@settings(max_examples=examples(3), deadline=None)
@given(data=st.data(), threads=st.sampled_from([1, 2]), marked=st.booleans())
def test_each_rule_claims_its_kernels_and_computes_what_the_unscheduled_kernel_does(kernel, data, threads, marked):
    """``marked``: the weights marked as such, so a schedule may read them packed (given packed here, as
    the runtime uploads them)."""
    make, expected = KERNELS[kernel]
    tensors, out = make(data.draw)
    func = te.create_prim_func([*tensors, out]).with_attr("global_symbol", "main")
    if marked:
        func = func.with_attr(WEIGHT_PARAMS_ATTR, [i for i, x in enumerate(tensors) if x.op.name in WEIGHTS])
    t = target(threads)
    scheduled, rule = apply_rules(func, t, rules_for(t))
    assert rule != UNSCHEDULED
    if expected:
        assert rule in expected
    assert_computes_as_unscheduled(func, scheduled, tensors, out, t)
    if rule == "RowReduction":  # the contraction rules pad to whole tiles on purpose
        assert_each_block_computed_once_per_element(scheduled)


def assert_each_block_computed_once_per_element(func) -> None:
    """Every block's loops cover its domain once: a block computed inside a consumer's loop that
    needs more than its share (each output row reading every row) would be computed again per
    iteration, right but many times slower."""
    sch = s_tir.Schedule(func)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        stmt = sch.get(block)
        domain = math.prod(int(iv.dom.extent) for iv in stmt.iter_vars)
        iterations = math.prod(int(sch.get(loop).extent) for loop in sch.get_loops(block))
        assert iterations == domain, f"{stmt.name_hint}: {iterations} iterations over a domain of {domain}"


def assert_computes_as_unscheduled(func, scheduled, tensors: list, out: te.Tensor, t) -> None:
    """``scheduled`` computes what ``func`` does (relative 1e-5) on random inputs, its weights given packed
    as the runtime uploads them, and packs no tensor ``func`` does not mark as a weight."""
    marked = func.attrs.get(WEIGHT_PARAMS_ATTR) if func.attrs is not None else None
    weights = [i for i, x in enumerate(tensors) if x.op.name in WEIGHTS]
    packed = packed_params(func, scheduled)
    assert set(packed) <= (set(weights) if marked else set())
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal([int(d) for d in x.shape]).astype("float32") for x in tensors]
    arrays.append(np.zeros([int(d) for d in out.shape], "float32"))
    given_arrays = [pack_array(a, packed[i]) if i in packed else a for i, a in enumerate(arrays)]
    np.testing.assert_allclose(run(scheduled, t, given_arrays), run(func, t, arrays), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_norm_whose_output_is_transposed_is_not_computed_again_for_each_output_row(threads):
    """Computed a row of the output at a time, each output row (a column of the norm) would need every
    row's sums: the rule keeps such a kernel block by block."""
    data, weight = te.placeholder((3, 20), name="data"), te.placeholder((20,), name="weight")
    out = topi.transpose(topi.nn.layer_norm(data, weight, weight, [1]))
    func = te.create_prim_func([data, weight, out]).with_attr("global_symbol", "main")
    scheduled, rule = apply_rules(func, target(threads), rules_for(target(threads)))
    assert rule == "RowReduction"
    assert_each_block_computed_once_per_element(scheduled)


def test_one_thread_devices_get_no_parallel_loop_and_several_threads_do():
    data, weight = te.placeholder((1, 28, 28, 64), name="data"), te.placeholder((3, 3, 64, 64), name="weight")
    out = topi.nn.conv2d_nhwc(data, weight, 1, 1, 1)
    func = te.create_prim_func([data, weight, out]).with_attr("global_symbol", "main")
    one, _ = apply_rules(func, target(1), rules_for(target(1)))
    two, _ = apply_rules(func, target(2), rules_for(target(2)))
    assert "T.parallel" not in one.script() and "T.vectorized" in one.script()
    assert "T.parallel" in two.script()


@pytest.mark.parametrize(("rows", "unrolled"), [(768, True), (50257, False), (8 * (MAX_UNROLLED_VECTORS + 1), False)])
def test_a_long_row_keeps_its_loop_over_vectors(rows, unrolled):
    """A transpose of GPT-2's 50257 x 768 embedding, unrolled 50257 times, kept LLVM busy for minutes."""
    weight = te.placeholder((rows, 4), name="weight")
    func = te.create_prim_func([weight, topi.transpose(weight)]).with_attr("global_symbol", "main")
    scheduled, rule = apply_rules(func, target(1), rules_for(target(1)))
    assert rule == "Injective" and ("T.unroll" in scheduled.script()) == unrolled


@pytest.mark.parametrize(
    ("triple", "mcpu", "bits", "registers"),
    [
        ("x86_64-linux-gnu", "haswell", 256, 16),
        ("x86_64-linux-gnu", "znver3", 256, 16),
        ("x86_64-linux-gnu", "skylake-avx512", 512, 32),
        ("x86_64-linux-gnu", "znver4", 512, 32),
        ("x86_64-linux-gnu", "x86-64", 128, 16),
        ("aarch64-linux-gnu", "cortex-a72", 128, 32),
        ("arm64-apple-macos", "apple-m1", 128, 32),
    ],
)
def test_vector_registers_follow_the_cpus_features(triple, mcpu, bits, registers):
    facts = CpuFacts.of(tvm.target.Target({"kind": "llvm", "mtriple": triple, "mcpu": mcpu}))
    assert (facts.vector_bits, facts.registers) == (bits, registers)


AVX2 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 1}


def register_tile(func, target: dict, block: str) -> tuple[str, list]:
    """What schedules ``func`` on ``target``, and the loops of its register tile, innermost first (the
    unrolled and vectorized loops around ``block``)."""
    target = tvm.target.Target(target)
    scheduled, rule = apply_rules(func, target, rules_for(target))
    sch = tvm.s_tir.Schedule(scheduled)
    tile = []
    for loop in reversed([sch.get(loop) for loop in sch.get_loops(sch.get_sblock(block))]):
        if loop.kind not in (tvm.tirx.ForKind.UNROLLED, tvm.tirx.ForKind.VECTORIZED):
            break
        tile.append(loop)
    return rule, tile


def vectorized_and_accumulators(tile: list) -> tuple[list[int], int]:
    vectorized = [int(loop.extent) for loop in tile if loop.kind == tvm.tirx.ForKind.VECTORIZED]
    return vectorized, int(np.prod([int(loop.extent) for loop in tile])) // vectorized[-1]


@pytest.mark.parametrize("size, channels", [(16, 64), (8, 128)])  # weights in half of a 1 MB L2, and beyond it
def test_an_avx2_convolutions_register_tile_fits_its_sixteen_registers(size, channels):
    """Tiles sized for AVX-512 (16 lanes, 32 registers) spill on an AVX2 CPU: every vector is 8 lanes, the
    accumulators with the loaded vectors leave ``SPARE_REGISTERS``, and a tile is two vectors wide (one
    vector by 8 positions, which the absolute re-read count picked beyond L2, ran 1.5-2x slower)."""
    data = te.placeholder((1, size, size, channels), name="data")
    weight = te.placeholder((3, 3, channels, channels), name="weight")
    out = topi.nn.relu(topi.nn.conv2d_nhwc(data, weight, 1, 1, 1))
    func = te.create_prim_func([data, weight, out]).with_attr("global_symbol", "main")
    rule, tile = register_tile(func, AVX2, "conv2d_nhwc_update")
    vectorized, accumulators = vectorized_and_accumulators(tile)
    vectors = int(tile[1].extent)  # the unrolled loop of the tile's vectors, inside its positions
    assert rule == "Conv2d" and vectorized == [8] and vectors == 2
    assert 8 <= accumulators <= 16 - SPARE_REGISTERS - vectors


def test_a_tile_keeps_enough_accumulators_to_hide_the_fma_latency():
    """A 1x1 convolution over a 7x7 image into 2048 channels (ResNet-50's last stage, 4 MB of weights):
    the loads alone preferred 4 vectors x 1 position, whose 4 accumulators each wait on the previous
    multiply-add; 1 vector x 7 positions ran 1.75x faster on a Zen 3."""
    data = te.placeholder((1, 7, 7, 512), name="data")
    weight = te.placeholder((1, 1, 512, 2048), name="weight")
    out = topi.nn.conv2d_nhwc(data, weight, 1, 0, 1)
    func = te.create_prim_func([data, weight, out]).with_attr("global_symbol", "main")
    vectorized, accumulators = vectorized_and_accumulators(register_tile(func, AVX2, "conv2d_nhwc_update")[1])
    assert vectorized == [8] and accumulators >= FMA_IN_FLIGHT - 1


def product_tile(rows: int, inner: int, columns: int) -> tuple[int, int]:
    """The AVX2 register tile of a ``rows x inner -> columns`` product with bias (a transformer's
    linear layer): its vectors and its rows."""
    a, w = te.placeholder((rows, inner), name="a"), te.placeholder((inner, columns), name="w")
    bias = te.placeholder((columns,), name="bias")
    out = topi.add(topi.matmul(a, w), bias)
    func = te.create_prim_func([a, w, bias, out]).with_attr("global_symbol", "main")
    vectorized, accumulators = vectorized_and_accumulators(register_tile(func, AVX2, "T_matmul_update")[1])
    tiling = choose_tiling(find_contraction(func), CpuFacts.of(tvm.target.Target(AVX2)))
    vectors = tiling.vector_tile // tiling.width
    assert vectorized == [8] and accumulators == vectors * math.prod(tiling.tiles.values())
    return vectors, accumulators // vectors


@pytest.mark.parametrize(
    "rows, inner, columns, tile",
    [
        (49, 768, 3072, (1, 7)),  # ConvNeXt-T's last stage: 4 x 1 (4 accumulators) ran 1.5x slower
        (200, 768, 3072, (2, 5)),  # ViT-B/16's MLP (197 tokens padded to 200): 4 x 2 ran 1.15x slower
        (128, 768, 3072, (2, 4)),  # BERT-base's and GPT-2's MLP: 4 x 2 ran 1.15x slower
        (128, 512, 512, (2, 4)),  # T5-small's projections: 1 x 8 (9 loads per 8 multiply-adds) ran 1.9x slower
    ],
)
def test_a_product_into_many_columns_is_tiled_for_its_loads_not_its_count_of_vector_tiles(rows, inner, columns, tile):
    """Where a tile's weights are re-read from L2 or beyond, a broadcast counts as two loads and the
    count of vector tiles no longer weighs on the score: that count, which grows with the columns,
    took the products into 3072 columns to 4 vectors wide, fewer positions or fewer accumulators."""
    assert product_tile(rows, inner, columns) == tile


@pytest.mark.parametrize("channels, window", [(16, 1), (3, 3)])  # MobileNetV2's expansion and its stem
def test_a_short_reduction_with_broadcasts_loads_few_vectors_per_multiply_add(channels, window):
    """A short reduction that broadcasts its input (a 1x1 convolution over 16 channels, a 3x3 stem over 3)
    with weights in L2 is tiled for the fewest loads per multiply-add, two vectors wide (one vector by 8
    positions, which the absolute re-read count picked, ran 1.2-1.4x slower on a Zen 3); a depthwise
    window, whose every multiply-add loads its input vector, keeps that count."""
    data = te.placeholder((1, 32, 32, channels), name="data")
    weight = te.placeholder((window, window, channels, 96), name="weight")
    out = topi.nn.conv2d_nhwc(data, weight, 1, window // 2, 1)
    func = te.create_prim_func([data, weight, out]).with_attr("global_symbol", "main")
    tile = register_tile(func, AVX2, "conv2d_nhwc_update")[1]
    assert vectorized_and_accumulators(tile)[0] == [8] and int(tile[1].extent) == 2


def test_a_depthwise_window_keeps_its_tile_one_vector_wide():
    """A depthwise window reads its input as vectors: no broadcast to share, so the absolute re-read
    count keeps its tile one vector wide (two vectors by 2x2 positions ran 1.3x slower on a Zen 3)."""
    data = te.placeholder((1, 32, 32, 96), name="data")
    weight = te.placeholder((3, 3, 1, 96), name="weight")
    out = topi.nn.group_conv2d_nhwc(data, weight, 2, 1, 1, 96)
    func = te.create_prim_func([data, weight, out]).with_attr("global_symbol", "main")
    rule, tile = register_tile(func, AVX2, "group_conv2d_nhwc_update")
    # a tile two or more vectors wide has their loop just outside the lanes; here it is the positions'
    assert rule == "Conv2d" and vectorized_and_accumulators(tile)[0] == [8] and int(tile[1].extent) > MAX_VECTORS


def depthwise(size: int, channels: int, window: int, stride: int):
    """A depthwise convolution over a padded NHWC input with MobileNetV2's epilogue, marked weights."""
    data = te.placeholder((1, size, size, channels), name="data")
    weight = te.placeholder((window, window, 1, channels), name="weight")
    out = topi.clip(topi.nn.group_conv2d_nhwc(data, weight, stride, window // 2, 1, channels), 0.0, 6.0)
    return te.create_prim_func([data, weight, out]).with_attr(WEIGHT_PARAMS_ATTR, [1])


@pytest.mark.parametrize(
    "size, channels, window, stride, threads, apart",
    [
        (56, 144, 3, 1, 2, True),  # MobileNetV2's
        (56, 96, 7, 1, 2, True),  # ConvNeXt's
        (56, 96, 7, 1, 1, True),
        (56, 144, 3, 1, 1, False),  # on one thread a 3x3 window gained and lost alike from the copy
        (112, 96, 3, 2, 2, False),  # strided: its padded copy would be four times its output
        (7, 960, 3, 1, 2, False),  # too short to pay for the copy's parallel region
    ],
)
def test_a_long_depthwise_window_that_moves_one_element_per_position_reads_a_padded_copy(
    size, channels, window, stride, threads, apart
):
    """Read through a condition per multiply-add, 3x3 to 7x7 windows over 14x14 to 112x112 images ran
    1.5-4.5x slower than over a padded copy written first (in parallel on two threads) inside the kernel."""
    t = target(threads)
    scheduled, rule = apply_rules(depthwise(size, channels, window, stride), t, rules_for(t))
    sch = tvm.s_tir.Schedule(scheduled)
    assert rule == "Conv2d" and ("padded_read" not in scheduled.script()) == apart
    if apart:
        kinds = [sch.get(loop).kind for loop in sch.get_loops(sch.get_sblock("pad_temp"))]
        assert (tvm.tirx.ForKind.PARALLEL in kinds) == (threads > 1)


@settings(max_examples=examples(6), deadline=None)
@given(data=st.data(), threads=st.sampled_from([1, 2]))
def test_a_depthwise_window_with_its_padding_written_apart_computes_what_the_unscheduled_kernel_does(data, threads):
    """``PAD_APART_MIN_S`` lowered to nothing, so that small random windows take that path: their padding
    written apart where the window moves one element per position (a 3x3 one on two threads only), read through a
    condition where it strides."""
    tensors, out = conv(data.draw, "NHWC", "depthwise")
    func = te.create_prim_func([*tensors, out]).with_attr("global_symbol", "main").with_attr(WEIGHT_PARAMS_ATTR, [1, 2])
    strided = int(out.shape[1]) < int(tensors[0].shape[1])
    window = int(tensors[1].shape[0])
    apart = not strided and (threads > 1 or window * window >= tiling.SERIAL_PAD_APART_MIN_TAPS)
    t = target(threads)
    with mock.patch.object(tiling, "PAD_APART_MIN_S", 0.0):
        scheduled, rule = apply_rules(func, t, rules_for(t))
    assert rule == "Conv2d" and ("padded_read" not in scheduled.script()) == apart
    assert_computes_as_unscheduled(func, scheduled, tensors, out, t)


@pytest.mark.parametrize("window, stride, channels_inside", [(3, 1, True), (5, 1, True), (7, 1, False), (3, 2, False)])
def test_a_short_depthwise_window_takes_its_channel_tiles_inside_its_positions(window, stride, channels_inside):
    """Consecutive iterations of the parallel loop move along the channels where a 3x3 or 5x5 window
    moves one element per position (each line of the input then serves all its channels at once: 0.58x
    the time over 112x112x32), along the positions for a 7x7 window (whose rows of one tile of channels
    stay in L1: 1.8x slower the other way) or a strided one."""
    scheduled, _ = apply_rules(depthwise(56 * stride, 64, window, stride), target(2), rules_for(target(2)))
    sch = tvm.s_tir.Schedule(scheduled)
    block = sch.get_sblock("group_conv2d_nhwc_update")
    loops = [sch.get(loop) for loop in sch.get_loops(block)]
    assert loops[0].kind == tvm.tirx.ForKind.PARALLEL
    realize = loops[-1].body  # the block's bindings to the loops
    (channel,) = [
        value
        for var, value in zip(realize.block.iter_vars, realize.iter_values, strict=True)
        if int(var.dom.extent) == 64
    ]
    analyzer = tvm.sym.Analyzer()
    for index, loop in enumerate(loops):
        analyzer.bind(loop.loop_var, tvm.tirx.IntImm(loop.loop_var.ty, 1 if index == 0 else 0))
    assert int(analyzer.simplify(channel)) == (8 if channels_inside else 0)


def test_a_parallel_register_tile_allocates_nothing_per_iteration():
    """The accumulators of a tile inside a parallel loop are a stack array: a "local" buffer there was
    taken from TVM's workspace pool and given back on every iteration (MobileNetV2's 1x1 convolution over
    16 channels, 32x32, ran 2.5x slower per thread than its serial build)."""
    data, weight = te.placeholder((1, 32, 32, 16), name="data"), te.placeholder((1, 1, 16, 96), name="weight")
    out = topi.clip(topi.nn.conv2d_nhwc(data, weight, 1, 0, 1), 0.0, 6.0)
    func = te.create_prim_func([data, weight, out]).with_attr("global_symbol", "main")
    scheduled, _ = apply_rules(func, target(2), rules_for(target(2)))
    llvm_ir = tvm.compile(tvm.IRModule({"main": scheduled}), target=target(2)).mod.inspect_source("ll")
    body = llvm_ir.split("@__tvm_parallel_lambda(", 1)[1].split("\ndefine ", 1)[0]
    assert "TVMBackendAllocWorkspace" not in body


def test_a_cpu_of_this_machine_is_built_for_its_cpu_and_threads_another_as_written():
    here = get_platform("cpu2").devices[0]
    built = device_target(here)
    assert built.attrs["mcpu"] == tvm.target.codegen.llvm_get_system_cpu()
    assert int(built.attrs["num-cores"]) == 1
    elsewhere = Device("far", {"kind": "llvm"}, "cpu:0", num_threads=20, measure=False)
    assert "mcpu" not in device_target(elsewhere).attrs and int(device_target(elsewhere).attrs["num-cores"]) == 20
    named = Device("skx", {"kind": "llvm", "mcpu": "skylake-avx512"}, "cpu:0")
    assert device_target(named).attrs["mcpu"] == "skylake-avx512"
    gpu = Device("gpu", {"kind": "cuda", "arch": "sm_90"}, "cuda:0")
    assert device_target(gpu).kind.name == "cuda"


# Kernels no class rule schedules yet, and why (the fallback still parallelizes and vectorizes them).
FALLBACK_ALLOWED: dict[str, str] = {}


@pytest.mark.parametrize("name", zoo_names())
def test_every_zoo_kernel_gets_a_class_rule(name):
    extraction = load_model(name, SMALL_OPTIONS[name]).extraction
    funcs = {f: extraction.mod[f] for f in set(extraction.kernel_func.values())}
    names = schedule_names(schedule_module(tvm.IRModule(funcs), target(2)))
    missing = {f: rule for f, rule in names.items() if rule in ("Fallback", UNSCHEDULED) and f not in FALLBACK_ALLOWED}
    assert not missing, missing


def test_a_rule_that_raises_fails_the_scheduling_with_its_error_not_a_fallback(monkeypatch):
    def broken(self, func, target, tunable):
        raise RuntimeError("a bug in the rule")

    monkeypatch.setattr(Conv2d, "apply", broken)
    data, weight = te.placeholder((1, 8, 8, 16), name="data"), te.placeholder((3, 3, 16, 16), name="weight")
    func = te.create_prim_func([data, weight, topi.nn.conv2d_nhwc(data, weight, 1, 1, 1)])
    with pytest.raises(RuntimeError, match="a bug in the rule") as raised:
        schedule_module(tvm.IRModule({"convolution": func}), target(2))
    assert raised.value.__notes__ == ["raised by the Conv2d schedule rule on convolution"]


def test_dlights_gemv_declines_where_tvm_asserts_a_depthwise_convolution_over_a_1x1_image():
    """TVM 0.27's GEMV analysis asserts on it (no spatial axis that some buffer does not share):
    MobileNetV2's last depthwise convolutions, which on a GPU the Reduction rule then takes."""
    data, weight = te.placeholder((1, 1, 1, 64), name="data"), te.placeholder((3, 3, 1, 64), name="weight")
    func = te.create_prim_func([data, weight, topi.nn.group_conv2d_nhwc(data, weight, 1, 1, 1, 64)])
    gpu = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    for built_for, tvms, ours in ((target(2), dlight.cpu.GEMV, GEMV), (gpu, dlight.gpu.GEMV, GpuGEMV)):
        with built_for, pytest.raises(AssertionError):
            tvms().apply(func, built_for, False)
        with built_for:
            assert ours().apply(func, built_for, False) is None
    assert apply_rules(func, gpu, rules_for(gpu))[1] == "Reduction"


def package_copy(folder: Path) -> Path:
    """The schedules package's modules copied into ``folder``, to edit without touching the real ones."""
    for path in Path(apply.__file__).parent.glob("*.py"):
        shutil.copy(path, folder / path.name)
    return folder


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_the_rules_digest_changes_with_the_rules_code_not_with_comments_docstrings_or_other_modules(tmp_path):
    copy = package_copy(tmp_path)
    assert schedules_digest(copy) == rules_digest()
    edit(copy / "tiling.py", "SPARE_REGISTERS = 2  # besides", "SPARE_REGISTERS = 2  # over and above")
    edit(copy / "rules.py", '"""CPU schedule rules', '"""The CPU schedule rules')
    edit(copy / "apply.py", '"""PrimFunc name -> what scheduled it', '"""PrimFunc name -> the rule that scheduled it')
    edit(copy / "analysis.py", "        return runs\n", "        # the longest run found\n        return runs\n")
    edit(copy / "database.py", "import hashlib\n", "import hashlib\nimport json\n")  # applies tuning records
    assert schedules_digest(copy) == rules_digest()
    edit(copy / "tiling.py", "SPARE_REGISTERS = 2", "SPARE_REGISTERS = 3")
    assert schedules_digest(copy) != rules_digest()
