"""What a run reports, measured the same way everywhere: time per call or per inference of a stream
(after a warm-up), and copies between devices (a link's latency and bandwidth). Outputs are compared
with a reference in ``tolerances.compare_outputs``."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from ..cost.fit import LinkFit, fit_link
from ..platform import Device

LINK_SIZES = (4 << 10, 256 << 10, 4 << 20, 32 << 20)  # the copies a link's latency and bandwidth are fitted to


def time_calls(
    call: Callable[[list], object], inputs: list, repeats: int, min_seconds: float = 0.0, most: int = 2000
) -> list[float]:
    """Seconds per ``call(inputs)``, after one warm-up call: ``repeats`` calls, more until they took
    ``min_seconds`` (at most ``most``), so a model of microseconds is timed as often as it takes for
    its median to settle."""
    call(inputs)
    samples: list[float] = []
    while len(samples) < repeats or (sum(samples) < min_seconds and len(samples) < most):
        began = time.perf_counter()
        call(inputs)
        samples.append(time.perf_counter() - began)
    return samples


def time_stream(runner, inputs: list[list], in_flight: int, rounds: int = 3) -> float:
    """Seconds per inference over ``runner.stream`` in steady state (after a warm-up pass of
    ``in_flight`` inputs): from the first output to the last, over the outputs between, the median of
    ``rounds`` streams. The time to fill the devices is the first inference's latency, not the
    stream's period (with 16 inputs on a 2-stage pipeline it added 6% to the period measured from
    the start); one stream's period strays by 7% here, the median of three by less."""
    if len(inputs) < 2:
        raise ValueError("a stream's period needs two inputs or more")
    for _ in runner.stream(inputs[:in_flight], in_flight=in_flight):
        pass
    periods = []
    for _ in range(rounds):  # the first and last arrivals only: a stream of 1e8 inputs keeps two numbers
        first = last = None
        for _ in runner.stream(inputs, in_flight=in_flight):
            last = time.perf_counter()
            first = first if first is not None else last
        periods.append((last - first) / (len(inputs) - 1))
    return statistics.median(periods)


def copy_seconds(source, destination, repeats: int = 5) -> float:
    """Median seconds of ``source.copyto(destination)`` (TVM tensors), after one warm-up copy."""
    samples = []
    for _ in range(repeats + 1):
        began = time.perf_counter()
        source.copyto(destination)
        destination.device.sync()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples[1:])


def time_link(src: Device, dst: Device, sizes=LINK_SIZES, repeats: int = 5) -> LinkFit:
    """Copy tensors of several sizes from ``src`` to ``dst`` and fit latency + bytes / bandwidth."""
    import tvm

    source, target = tvm.device(src.kind, src.index), tvm.device(dst.kind, dst.index)
    seconds = [
        copy_seconds(
            tvm.runtime.empty((nbytes // 4,), "float32", source),
            tvm.runtime.empty((nbytes // 4,), "float32", target),
            repeats,
        )
        for nbytes in sizes
    ]
    return fit_link(np.asarray(sizes, dtype=float), np.asarray(seconds))
