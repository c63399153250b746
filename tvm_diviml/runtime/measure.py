"""What a run reports, measured the same way everywhere: outputs against a reference, and time per
call or per inference of a stream (after a warm-up)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np


def compare_outputs(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[float, float]:
    """Max absolute difference, and that divided by the reference's largest magnitude."""
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} outputs, the reference has {len(want)}")
    abs_diff = max(
        (float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0 for a, b in zip(got, want, strict=True)),
        default=0.0,
    )
    scale = max((float(np.max(np.abs(b))) if b.size else 0.0 for b in want), default=0.0)
    return abs_diff, abs_diff / scale if scale > 0 else abs_diff


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
    for _ in range(rounds):
        arrivals = [time.perf_counter() for _ in runner.stream(inputs, in_flight=in_flight)]
        periods.append((arrivals[-1] - arrivals[0]) / (len(arrivals) - 1))
    return statistics.median(periods)
