"""The executor's own costs on this machine: what a segment call, an inference and a hand-off between
worker threads cost (timed on no-op segments), and how much two CPU workers slow each other (the
co-run factor). The measured cost model charges them in every mode (docs/design.md, the executor model).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import threading
from collections.abc import Callable

import numpy as np
import tvm
from tvm import te

from ..cost.base import ExecutorOverheads
from ..runtime.concurrent import SWITCH_INTERVAL_S
from ..runtime.executor import ConcurrentExecutor, SegmentCall
from ..runtime.measure import time_calls
from ..runtime.vm import pin_thread, set_threads, usable_cores


def fit_executor_overheads(seconds_per_run: Callable[[int, int], float]) -> ExecutorOverheads:
    """The executor's overheads from ``seconds_per_run(segments, devices)``: one run of a chain of
    ``segments`` no-op segments placed alternately on ``devices`` devices. A chain of one segment is
    one inference's fixed cost plus one call; three more calls on the same device give the per-call
    cost; the same four alternating over two devices add three hand-offs. Noise never makes one negative."""
    one, four, alternating = seconds_per_run(1, 1), seconds_per_run(4, 1), seconds_per_run(4, 2)
    segment_s = max(0.0, (four - one) / 3)
    return ExecutorOverheads(
        run_s=max(0.0, one - segment_s), segment_s=segment_s, handoff_s=max(0.0, (alternating - four) / 3)
    )


def executor_overheads(repeats: int = 200, rounds: int = 5) -> ExecutorOverheads:
    """``fit_executor_overheads`` on the real executor (no-op segments, the runner's thread switch
    interval), each figure the median of ``rounds`` fits, as one round varies 2x here."""

    def seconds_per_run(segments: int, devices: int) -> float:
        calls = [
            SegmentCall(f"s{i}", f"d{i % devices}", ["input:x" if i == 0 else f"t{i - 1}"], [f"t{i}"])
            for i in range(segments)
        ]
        with ConcurrentExecutor(
            calls,
            [f"t{segments - 1}"],
            make_caller=lambda device: lambda name, args: [0],
            move=lambda value, device: value,
        ) as executor:
            return statistics.median(time_calls(lambda _: executor.run({"input:x": 0}), [], repeats))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL_S))
    try:
        fits = [fit_executor_overheads(seconds_per_run) for _ in range(rounds)]
    finally:
        sys.setswitchinterval(interval)
    return ExecutorOverheads(
        **{
            f.name: statistics.median(getattr(fit, f.name) for fit in fits)
            for f in dataclasses.fields(ExecutorOverheads)
            if f.name != "corun_factor"
        }
    )


def fit_corun_factor(alone: list[float], together: list[float]) -> float:
    """How many times as long a call takes beside a second worker: the ratio of the medians, never
    below 1 (noise can make the pair look faster, and co-running is never cheaper)."""
    return max(1.0, statistics.median(together) / statistics.median(alone))


def corun_factor(samples: int = 10, calls_per_sample: int = 8, rounds: int = 3) -> float:
    """``fit_corun_factor`` on this machine: a dense kernel that streams 4 MB of weights (so memory
    and arithmetic both count), timed by a worker pinned to one core, alone and while a second
    worker pinned to another core runs it too, as the executor pins two CPU devices' workers. 1.0
    where this process may use fewer than two cores. A sample is several calls (~16 ms here): two
    threads time-sliced on one core each finish a 2 ms call inside their slice, so single calls
    would hide the sharing that the segments of a plan feel. The median of ``rounds`` fits (one
    varies by ~8% here)."""
    cores = usable_cores()
    if len(cores) < 2:
        return 1.0
    n = 1024
    weights, rows = te.placeholder((n, n), name="w"), te.placeholder((4, n), name="x")
    k = te.reduce_axis((0, n), name="k")
    out = te.compute((4, n), lambda i, j: te.sum(rows[i, k] * weights[j, k], axis=k), name="y")
    kernel = tvm.compile(te.create_prim_func([weights, rows, out]), target="llvm")

    def on_core(core: int) -> Callable[[], object]:
        set_threads(1)
        pin_thread([core])
        rng = np.random.default_rng(core)
        args = [
            tvm.runtime.tensor(rng.random(shape, dtype=np.float32), tvm.cpu(0)) for shape in ((n, n), (4, n), (4, n))
        ]
        return lambda: kernel(*args)

    def timed(out: list[float]) -> None:
        call = on_core(cores[0])
        out.extend(time_calls(lambda _: [call() for _ in range(calls_per_sample)], [], samples))

    def partner(started: threading.Event, stop: threading.Event) -> None:
        call = on_core(cores[1])
        call()
        started.set()
        while not stop.is_set():
            call()

    def run(with_partner: bool) -> list[float]:
        timings: list[float] = []
        started, stop = threading.Event(), threading.Event()
        helper = threading.Thread(target=partner, args=(started, stop), daemon=True)
        if with_partner:
            helper.start()
            started.wait()
        worker = threading.Thread(target=timed, args=(timings,))
        worker.start()
        worker.join()
        stop.set()
        if with_partner:
            helper.join()
        return timings

    return statistics.median(fit_corun_factor(run(False), run(True)) for _ in range(rounds))
