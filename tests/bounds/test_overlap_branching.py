"""The overlap_branching latency bound: by hand where enumerating one kernel's device reaches the optimum
that every unbranched bound misses; never above the brute-force optimum; what it does without time."""

import math

import pytest
from hypothesis import HealthCheck, given, settings

from tvm_diviml.bounds import lower_bounds
from tvm_diviml.bounds.overlap_branching import overlap_branching_bound
from tvm_diviml.bounds.overlap_load import overlap_load_bound
from tvm_diviml.solvers import Problem
from tvm_diviml.toolkit.deadline import Deadline

from ..bruteforce import best_latency
from ..helpers import examples, graph_of, table, unit_platform
from ..strategies import dag_problems


def fork_to_two_devices() -> Problem:
    # s feeds a (A only) and b (B only), 1 s each, 0.5 s per transfer. Unbranched, a's head takes s
    # on A and b's takes s on B: 2 s. Wherever s runs, one of them waits 0.5 s: 2.5 s, the optimum.
    graph = graph_of([("s", "a", 1.0), ("s", "b", 1.0)])
    platform = unit_platform(("A", "B"), latency=0.5, bandwidth=1e18)
    costs = table(platform, {"s": 1.0, "a": {"A": 1.0, "B": math.inf}, "b": {"A": math.inf, "B": 1.0}})
    return Problem(graph, platform, costs)


def test_pinning_the_fork_reaches_the_optimum_the_unbranched_bounds_miss():
    problem = fork_to_two_devices()
    optimum, _ = best_latency(problem.graph, problem.platform, problem.costs)
    unbranched = lower_bounds(problem)
    assert optimum == pytest.approx(2.5)
    assert max(unbranched.values()) == pytest.approx(2.0, rel=1e-5)
    branched = overlap_branching_bound(problem, Deadline.after(30), unbranched["overlap_load"])
    assert branched == pytest.approx(2.5, rel=1e-5) and branched <= optimum
    searched = lower_bounds(problem, Deadline.after(5), search=True)
    assert searched["overlap_branching"] == pytest.approx(2.5, rel=1e-5)


def test_without_time_or_above_the_known_plan_it_keeps_the_unbranched_bound():
    problem = fork_to_two_devices()
    root = overlap_load_bound(problem)
    assert overlap_branching_bound(problem, Deadline.after(0), root) == root
    assert overlap_branching_bound(problem, Deadline.after(30), root, upper_s=root) == root
    assert "overlap_branching" not in lower_bounds(problem)  # no time given: no search


def test_past_its_placements_it_declines(monkeypatch):
    import tvm_diviml.bounds.overlap_branching as branching

    problem = fork_to_two_devices()
    monkeypatch.setattr(branching, "PLACEMENTS", 5)  # 3 kernels x 2 devices
    assert overlap_branching_bound(problem, Deadline.after(30), 2.0) == 2.0


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=dag_problems(max_kernels=6))
def test_it_never_exceeds_the_optimum(case):
    graph, platform, costs = case
    problem = Problem(graph, platform, costs)
    optimum, _ = best_latency(graph, platform, costs)
    root = overlap_load_bound(problem)
    branched = overlap_branching_bound(problem, Deadline.after(5), root)
    assert root <= branched <= optimum * (1 + 1e-9) + 1e-12
