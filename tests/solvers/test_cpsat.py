"""The CP-SAT latency solver against brute force, hand-computed cases and its own promises.

Each solve starts one OR-Tools process (about a second: most of it importing OR-Tools).
Links cost 1 s + 1 s per byte (``unit_platform``); A is the host.
"""

import os
import signal
import subprocess
import sys

import pytest
from hypothesis import given, settings

from tvm_diviml.app.workload import load_workload
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import GraphInput, Kernel, OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, get_solver
from tvm_diviml.solvers.cpsat import Cpsat
from tvm_diviml.solvers.heft import Heft
from tvm_diviml.toolkit.cpsat_session import CpsatSession

from ..bruteforce import best_latency
from ..helpers import REPO_ROOT, examples, graph_of, table, unit_platform
from ..strategies import dag_problems


def solve_checked(graph, platform, costs, **options) -> Plan:
    """Solve, and check what every cpsat plan promises: the claim is the simulator's, the bound is below it."""
    plan = Cpsat(**options).solve(Problem(graph, platform, costs))
    sim = simulate(Problem(graph, platform, costs), plan)
    assert plan.solver == "cpsat" and plan.mode == "latency"
    assert plan.value_s == sim.value_s and sim.feasible
    assert plan.lower_bound_s <= plan.value_s
    return plan


@settings(max_examples=examples(6), deadline=None)  # ~1.3 s an example: one OR-Tools process each
@given(dag_problems(max_kernels=7))
def test_cpsat_equals_brute_force(problem):
    graph, platform, costs = problem
    optimum, _ = best_latency(graph, platform, costs)
    plan = solve_checked(graph, platform, costs)
    assert plan.value_s == pytest.approx(optimum, rel=1e-9, abs=1e-12)
    assert plan.lower_bound_s <= optimum * (1 + 1e-12)
    assert plan.optimal


def test_a_tensor_crosses_once_with_its_largest_edge():
    # s (A only) feeds x with 1 byte and y (B only) with 3. Both on B: the tensor crosses once with
    # 3 bytes (arrives at 5), y 5-7, x 7-8 -> 8; x on A: 10. Charging x its own 1-byte edge alone
    # would promise 7 and a bound of 7.
    platform = unit_platform()
    graph = graph_of([("s", "x", 1), ("s", "y", 3)])
    costs = table(platform, {"s": {"A": 1}, "x": {"A": 9, "B": 1}, "y": {"B": 2}})
    plan = solve_checked(graph, platform, costs)
    assert (plan.value_s, plan.lower_bound_s, plan.optimal) == (8, 8, True)
    assert plan.assignment == {"s": "A", "x": "B", "y": "B"}


def test_inputs_outputs_allowed_devices_and_colocation():
    # s reads a 3-byte input and returns 2 bytes: on B it gets the input at 4, runs 4-5, and its
    # result is home at 8 (on A or C: 9 or more). p and q (4 s each) must share a device that p may
    # use (A or B; q alone would take C): with s on B that is 9, so A. r may run only on C.
    platform = unit_platform()
    graph = OpGraph(
        [
            Kernel("s", output_bytes=2),
            Kernel("p", colocate="g", allowed_devices=("A", "B")),
            Kernel("q", colocate="g"),
            Kernel("r", allowed_devices=("C",)),
        ],
        [],
        inputs=[GraphInput("in", 3, ("s",))],
    )
    costs = table(
        platform, {"s": {"A": 9, "B": 1, "C": 9}, "p": 4, "q": {"A": 4, "B": 4, "C": 1}, "r": {"A": 1, "B": 1, "C": 4}}
    )
    plan = solve_checked(graph, platform, costs)
    assert plan.value_s == best_latency(graph, platform, costs)[0] == 8
    assert plan.optimal and plan.lower_bound_s == 8
    assert plan.assignment == {"s": "B", "p": "A", "q": "A", "r": "C"}


def test_memory_splits_what_does_not_fit_and_claims_no_proof():
    # Each device holds 50 bytes; a and b read 30-byte weights, so they must run apart: a 0-1, the
    # 1-byte tensor arrives at 3, b 3-4. Memory binds, so CP-SAT's bound is not a bound of the problem.
    platform = unit_platform(memory=50)
    graph = graph_of([("a", "b", 1)], weights={"wa": 30, "wb": 30}, kernel_weights={"a": ["wa"], "b": ["wb"]})
    plan = solve_checked(graph, platform, table(platform, {"a": 1, "b": 1}))
    assert plan.value_s == 4 and plan.assignment["a"] != plan.assignment["b"]
    assert not plan.optimal and plan.attrs["memory_restricts_bound"]


@pytest.mark.parametrize("time_limit_s", [0.01, 1.0])
def test_a_short_time_limit_still_returns_a_valid_plan(time_limit_s):
    # 0.01 s: CP-SAT finds nothing and HEFT's warm start stands in; 1 s: an unproven CP-SAT plan.
    workload = load_workload("random:kernels=48,seed=3", "paper-node", "roofline")
    graph, platform, costs = workload.graph, workload.platform, workload.costs
    plan = solve_checked(graph, platform, costs, time_limit_s=time_limit_s, workers=1)
    assert plan.value_s <= Heft().solve(Problem(graph, platform, costs)).value_s


