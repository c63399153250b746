"""The problem solvers and bounds model (toolkit/solvable.py): prices brought into range, with the
same optimum; and the CP-SAT tick model's integers in range whatever the seconds."""

from __future__ import annotations

import math

import pytest

from tvm_diviml.cost.roofline import RooflineCostModel
from tvm_diviml.presets import gpu_k
from tvm_diviml.problem import Problem
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import get_solver
from tvm_diviml.synthetic import random_dag
from tvm_diviml.toolkit.cpsat_session import CpsatSession, tick_model
from tvm_diviml.toolkit.solvable import CappedCosts, solvable

from .conftest import graph_of, table, unit_platform


def test_a_device_a_hundred_billion_times_slower_is_capped_for_the_solvers_only():
    platform = unit_platform()
    graph = graph_of([("a", "b", 1.0)])
    costs = table(platform, {"a": {"A": 1e-6, "B": 1e5, "C": 2e-6}, "b": {"A": 1e-6, "B": 1e5, "C": 1e-6}})
    problem = Problem(graph, platform, costs)
    modelled = solvable(problem)
    assert isinstance(modelled.costs, CappedCosts) and modelled.costs.compute_s("a", "B") < 1e-2
    plan = get_solver("cpsat", time_limit_s=30).solve(problem)
    assert plan.value_s == simulate(problem, plan).value_s == pytest.approx(2e-6)
    assert plan.optimal and set(plan.assignment.values()) == {"A"}


def test_prices_in_range_are_left_alone():
    graph = random_dag(kernels=8, seed=1)
    platform = gpu_k(4)
    problem = Problem(graph, platform, RooflineCostModel(graph, platform))
    assert solvable(problem) is problem


@pytest.mark.parametrize("seconds", [1e-300, 1e-20, 1e5, 1e300])
def test_tick_counts_stay_in_64_bits_whatever_the_seconds(seconds):
    """Every duration, delay, release and tail stops one tick past the horizon; CP-SAT then solves."""
    platform = unit_platform(latency=min(seconds, 1e6), bandwidth=1e3)
    graph = graph_of([("a", "b", 1e9)], inputs=[("x", 1e9, ("a",))], output_bytes={"b": 1e9})
    costs = table(platform, {"a": {"A": seconds, "B": 1e-6, "C": 1.0}, "b": 1e-3})
    model = tick_model(Problem(graph, platform, costs))
    numbers = [n for row in model.data["duration"] for n in row if n is not None]
    numbers += [entry[2] for entry in model.data["delays"]] + [entry[1] for entry in model.data["releases"]]
    numbers += [entry[1] for entry in model.data["tails"]]
    assert all(0 <= n <= model.data["horizon"] + 1 for n in numbers) and model.data["horizon"] < 2**62
    with CpsatSession(workers=1) as session:
        answer = session.solve(model, 10.0)
    assert answer["status"] == "OPTIMAL" and math.isfinite(answer["objective"] / model.scale)
