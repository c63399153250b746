"""Weights packed for the vector loads: the runtime's numpy packing puts every element where the
schedules' index map says, names round-trip, and a last axis that does not split is refused."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import examples
from tvm_diviml.runtime.packing import (
    PACKED,
    pack_array,
    packed_index_map,
    packed_name,
    packed_shape,
    packed_source,
    unpacked,
)


@settings(max_examples=examples(20), deadline=None)
@given(
    leading=st.lists(st.integers(1, 4), min_size=0, max_size=3),
    blocks=st.integers(1, 4),
    lanes=st.sampled_from([1, 2, 8, 16]),
)
def test_each_element_lands_where_the_index_map_puts_it(leading, blocks, lanes):
    shape = [*leading, blocks * lanes]
    array = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    packed = pack_array(array, lanes)
    assert list(packed.shape) == packed_shape(shape, lanes) and packed.flags["C_CONTIGUOUS"]
    to_packed = packed_index_map(lanes)
    for index in itertools.product(*(range(n) for n in shape)):
        assert packed[tuple(to_packed(*index))] == array[index]


def test_a_packed_name_says_what_it_is_made_from():
    name = packed_name("const", "a:b.weight", 32)
    assert packed_source(name) == ("const", "a:b.weight", 32)
    assert unpacked(PACKED, name) == ("const", "a:b.weight")
    assert unpacked("weight", "w") == ("weight", "w")


def test_a_last_axis_that_does_not_split_is_refused():
    with pytest.raises(ValueError, match="a last axis of 24 does not split in blocks of 16"):
        packed_shape([3, 24], 16)
    with pytest.raises(ValueError, match="does not split"):
        pack_array(np.zeros((3, 24), np.float32), 16)
