"""This machine's CPU peak, measured: the FLOP/s that its vector FMA units sustain, against which a
profile states each kernel class's achieved FLOP/s.

The kernel is the textbook peak loop, built with TVM for this machine's CPU target: per thread,
``CHAINS`` independent vector accumulators each updated ``acc = acc * a + b`` many times, with no
memory traffic in the loop (``a`` and ``b`` stay in registers), then written out so that LLVM keeps
them. Twelve chains hide the FMA latency (4-5 cycles) on two FMA pipes with room to spare, and fit
in the 16 or 32 vector registers. An FMA counts 2 FLOP per lane.
"""

from __future__ import annotations

import functools
import logging
import threading

import numpy as np
import tvm
from tvm.script import tirx as T

from ..errors import DivimlInputError
from ..platform import Device
from ..runtime.vm import set_threads
from ..schedules.analysis import CpuFacts
from ..schedules.target import device_target

log = logging.getLogger(__name__)

CHAINS = 12  # independent accumulators per thread
# FMAs per accumulator per call: about 2 ms a call. A call of 0.25 ms (1 << 18) measured two threads at the
# speed of one on a 2-core VM (103.6 against 103.7 GFLOP/s): waking the second thread took most of it
ITERATIONS = 1 << 20
PEAK_DTYPES = ("float32", "float64")
# The timed run's coefficients: a = 1 keeps the values exact (start + iterations * b), so the
# output checks against the closed form while the hardware still does full FMAs.
TIMED_COEFFICIENTS = (1.0, 0.5)


def measured_peak_flops_per_s(threads: int, dtype: str = "float32") -> float:
    """This machine's CPU peak on ``threads`` threads, in FLOP/s: the fastest of 30 short timings of
    the FMA-chain kernel (about 0.1 s, once per process for each ``threads`` and ``dtype``)."""
    if not isinstance(threads, int) or threads < 1:
        raise DivimlInputError(
            f"threads must be a whole number of at least 1, not {threads!r}", field="threads", hint="e.g. 1 or 2"
        )
    if dtype not in PEAK_DTYPES:
        raise DivimlInputError(
            f"no peak kernel for dtype {dtype!r}", field="dtype", hint=f"one of {', '.join(PEAK_DTYPES)}"
        )
    return _measured_peak(threads, dtype)


@functools.cache
def _measured_peak(threads: int, dtype: str) -> float:
    kernel = PeakKernel(threads, dtype, ITERATIONS)
    library = kernel.build()
    fastest_s = _in_own_pool(threads, lambda: _fastest_call_s(library, kernel))
    flops = kernel.flops / fastest_s
    log.info("measured CPU peak: %.1f GFLOP/s %s on %d thread(s)", flops / 1e9, dtype, threads)
    return flops


class PeakKernel:
    """The FMA-chain kernel for ``threads`` threads: its PrimFunc, build, and the output it must give."""

    def __init__(self, threads: int, dtype: str, iterations: int):
        self.threads, self.dtype, self.iterations = threads, dtype, iterations
        self.target = device_target(Device("peak", "llvm", "cpu:0", num_threads=threads))
        self.lanes = CpuFacts.of(self.target).lanes(dtype)

    @property
    def flops(self) -> int:
        return 2 * self.threads * CHAINS * self.lanes * self.iterations

    def build(self) -> tvm.runtime.Module:
        return tvm.tirx.build(tvm.IRModule({"main": self.prim_func()}), target=self.target)

    def prim_func(self) -> tvm.tirx.PrimFunc:
        threads, lanes, iterations, dtype = self.threads, self.lanes, self.iterations, self.dtype

        @T.prim_func
        def peak(coefficients: T.Buffer((2,), dtype), out: T.Buffer((threads, CHAINS, lanes), dtype)):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            for thread in T.parallel(threads):
                acc = T.decl_buffer((CHAINS, lanes), dtype, scope="local")
                for chain in T.unroll(CHAINS):
                    for lane in T.vectorized(lanes):
                        acc[chain, lane] = T.Cast(dtype, chain)
                for _ in range(iterations):
                    for chain in T.unroll(CHAINS):
                        for lane in T.vectorized(lanes):
                            acc[chain, lane] = T.fma(acc[chain, lane], coefficients[0], coefficients[1])
                for chain in T.unroll(CHAINS):
                    for lane in T.vectorized(lanes):
                        out[thread, chain, lane] = acc[chain, lane]

        return peak

    def arguments(self, a: float, b: float) -> list:
        return [
            tvm.runtime.tensor(np.array([a, b], dtype=self.dtype)),
            tvm.runtime.tensor(np.zeros((self.threads, CHAINS, self.lanes), dtype=self.dtype)),
        ]

    def closed_form(self, a: float, b: float) -> np.ndarray:
        """The output in float64: chain ``j`` starts at ``j``; after n steps x = a^n x0 + b (a^n - 1) / (a - 1)."""
        start = np.broadcast_to(np.arange(CHAINS, dtype=np.float64)[None, :, None], (self.threads, CHAINS, self.lanes))
        n = self.iterations
        return start + n * b if a == 1 else a**n * start + b * (a**n - 1) / (a - 1)


def _fastest_call_s(library: tvm.runtime.Module, kernel: PeakKernel) -> float:
    """The fastest of many short timings (two calls, about 1 ms each), its output checked against the
    closed form. Other work on the machine only slows a timing, and a short one more often runs
    undisturbed: the fastest stays near the peak where a median of longer ones fell to a third."""
    arguments = kernel.arguments(*TIMED_COEFFICIENTS)
    fastest_s = min(library.time_evaluator("main", tvm.cpu(), number=2, repeat=30)(*arguments).results)
    if not np.array_equal(arguments[1].numpy(), kernel.closed_form(*TIMED_COEFFICIENTS)):
        raise RuntimeError("the CPU peak kernel's output is not its closed form: its build is wrong")
    return fastest_s


def _in_own_pool(threads: int, measure):
    """``measure()`` run on a thread of its own, whose TVM thread pool has ``threads`` workers: the
    caller's pool (TVM keeps one per calling thread) stays as it was."""
    result: dict = {}

    def run() -> None:
        try:
            set_threads(threads)
            result["value"] = measure()
        except BaseException as error:  # re-raised in the caller
            result["error"] = error

    worker = threading.Thread(target=run, name="diviml-peak")
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
