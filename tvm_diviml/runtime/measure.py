"""What a run reports, measured the same way everywhere: time per call or per inference of a stream
(after a warm-up). Outputs are compared with a reference in ``tolerances.compare_outputs``."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


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
