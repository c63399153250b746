"""The register tile's broadcasts packed where their rows share a set of the L1 cache: which reads are
packed, and in which loop order, decided from the shapes alone (no timing)."""

from __future__ import annotations

import pytest
import tvm
from tvm import te, topi

from tests.schedules.test_schedules_golden import loop_nests
from tvm_diviml.passes.apply_plan import packed_params
from tvm_diviml.schedules.analysis import CpuFacts, find_contraction
from tvm_diviml.schedules.apply import apply_rules, rules_for
from tvm_diviml.schedules.tiling import WEIGHT_PARAMS_ATTR, choose_tiling, pack_pays, packable_read

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})


def pointwise_conv(size: int, channels: int, out_channels: int, stride: int = 1):
    data = te.placeholder((1, size, size, channels), name="data")
    weight = te.placeholder((1, 1, channels, out_channels), name="weight")
    out = topi.nn.relu(topi.nn.conv2d_nhwc(data, weight, stride, 0, 1))
    return te.create_prim_func([data, weight, out]).with_attr("global_symbol", "main")


def decision(func):
    contraction = find_contraction(func)
    tiling = choose_tiling(contraction, CpuFacts.of(TARGET))
    packed = packable_read(contraction, tiling)
    return packed, pack_pays(contraction, tiling)


def packed_buffers(func) -> list[str]:
    scheduled, _ = apply_rules(func, TARGET, rules_for(TARGET))
    return [name for name in ("data_global", "weight_global") if name in scheduled.script()]


@pytest.mark.parametrize(
    "size, channels, out_channels, aliased, pays",
    [
        (14, 1024, 256, True, True),  # rows 4 KB apart, 28 in one set; 1 MB of weights re-read 7 times
        (28, 1024, 128, True, True),  # rows 4 KB apart: 28 to a set of 8 ways; 512 KB of weights
        (28, 512, 256, False, True),  # rows 2 KB apart, weights in L2: a tile of 14 positions, 7 to a set
        (14, 2048, 1024, True, False),  # 8 MB of weights re-read per tile of positions: more than the rows
        (7, 2048, 512, False, False),  # 7 rows to a set, which holds them
        (14, 256, 256, False, True),  # rows 1 KB apart: 7 to a set
        (56, 64, 256, False, True),  # rows 256 bytes apart: 16 sets
    ],
)
def test_broadcast_rows_in_one_cache_set_are_packed_where_that_moves_no_more_bytes(
    size, channels, out_channels, aliased, pays
):
    func = pointwise_conv(size, channels, out_channels)
    assert decision(func) == ((0 if aliased else None), pays)
    assert packed_buffers(func) == (["data_global"] if aliased and pays else [])


def test_a_strided_read_is_packed_with_the_rows_it_skips():
    """ResNet-50's stage-3 downsampling 1x1 convolution: every other row of 512 channels, 4 KB apart (2 MB
    of weights, so the reduction is blocked too): each run of 256 channels of a tile of 14 output
    columns copies the 27 input columns they span."""
    func = pointwise_conv(28, 512, 1024, stride=2)
    assert decision(func) == (0, True)
    scheduled, _ = apply_rules(func, TARGET, rules_for(TARGET))
    assert loop_nests(scheduled)["data_global"] == "p2 2 14 1 27 256"


def test_a_windowed_input_is_not_packed():
    data, weight = te.placeholder((1, 14, 14, 1024), name="data"), te.placeholder((3, 3, 1024, 64), name="weight")
    out = topi.nn.conv2d_nhwc(data, weight, 1, 1, 1)
    func = te.create_prim_func([data, weight, out]).with_attr("global_symbol", "main")
    assert decision(func)[0] is None and packed_buffers(func) == []


def marked_matmul(weights: list[int]):
    """A linear layer with bias, as fusion leaves it, its parameters ``weights`` marked as weights."""
    a, w, bias = te.placeholder((49, 2048), name="a"), te.placeholder((2048, 512), name="w"), te.placeholder((512,))
    out = topi.nn.relu(topi.add(topi.matmul(a, w), bias))
    func = te.create_prim_func([a, w, bias, out]).with_attr("global_symbol", "main")
    return func.with_attr(WEIGHT_PARAMS_ATTR, weights) if weights else func


def test_a_weight_read_as_vectors_is_packed_in_blocks_of_the_tile_width():
    func = marked_matmul([0, 1, 2])
    tile = choose_tiling(find_contraction(func), CpuFacts.of(TARGET)).vector_tile
    scheduled, rule = apply_rules(func, TARGET, rules_for(TARGET))
    # the activation is read as broadcasts and the bias by the epilogue: only the weight is packed
    assert rule == "Matmul" and packed_params(func, scheduled) == {1: tile}
    assert [int(d) for d in scheduled.params[1].shape] == [512 // tile, 2048, tile]
    # each step of the reduction reads one row of the tile's block: its lanes contiguous
    assert f"w[v1 // {tile}, v2, v1 % {tile}]" in scheduled.script()


def test_unmarked_parameters_keep_their_layout():
    func = marked_matmul([])
    scheduled, _ = apply_rules(func, TARGET, rules_for(TARGET))
    assert packed_params(func, scheduled) == {}
