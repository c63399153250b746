"""A timed stream holds a few inputs however long it is: ``diviml run --inputs 100000000`` drew every
input before the first inference (``BuiltModel.sample_stream``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tvm_diviml.profiling import timing
from tvm_diviml.zoo import BuiltModel

HUGE = 10**8


@pytest.fixture
def draws(monkeypatch) -> list[int]:
    """The seeds of every ``sample_inputs`` call; a stream that draws 50 has materialised its inputs."""
    seeds: list[int] = []
    real = BuiltModel.sample_inputs

    def counted(self, seed: int = 0):
        seeds.append(seed)
        assert len(seeds) <= 50, "the stream's inputs were drawn up front"
        return real(self, seed)

    monkeypatch.setattr(BuiltModel, "sample_inputs", counted)
    return seeds


def tiny_model() -> BuiltModel:
    return BuiltModel(
        "tiny", None, "main", [("x", (2, 3), "float32"), ("ids", (4,), "int64")], input_ranges={"ids": (0, 5)}
    )


def test_a_long_stream_cycles_through_a_few_distinct_inputs(draws):
    model = tiny_model()
    stream = model.sample_stream(HUGE, distinct=3)
    assert len(stream) == HUGE and draws == [0, 1, 2]
    taken = [inputs for inputs, _ in zip(stream, range(7), strict=False)]
    assert draws == [0, 1, 2] and len(stream[:4]) == 4
    for position, inputs in [*enumerate(taken), (HUGE - 1, stream[-1])]:
        for got, want in zip(inputs, model.sample_inputs(position % 3), strict=True):
            np.testing.assert_array_equal(got, want)
    assert len(model.sample_stream(2, distinct=8).pool) == 2  # never more than the stream reads
    with pytest.raises(IndexError):
        stream[HUGE]


def test_timing_a_stream_of_a_hundred_million_inputs_draws_only_those_in_flight(draws, monkeypatch):
    class Runner:
        busy_s = {"cpu0": 2.0, "cpu1": 1.0}

        def __init__(self, built, params):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def __call__(self, inputs):
            return [np.ones(2)]

    consumed = []

    def time_stream(runner, inputs, in_flight):
        consumed.extend(inputs[:in_flight])
        consumed.extend(item for item, _ in zip(inputs, range(3 * in_flight), strict=False))
        return 1e-3

    monkeypatch.setattr(timing, "ConcurrentRunner", Runner)
    monkeypatch.setattr(timing, "time_stream", time_stream)
    built = SimpleNamespace(placement=SimpleNamespace(devices=["cpu0", "cpu1"], kernel_devices=["cpu0", "cpu1"]))
    measured = timing.time_build(built, tiny_model(), "throughput", [np.ones(2)], repeats=1, stream_inputs=HUGE)
    assert measured.measured_s == 1e-3 and measured.in_flight == 4 and len(consumed) == 16
    assert len(draws) == 1 + 4  # the check's inputs, then one per input in flight
    assert measured.busy_s == {"cpu0": 2.0 / HUGE, "cpu1": 1.0 / HUGE}
