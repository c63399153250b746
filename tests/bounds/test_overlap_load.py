"""The overlap_load latency bound: where it beats every other bound by hand against brute force, and
the cases where it proves nothing (never above the optimum: test_window_load)."""

import math

import pytest

from tvm_diviml.bounds import lower_bounds
from tvm_diviml.bounds.overlap_load import overlap_load_bound
from tvm_diviml.solvers import Problem

from ..bruteforce import best_latency
from ..helpers import graph_of, table, unit_platform


def test_one_placement_for_every_window_reaches_the_optimum_where_the_others_stop_short():
    # Two unlike devices, 0.5 s per transfer: k5 waits for k0, k1 and k3 (k3 after k0), k4 after k2.
    # Each window alone may place its kernels afresh; one placement for all reaches the optimum, 4.
    graph = graph_of([("k0", "k3", 0.0), ("k2", "k4", 0.0), ("k0", "k5", 0.0), ("k1", "k5", 0.0), ("k3", "k5", 0.0)])
    platform = unit_platform(("A", "B"), latency=0.5, bandwidth=1.0)
    costs = table(
        platform,
        {
            "k0": 1.0,
            "k1": {"A": 2.0, "B": 1.0},
            "k2": 1.0,
            "k3": {"A": 1.0, "B": 3.0},
            "k4": {"A": 2.0, "B": 3.0},
            "k5": {"A": 1.0, "B": 2.0},
        },
    )
    optimum, _ = best_latency(graph, platform, costs)
    bounds = lower_bounds(Problem(graph, platform, costs))
    others = max(value for name, value in bounds.items() if name != "overlap_load")
    assert optimum == pytest.approx(4.0)
    assert bounds["overlap_load"] == pytest.approx(4.0, rel=1e-5) and bounds["overlap_load"] <= 4.0
    assert others < 0.95 * optimum


def test_a_lone_kernel_splits_over_the_devices_and_one_that_runs_nowhere_proves_nothing():
    # The LP may split a kernel: 2 s on either of two devices is 1 s on each. A kernel that can run
    # nowhere leaves no placement at all.
    platform = unit_platform(("A", "B"), latency=0.0, bandwidth=1e18)
    alone = graph_of([], kernels=["k"])
    assert overlap_load_bound(Problem(alone, platform, table(platform, {"k": 2.0}))) == pytest.approx(1.0, rel=1e-5)
    nowhere = table(platform, {"k": {"A": math.inf, "B": math.inf}})
    assert overlap_load_bound(Problem(alone, platform, nowhere)) == 0.0


def test_past_its_placements_it_declines(monkeypatch):
    import tvm_diviml.bounds.overlap_load as overlap_module

    platform = unit_platform(("A", "B"), latency=0.0, bandwidth=1e18)
    pair = graph_of([("a", "b", 0.0)])
    problem = Problem(pair, platform, table(platform, {"a": 1.0, "b": 1.0}))
    # [0, C - 1] holds a, half on each device: C >= 1 + 0.5
    assert overlap_load_bound(problem) == pytest.approx(1.5, rel=1e-5)
    monkeypatch.setattr(overlap_module, "PLACEMENTS", 3)  # 2 kernels x 2 devices
    assert overlap_load_bound(problem) == 0.0
