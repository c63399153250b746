"""The stage cover in a process of its own, started with the solver (docs/solvers.md#mtpp).

Run after the solver, the cover gets what the solver leaves of ``--time-limit``: on randwire graphs
of 150-230 kernels at 16 stages the solver improves its plan until 30-50 s of 60, and the cover got
6-20 s, too few for one refutation above the separation bound. Beside the solver, on a core the
solver does not use, it gets the whole limit and takes nothing from the plan: randwire_er:nodes=40
at K = 16 went from 53.8 to 73.6 us (bound / plan 0.63 -> 0.86). Only where a second core exists and
the graph is of a size where the cover helps; elsewhere ``pipeline_bounds`` runs it after the solver.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import signal
import threading
import time

from ..problem import Problem
from ..toolkit.deadline import Deadline
from ..toolkit.pipeline_model import BlockPricing, PipelineData
from ..toolkit.solvable import solvable
from .pipeline import relaxed_pipeline
from .stage_cover import stage_cover_bound

log = logging.getLogger(__name__)
# Kernels: below, the downset DP mostly proves the plan optimal before a spare process has started;
# above, the cover's interval prices (32 orders x n^2) outgrow memory.
KERNELS_FROM, KERNELS_UP_TO = 48, 600
GRACE_S = 2.0  # past the deadline, how long the cover's answer is waited for
PARENT_POLL_S = 0.5  # how often the cover checks that the process that started it is still there


def spare_cores() -> int:
    """The cores this process may run on, less the one the solver takes."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores - 1


class CoverAlongside:
    """A stage cover running in a spawned process until a deadline (``running`` False where none
    was started); a context manager that stops it on exit, whatever happened meanwhile."""

    def __init__(self, process: multiprocessing.process.BaseProcess | None = None, answer=None):
        self.process, self.answer = process, answer

    @property
    def running(self) -> bool:
        return self.process is not None

    @classmethod
    def start(cls, problem: Problem, deadline: Deadline, seed: int = 0) -> CoverAlongside:
        """The cover of the pipeline ``problem`` above its combinatorial bounds, started now to run
        until ``deadline``; not started where no core is spare or the graph's size is outside
        ``KERNELS_FROM``-``KERNELS_UP_TO``."""
        if problem.mode != "stage_serial" or spare_cores() < 1:
            return cls()
        if not KERNELS_FROM <= len(problem.graph) <= KERNELS_UP_TO:
            return cls()
        problem = solvable(problem)
        data, cheap, stages, parts = relaxed_pipeline(problem)
        if not parts or not math.isfinite(parts["largest_kernel"]):  # a kernel no device runs: no plan to bound
            return cls()
        floor_s = max(parts.values())
        context = multiprocessing.get_context("spawn")  # no fork of a process that may hold TVM's threads
        answer, send = context.Pipe(duplex=False)
        process = context.Process(
            target=_cover,
            args=(send, data, cheap, stages, floor_s, deadline.left(), time.time(), seed, os.getpid()),
            name="diviml stage cover",
            daemon=True,
        )
        with _interrupts_ignored():  # Ctrl-C is the solver's to answer; the child inherits SIG_IGN
            process.start()
        send.close()
        log.info("stage cover started beside the solver (process %d, %d kernels)", process.pid, data.n)
        return cls(process, answer)

    def result(self, deadline: Deadline) -> float | None:
        """The cover's bound, waited for until ``deadline`` and ``GRACE_S`` more (None where it refuted
        nothing, failed or did not answer); the process is stopped either way."""
        if not self.running:
            return None
        try:
            if self.answer.poll(deadline.left() + GRACE_S):
                return self.answer.recv()
            log.warning("the stage cover beside the solver did not answer in time: left out")
        except (EOFError, OSError):
            log.warning("the stage cover beside the solver ended without an answer: left out")
        finally:
            self.stop()
        return None

    def stop(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=GRACE_S)
        self.process = None

    def __enter__(self) -> CoverAlongside:
        return self

    def __exit__(self, *_) -> None:
        self.stop()


def _cover(
    send,
    data: PipelineData,
    pricing: BlockPricing,
    stages: int,
    floor_s: float,
    seconds: float,
    sent: float,
    seed: int,
    parent: int,
) -> None:
    """The child's work: the deadline rebuilt from the wall clock (start-up took part of it)."""
    exit_with(parent)
    deadline = Deadline.after(seconds - (time.time() - sent))
    send.send(stage_cover_bound(data, pricing, stages, floor_s, deadline, seed=seed))


def exit_with(parent: int) -> None:
    """End this process once ``parent`` is gone: a parent killed outright (SIGKILL, the OOM killer)
    cannot stop it, and the cover would run on to its deadline (a thread: the cover's numpy and
    HiGHS calls release the GIL)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="diviml parent watch", daemon=True).start()


@contextlib.contextmanager
def _interrupts_ignored():
    """SIGINT ignored meanwhile, where this is the main thread (only it may set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
