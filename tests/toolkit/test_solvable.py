"""The problem solvers and bounds model (toolkit/solvable.py, toolkit/device_classes.py): spare
interchangeable devices dropped and prices brought into range, with the same optimum; and the
CP-SAT tick model's integers in range whatever the seconds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.bounds import lower_bounds
from tvm_diviml.cost.roofline import RooflineCostModel
from tvm_diviml.platform import Link, LinkTable, Platform
from tvm_diviml.presets import gpu_k
from tvm_diviml.problem import Problem
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import get_solver
from tvm_diviml.synthetic import random_dag
from tvm_diviml.toolkit.cpsat_session import CpsatSession, tick_model
from tvm_diviml.toolkit.deadline import Deadline
from tvm_diviml.toolkit.device_classes import interchangeable_devices, with_fewer_devices
from tvm_diviml.toolkit.solvable import CappedCosts, solvable

from ..bruteforce import best_latency
from ..helpers import examples, graph_of, table, unit_platform

GPUS = ("A", "B", "C", "D", "E")  # A the host CPU, the others alike


def test_a_thousand_identical_gpus_keep_as_many_as_there_are_kernels():
    graph = random_dag(kernels=16, seed=0)
    platform = gpu_k(1000)
    problem = Problem(graph, platform, RooflineCostModel(graph, platform))
    classes = interchangeable_devices(problem)
    assert classes[0] == ["gpu0"] and len(classes[1]) == 999  # the host holds the inputs: alone
    fewer = with_fewer_devices(problem)
    assert fewer.platform.device_names == [f"gpu{i}" for i in range(17)]
    assert solvable(problem).platform.device_names == fewer.platform.device_names


def test_a_thousand_gpus_on_one_fabric_hold_the_links_that_are_read():
    platform = gpu_k(1000)
    assert dict.__len__(platform.links) == 0 and platform.link_figures() == {(3e-6, 450e9)}
    assert platform.transfer_s(450e9, "gpu3", "gpu998") == pytest.approx(1 + 3e-6)
    assert ("gpu3", "gpu3") not in platform.links and ("gpu3", "x") not in platform.links
    small = gpu_k(3)
    assert len(small.links) == 6 and small.links == {
        (a, b): Link(a, b, 3e-6, 450e9) for a in small.device_names for b in small.device_names if a != b
    }


def test_a_platform_on_one_fabric_is_written_as_its_default_link_and_read_back():
    platform = gpu_k(1000)
    platform.links["gpu1", "gpu2"] = Link("gpu1", "gpu2", 1e-6, 1e9)
    data = platform.to_json()
    assert data["default_link"] == {"latency_s": 3e-6, "bandwidth_Bps": 450e9} and len(data["links"]) == 1
    again = Platform.from_json(data)
    assert again.link("gpu1", "gpu2").bandwidth_Bps == 1e9 and again.link("gpu2", "gpu1").bandwidth_Bps == 450e9
    assert again.to_json() == data


def test_a_link_table_names_the_platform_devices():
    devices = gpu_k(2).devices
    with pytest.raises(ValueError, match="other devices"):
        Platform("p", devices, LinkTable(["gpu0", "gpu9"], (0.0, 1e9)))


def test_devices_apart_by_a_link_or_a_price_stay():
    """C's link to the host is slower and D runs k slower: only B and E remain alike."""
    platform = unit_platform(GPUS)
    slow = dict(platform.links)
    slow["C", "A"] = Link("C", "A", 1.0, 0.5)
    platform = Platform("unit", platform.devices, slow)
    graph = graph_of([], kernels=["k"])
    costs = table(platform, {"k": {"A": 1.0, "B": 2.0, "C": 2.0, "D": 3.0, "E": 2.0}})
    assert interchangeable_devices(Problem(graph, platform, costs)) == [["A"], ["B", "E"], ["C"], ["D"]]


@settings(max_examples=examples(25), deadline=None)
@given(st.integers(1, 3), st.data())
def test_fewer_devices_keep_the_optimum(kernels, data):
    """Brute force over every device of the full platform and over the devices kept agree."""
    names = [f"k{i}" for i in range(kernels)]
    edges = [(a, b, 1.0) for a, b in zip(names, names[1:]) if data.draw(st.booleans())]
    graph = graph_of(edges, kernels=names, inputs=[("x", 1.0, (names[0],))], output_bytes={names[-1]: 1.0})
    platform = unit_platform(GPUS, bandwidth=2.0)
    host = {k: data.draw(st.sampled_from([1.0, 4.0])) for k in names}
    costs = table(platform, {k: {"A": host[k], **dict.fromkeys(GPUS[1:], 2.0)} for k in names})
    problem = Problem(graph, platform, costs)
    fewer = with_fewer_devices(problem)
    assert len(fewer.platform.devices) == 1 + kernels
    assert best_latency(graph, fewer.platform, costs)[0] == pytest.approx(best_latency(graph, platform, costs)[0])
    plan = get_solver("cpsat", time_limit_s=30).solve(problem)
    assert plan.optimal and plan.value_s == pytest.approx(best_latency(graph, platform, costs)[0])


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
    assert solvable(problem) is problem and solvable(problem, every_device=True) is problem


def test_bounds_keep_every_device_where_replicas_may_use_them():
    """One kernel on A (1 s) or on B or C (3 s each): replicated over all three, a period of 0.6 s."""
    platform = unit_platform()
    graph = graph_of([], kernels=["k"])
    costs = table(platform, {"k": {"A": 1.0, "B": 3.0, "C": 3.0}})
    throughput = Problem(graph, platform, costs, objective="throughput")
    assert lower_bounds(throughput)["lp_load"] == pytest.approx(0.6, rel=1e-5)
    assert lower_bounds(Problem(graph, platform, costs))["lp_load"] == pytest.approx(0.75, rel=1e-5)


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
        answer = session.solve(model, Deadline.after(10))
    assert answer["status"] == "OPTIMAL" and math.isfinite(answer["objective"] / model.scale)
