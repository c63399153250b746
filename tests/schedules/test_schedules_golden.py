"""The default CPU schedules' structure, pinned: a few representative kernels scheduled for a fixed
target (AMD Zen 4: AVX-512, 32 vector registers; two threads) must keep the rule and, per block, the
loop nest they had: each loop's kind and extent, outermost first. A change to a rule's tiling, its
vector width, what it unrolls or makes parallel fails here, so that it is made on purpose (and the
expectation updated with it), not in passing. Whether the schedules compute the right values is
``test_schedules.py``'s question."""

from __future__ import annotations

import pytest
import tvm
from tvm import s_tir, te, tirx, topi

from tvm_diviml.schedules.apply import apply_rules, rules_for

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
LOOP_KINDS = {
    tirx.ForKind.SERIAL: "",
    tirx.ForKind.PARALLEL: "p",
    tirx.ForKind.VECTORIZED: "v",
    tirx.ForKind.UNROLLED: "u",
}


def conv2d_nchw():
    data, weight = te.placeholder((1, 16, 14, 14), name="data"), te.placeholder((32, 16, 3, 3), name="weight")
    return [data, weight], topi.nn.relu(topi.nn.conv2d_nchw(data, weight, 1, 1, 1))


def conv2d_nhwc():
    data, weight = te.placeholder((1, 28, 28, 32), name="data"), te.placeholder((3, 3, 32, 64), name="weight")
    return [data, weight], topi.nn.relu(topi.nn.conv2d_nhwc(data, weight, 1, 1, 1))


def dense():
    a, w = te.placeholder((8, 64), name="a"), te.placeholder((64, 128), name="w")
    bias = te.placeholder((128,), name="bias")
    return [a, w, bias], topi.nn.relu(topi.add(topi.matmul(a, w), bias))


def pointwise_conv_1024_channels():
    """A 1x1 convolution over 1024 channels (ResNet-50's third stage): the rows of the register tile's
    broadcasts lie 4 KB apart, in one set of the L1 cache, so the rule packs them; its weights (1 MB)
    are more than half of L2, so it blocks the reduction too (as ``feed_forward_output_projection``)."""
    data, weight = te.placeholder((1, 14, 14, 1024), name="data"), te.placeholder((1, 1, 1024, 256), name="weight")
    return [data, weight], topi.nn.relu(topi.nn.conv2d_nhwc(data, weight, 1, 0, 1))


def feed_forward_output_projection():
    """T5-small's feed-forward output projection (128 tokens, 2048 -> 512): 4 MB of weights, more than half
    of L2, and the tile's broadcasts from rows 8 KB apart, so the rule blocks the reduction in runs of
    256: two groups of vector tiles (one per thread), the runs, the tiles of rows (each run of the
    rows packed), the group's vector tiles; the epilogue once the reduction is done."""
    a, w = te.placeholder((128, 2048), name="a"), te.placeholder((2048, 512), name="w")
    bias = te.placeholder((512,), name="bias")
    return [a, w, bias], topi.nn.relu(topi.add(topi.matmul(a, w), bias))


def depthwise_conv_padded():
    """A 3x3 depthwise convolution with padding (MobileNet-V2's 56x56x144): its 9 taps are a short
    reduction, so the register tile stays on the stack (14 positions, 896 bytes of accumulators)."""
    data, weight = te.placeholder((1, 56, 56, 144), name="data"), te.placeholder((3, 3, 1, 144), name="weight")
    return [data, weight], topi.clip(topi.nn.group_conv2d_nhwc(data, weight, 1, 1, 1, 144), 0.0, 6.0)


def softmax():
    """Four rows of 128: too short a kernel to wake the second thread; each reduction summed into a
    vector of 16 lanes, then the lanes."""
    data = te.placeholder((4, 128), name="data")
    return [data], topi.nn.softmax(data)


def layer_norm():
    """ViT-B/16's layer norm (197 tokens of 768): rows in parallel, each row's sums in four vectors."""
    data, weight = te.placeholder((197, 768), name="data"), te.placeholder((768,), name="weight")
    return [data, weight], topi.nn.layer_norm(data, weight, weight, [1])


def elementwise():
    data = te.placeholder((64, 33, 64), name="data")
    return [data], topi.nn.relu(topi.multiply(data, te.const(2.0, "float32")))


