"""What a run reports, measured the same way everywhere: outputs against a reference, and time per
call or per inference of a stream (after a warm-up)."""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def compare_outputs(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[float, float]:
    """Max absolute difference, and that divided by the reference's largest magnitude."""
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} outputs, the reference has {len(want)}")
    abs_diff = max((float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0
                    for a, b in zip(got, want, strict=True)), default=0.0)
    scale = max((float(np.max(np.abs(b))) if b.size else 0.0 for b in want), default=0.0)
    return abs_diff, abs_diff / scale if scale > 0 else abs_diff


def time_calls(call: Callable[[list], object], inputs: list, repeats: int) -> list[float]:
    """Seconds per ``call(inputs)``, after one warm-up call."""
    call(inputs)
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        call(inputs)
        samples.append(time.perf_counter() - began)
    return samples


def time_stream(runner, inputs: list[list], in_flight: int) -> float:
    """Seconds per inference over ``runner.stream`` (after a warm-up pass of ``in_flight`` inputs)."""
    for _ in runner.stream(inputs[:in_flight], in_flight=in_flight):
        pass
    began = time.perf_counter()
    count = sum(1 for _ in runner.stream(inputs, in_flight=in_flight))
    return (time.perf_counter() - began) / count


def executor_handoff_s(repeats: int = 200, rounds: int = 5) -> float:
    """Seconds the concurrent executor adds when a segment's tensor is read on another device: the
    median of two no-op segments on two devices, less the same on one device (wake-up of the other
    worker thread; no copy); the median of ``rounds`` such differences, as one round varies 2x here."""
    import statistics

    from .executor import ConcurrentExecutor, SegmentCall

    def per_run(second_device: str) -> float:
        calls = [SegmentCall("a", "d0", ["input:x"], ["t"]), SegmentCall("b", second_device, ["t"], ["u"])]
        with ConcurrentExecutor(calls, ["u"], make_caller=lambda device: lambda name, args: [0],
                                move=lambda value, device: value) as executor:
            return statistics.median(time_calls(lambda _: executor.run({"input:x": 0}), [], repeats))

    return max(0.0, statistics.median(per_run("d1") - per_run("d0") for _ in range(rounds)))