def test_a_hint_is_checked_and_used():
    platform = unit_platform()
    graph = graph_of([("a", "b", 1), ("a", "c", 1)])
    costs = table(platform, {"a": 1, "b": 2, "c": 2})
    problem = Problem(graph, platform, costs)
    hint = Plan({"a": "A", "b": "A", "c": "B"})
    plan = Cpsat().solve(problem, hint=hint)
    assert plan.optimal and plan.value_s == best_latency(graph, platform, costs)[0]
    with pytest.raises(DivimlInputError, match="unassigned"):
        Cpsat().solve(problem, hint=Plan({"a": "A"}))


def test_a_session_given_to_the_call_is_solved_in():
    platform = unit_platform()
    graph = graph_of([("a", "b", 1), ("a", "c", 1)])
    problem = Problem(graph, platform, table(platform, {"a": 1, "b": 2, "c": 2}))
    optimum = best_latency(graph, platform, problem.costs)[0]
    with CpsatSession(workers=1) as session:
        first = Cpsat().solve(problem, session=session)
        hinted = Cpsat().solve(problem, hint=first, session=session)
    assert first.value_s == hinted.value_s == optimum and hinted.optimal


def test_other_objectives_are_named():
    platform = unit_platform()
    graph = graph_of([("a", "b", 1)])
    costs = table(platform, {"a": 1, "b": 1})
    with pytest.raises(DivimlInputError, match="latency, not 'throughput'.*fastest_single_device"):
        get_solver("cpsat").solve(Problem(graph, platform, costs, objective="throughput"))


def test_the_calling_process_never_loads_ortools():
    """cpsat and split's CP-SAT windows run OR-Tools in a worker: it cannot share a process with CBC."""
    script = (
        "import sys\n"
        "from tvm_diviml.solvers import Problem, get_solver\n"
        "from tvm_diviml.synthetic import random_dag\n"
        "from tests.helpers import graph_of, table, unit_platform\n"
        "platform = unit_platform()\n"
        "graph = graph_of([('a', 'b', 1)])\n"
        "plan = get_solver('cpsat').solve(Problem(graph, platform, table(platform, {'a': 1, 'b': 1})))\n"
        "assert plan.optimal\n"
        "graph = random_dag(kernels=20, seed=1)\n"
        "platform = unit_platform(latency=0.01, bandwidth=100.0)\n"
        "problem = Problem(graph, platform, table(platform, {k: 1.0 for k in graph.kernels}))\n"
        "plan = get_solver('split', module_size=6).solve(problem)\n"
        "assert plan.attrs['windows_solved'] > 1\n"
        "assert not any(m.startswith('ortools') for m in sys.modules), sorted(sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_32_kernel_dags_are_proven_optimal(seed):
    workload = load_workload(f"random:kernels=32,seed={seed}", "paper-node", "roofline")
    plan = solve_checked(workload.graph, workload.platform, workload.costs, time_limit_s=60)
    assert plan.optimal, plan.attrs
    assert plan.lower_bound_s >= plan.value_s / (1 + 1e-9)


TIME_LIMIT_S = 600  # the stopped solve's limit: a run that ignored the signal would still be solving


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_stopped_diviml_leaves_no_cpsat_process(how, tmp_path):
    """SIGTERM and Ctrl-C stop the CP-SAT worker on the way out, at once (the session's own log says
    how it stopped the worker); SIGKILL takes it along (Linux). No step is timed against the clock,
    so a loaded machine only makes the test slower: the waits are a fraction of the solve's limit."""
    import subprocess
    import sys
    import time

    command = [
        sys.executable,
        "-m",
        "tvm_diviml.cli",
        "--debug",
        "plan",
        "random:kernels=120,seed=3",
        "--platform",
        "paper-node",
        "--solver",
        "cpsat",
        "--time-limit",
        str(TIME_LIMIT_S),
    ]
    log_path = tmp_path / "stderr.txt"
    with open(log_path, "wb") as log:
        # a background job (CI) inherits SIGINT ignored, and Python then keeps it so: restore the default
        parent = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=tmp_path,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    def workers():
        found = subprocess.run(
            ["pgrep", "-P", str(parent.pid), "-f", "cpsat_worker"], capture_output=True, text=True
        ).stdout.split()
        return [int(pid) for pid in found]

    def running(pid: int) -> bool:
        return os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z"

    deadline = time.monotonic() + TIME_LIMIT_S / 5
    while not workers() and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.1)
    children = workers()
    assert children, log_path.read_text() if parent.poll() is not None else "no CP-SAT worker started"
    time.sleep(1.0)  # the solve is under way
    parent.send_signal(how)
    parent.wait(timeout=TIME_LIMIT_S / 5)  # far short of the limit: the signal, not the solve, ended it
    if how != signal.SIGKILL:
        stderr = log_path.read_text()
        assert parent.returncode == 130, stderr[-2000:]
        assert "stopped the CP-SAT process at once" in stderr, stderr[-2000:]
    deadline = time.monotonic() + TIME_LIMIT_S / 5
    while any(running(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in children if running(pid)]
    assert not alive, f"CP-SAT worker {alive} outlived diviml ({how.name})"