# kernel -> (its TE, the rule that schedules it, each block's loops: p parallel, u unrolled,
# v vectorized, a bare extent serial; {key=value} an annotation)
GOLDEN = {
    "conv2d NCHW": (
        conv2d_nchw,
        "Conv2d",
        {
            "pad_temp": "16 16 v16",
            "conv2d_nchw_init": "14 7 2 u16 v2",
            "conv2d_nchw_update": "14 7 2 16 3 3 u16 v2",
            "compute": "14 7 2 16 1 v2",
        },
    ),
    "conv2d NHWC": (
        conv2d_nhwc,
        "Conv2d",
        {
            "pad_temp": "30 30 u2 v16",
            "conv2d_nhwc_init": "p112 u1 u14 u2 v16",  # 2 vectors x 14 positions: weights in L2
            "conv2d_nhwc_update": "p112 3 3 32 u1 u14 u2 v16",
            "compute": "p112 1 14 u2 v16",
        },
    ),
    "dense": (
        dense,
        "Matmul",
        {
            # 4 vectors x 4 rows (4 broadcasts, 4 vector loads per 16 multiply-adds; 2 x 8: 8 and 2), a
            # broadcast counting as two loads
            "T_matmul_init": "2 2 u4 u4 v16",
            "T_matmul_update": "2 2 64 u4 u4 v16",
            "compute": "2 2 4 u4 v16",
        },
    ),
    "pointwise conv2d over 1024 channels": (
        pointwise_conv_1024_channels,
        "Matmul",
        {
            "conv2d_nhwc_init": "p2 14 1 4 u1 u14 u2 v16",
            "data_global": "p2 4 14 1 14 256",  # the pack: a run of the tile's 14 rows, reduction first
            "conv2d_nhwc_update": "p2 4 14 1 4 256 u1 u14 u2 v16",
            "compute": "p2 14 14 8 v16",
        },
    ),
    "feed-forward output projection": (
        feed_forward_output_projection,
        "Matmul",
        {
            "T_matmul_init": "p2 16 8 u8 u2 v16",
            "a_global": "p2 8 16 8 256",
            "T_matmul_update": "p2 8 16 8 256 u8 u2 v16",
            "compute": "p2 128 16 v16",
        },
    ),
    "depthwise conv2d, padded": (
        depthwise_conv_padded,
        "Conv2d",
        {
            "group_conv2d_nhwc_init": "p2016 u1 u14 v16",
            "group_conv2d_nhwc_update": "p2016 3 3 u1 u14 v16",
            "compute": "p2016 1 14 v16",
        },
    ),
    "softmax": (
        softmax,
        "RowReduction",
        {
            "T_softmax_maxelem_rf_init": "4 v16",
            "T_softmax_maxelem_rf_update": "4 8 v16",
            "T_softmax_maxelem": "4 16",
            "T_softmax_exp": "4 u8 v16",
            "T_softmax_expsum_rf_init": "4 v16",
            "T_softmax_expsum_rf_update": "4 8 v16",
            "T_softmax_expsum": "4 16",
            "T_softmax_norm": "4 u8 v16",
        },
    ),
    "layer norm": (
        layer_norm,
        "RowReduction",
        {
            "data_sum_rf_init": "p197 v64",
            "data_sum_rf_update": "p197 12 v64",
            "data_sum": "p197 64",
            "data_mean": "p197",
            "data_var_sum_rf_init": "p197 v64",
            "data_var_sum_rf_update": "p197 12 v64",
            "data_var_sum": "p197 64",
            "T_layer_norm": "p197 u48 v16",
        },
    ),
    "elementwise": (elementwise, "Injective", {"compute": "p2112 u4 v16"}),
}


def loop_nests(func: tirx.PrimFunc) -> dict[str, str]:
    """Block name -> its loops from the root, in program order: kind letter, extent, annotations."""
    sch = s_tir.Schedule(func)
    nests = {}

    def describe(loop_rv) -> str:
        loop = sch.get(loop_rv)
        annotations = "".join(f"{{{key}={value}}}" for key, value in sorted(loop.annotations.items()))
        return f"{LOOP_KINDS[loop.kind]}{int(loop.extent)}{annotations}"

    def visit(parent) -> None:
        for block in sch.get_child_blocks(parent):
            nests[sch.get(block).name_hint] = " ".join(describe(loop) for loop in sch.get_loops(block))
            visit(block)

    visit(sch.get_sblock("root"))
    return nests


@pytest.mark.parametrize("kernel", list(GOLDEN))
def test_a_representative_kernel_keeps_its_rule_and_loop_nests(kernel):
    make, expected_rule, expected_nests = GOLDEN[kernel]
    tensors, out = make()
    func = te.create_prim_func([*tensors, out]).with_attr("global_symbol", "main")
    scheduled, rule = apply_rules(func, TARGET, rules_for(TARGET))
    assert rule == expected_rule
    assert list(loop_nests(scheduled).items()) == list(expected_nests.items())


def test_padding_folded_into_a_depthwise_convolution_is_a_select_not_a_branch():
    """Each tap reads the input under the padding's condition: as ``if_then_else`` LLVM branched
    around every read and stored each accumulator after each multiply-add."""
    tensors, out = depthwise_conv_padded()
    func = te.create_prim_func([*tensors, out]).with_attr("global_symbol", "main")
    script = apply_rules(func, TARGET, rules_for(TARGET))[0].script()
    assert "if_then_else" not in script
    assert "T.Select(1 <= v0 + v3" in script
    assert "T.min(v2," not in script  # the channel, one of the pad's own axes, is read unclamped


def test_padding_only_after_the_end_is_read_within_the_input():
    """Padded only after its end, a dimension's read index is the pad's own axis, which runs past
    the input; the select reads both sides, so that index is clamped too (an unclamped read there
    reads past the buffer, which equality tests cannot see)."""
    data, weight = te.placeholder((1, 14, 14, 32), name="data"), te.placeholder((3, 3, 1, 32), name="weight")
    out = topi.nn.group_conv2d_nhwc(data, weight, 1, (0, 0, 2, 2), 1, 32)
    func = te.create_prim_func([data, weight, out]).with_attr("global_symbol", "main")
    script = apply_rules(func, TARGET, rules_for(TARGET))[0].script()
    assert "data[0, T.max(T.min(v0 + v3, 13), 0), T.max(T.min(v1 + v4, 13), 0), v2]" in script
