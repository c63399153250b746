"""The stage cover beside the solver: the same bound as in this process, no interrupt reaching it,
no process left behind, and nothing started where it cannot help."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

from tvm_diviml.bounds import cover_alongside
from tvm_diviml.bounds import pipeline as pipeline_module
from tvm_diviml.bounds.cover_alongside import CoverAlongside
from tvm_diviml.bounds.pipeline import combinatorial_bounds
from tvm_diviml.bounds.stage_cover import stage_cover_bound
from tvm_diviml.planning import plan_model
from tvm_diviml.problem import Problem
from tvm_diviml.toolkit.deadline import Deadline
from tvm_diviml.toolkit.pipeline_model import PipelineData, cheapest_pricing

from ..helpers import Lines, chain, pipeline, wait_until


@pytest.fixture
def small_graphs_too(monkeypatch):
    """Let the cover start on the few-kernel graphs of these tests, on any machine."""
    monkeypatch.setattr(cover_alongside, "KERNELS_FROM", 1)
    monkeypatch.setattr(cover_alongside, "spare_cores", lambda: 1)


def five_stage_chain():
    # eight 1 s kernels, 5 s per cut: the cover refutes up to 7.5-8 s above the 7-ish combinatorial floor
    return pipeline(*chain(8, devices="ABCDE"), 5)


def in_process_bound(problem) -> float | None:
    data = PipelineData.of(problem)
    pricing = cheapest_pricing(problem, data)
    floor = max(combinatorial_bounds(problem, data, pricing, problem.stages).values())
    return stage_cover_bound(data, pricing, problem.stages, floor, Deadline.never())


def test_the_cover_beside_the_solver_is_the_one_in_process_and_ignores_interrupts(small_graphs_too):
    problem = five_stage_chain()
    expected = in_process_bound(problem)
    assert expected is not None
    deadline = Deadline.after(120)
    with CoverAlongside.start(problem, deadline) as alongside:
        assert alongside.running
        os.kill(alongside.process.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
        assert alongside.result(deadline) == expected
        assert not alongside.running
    assert not multiprocessing.active_children()


def test_stop_ends_the_process(small_graphs_too):
    alongside = CoverAlongside.start(five_stage_chain(), Deadline.after(120))
    process = alongside.process
    alongside.stop()
    assert not alongside.running and not process.is_alive() and alongside.result(Deadline.after(1)) is None


def test_nothing_starts_where_it_cannot_help(monkeypatch):
    problem = five_stage_chain()
    assert not CoverAlongside.start(problem, Deadline.after(60)).running  # 8 kernels: the DP's
    monkeypatch.setattr(cover_alongside, "KERNELS_FROM", 1)
    monkeypatch.setattr(cover_alongside, "spare_cores", lambda: 0)
    assert not CoverAlongside.start(problem, Deadline.after(60)).running  # no spare core
    monkeypatch.setattr(cover_alongside, "spare_cores", lambda: 1)
    latency = Problem(problem.graph, problem.platform, problem.costs, objective="latency")
    assert not CoverAlongside.start(latency, Deadline.after(60)).running
    assert not multiprocessing.active_children()


def test_plan_model_reports_the_cover_from_beside_the_solver(small_graphs_too, monkeypatch):
    monkeypatch.setattr(pipeline_module, "downset_bound", lambda *args, **kwargs: None)  # else it proves the optimum
    problem = five_stage_chain()
    # The cover runs until the solve's deadline, and one cut short by it is weaker: under a loaded
    # suite a 10 s limit once gave 7.96678 against 7.97452. The solver stalls in well under a second
    # here and the cover answers when done, so the long limit costs nothing.
    solved = plan_model(problem, "slicegraph", time_limit_s=120, bound_time_limit_s=30)
    assert solved.bounds["stage_cover"] == in_process_bound(problem)
    assert solved.bounds["stage_cover"] <= solved.simulation.value_s
    assert not multiprocessing.active_children()


def sleep_beside(parent: int) -> None:
    """A spawned child that outlives its parent unless ``exit_with`` ends it; it says when it watches."""
    cover_alongside.exit_with(parent)
    print("watching", os.getpid(), flush=True)
    time.sleep(3600)


def test_the_cover_ends_when_the_process_that_started_it_is_killed():
    """SIGKILL leaves no chance to stop the child: it must notice by itself. Both would sleep for an hour,
    far past the hang guard; the moments are the child's line (it watches) and its end."""
    starter = (
        "import multiprocessing, os, sys, time\n"
        f"sys.path[:0] = {sys.path!r}\n"
        "from tests.bounds.test_cover_alongside import sleep_beside\n"
        "child = multiprocessing.get_context('spawn').Process(target=sleep_beside, args=(os.getpid(),))\n"
        "child.start()\n"
        "print('started', child.pid, flush=True)\n"
        "time.sleep(3600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    output = Lines(parent.stdout)  # the child's lines come through it too
    try:
        child = int(output.wait_for("watching").split()[1])
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_until(lambda: not _alive(child), "the child's end once its parent was killed")
    finally:
        parent.kill()
        for line in output.seen:  # no orphan left by a failing run
            if line.startswith("started ") and _alive(int(line.split()[1])):
                os.kill(int(line.split()[1]), signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False
