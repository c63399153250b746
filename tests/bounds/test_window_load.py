"""The window_load latency bound: by hand where contention and precedence both bind; it and
overlap_load never above the brute-force optimum."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from tvm_diviml.bounds import lower_bounds
from tvm_diviml.bounds.overlap_load import overlap_load_bound
from tvm_diviml.bounds.window_load import class_weights, fractional_load, window_load_bound
from tvm_diviml.solvers import Problem

from ..bruteforce import best_latency
from ..helpers import examples, graph_of, table, unit_platform
from ..strategies import dag_problems


def test_a_wide_fork_is_bounded_by_its_middle_window():
    # s -> four 1 s kernels -> t on two devices, free transfers: the four fit in [1, C - 1] only two
    # at a time, so C >= 1 + 2 + 1 = 4, the optimum; the path (3) and the load (6 / 2) both say 3.
    middle = [f"k{i}" for i in range(4)]
    graph = graph_of([("s", k, 0.0) for k in middle] + [(k, "t", 0.0) for k in middle])
    platform = unit_platform(("A", "B"), latency=0.0, bandwidth=1e18)
    costs = table(platform, dict.fromkeys(["s", *middle, "t"], 1.0))
    problem = Problem(graph, platform, costs)
    optimum, _ = best_latency(graph, platform, costs)
    bounds = lower_bounds(problem)
    assert optimum == pytest.approx(4.0)
    assert bounds["window_load"] == pytest.approx(4.0, rel=1e-5) and bounds["window_load"] <= 4.0
    assert bounds["transfer_path"] == pytest.approx(3.0) and bounds["lp_load"] == pytest.approx(3.0, rel=1e-5)


def test_the_fractional_load_by_hand():
    # One kernel, 1 s on a lone device and 3 s on each of two identical ones: 0.6 s on all three.
    assert fractional_load(np.array([[1.0, 3.0]]), [1, 2]) == pytest.approx(0.6)
    # A kernel no class can run: the LP has no plan and the window proves nothing.
    assert fractional_load(np.array([[np.inf, np.inf]]), [1, 2]) == 0.0


def test_device_weights_sum_to_one_over_devices():
    weights = class_weights([1, 2, 4])
    assert weights.shape[1] == 3 and len(weights) <= 300
    assert np.allclose(weights @ np.array([1, 2, 4]), 1.0)


@pytest.mark.parametrize("bound", [window_load_bound, overlap_load_bound])
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=dag_problems(max_kernels=7))
def test_the_window_bounds_never_exceed_the_optimum(bound, case):
    graph, platform, costs = case
    optimum, _ = best_latency(graph, platform, costs)
    assert bound(Problem(graph, platform, costs)) <= optimum * (1 + 1e-9) + 1e-12
