"""The plan report: what it says about a plan beyond its numbers."""
from __future__ import annotations

from tvm_diviml.bounds import lower_bounds
from tvm_diviml.plan import Plan
from tvm_diviml.report import format_row, list_scheduling_baselines, report_row
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, default_solver

from .conftest import graph_of, table, unit_platform


def throughput_report(assignment):
    graph = graph_of([("a", "b", 1), ("b", "c", 1)])
    platform = unit_platform()
    costs = table(platform, {"a": 1.0, "b": 1.0, "c": 1.0})
    problem = Problem(graph, platform, costs, objective="throughput")
    plan = Plan(assignment, objective="throughput", mode="period_overlap", solver="hand")
    sim = simulate(graph, platform, costs, plan)
    row = report_row(problem, plan, sim, lower_bounds(problem), {}, "chain", "table")
    return row, format_row(row, platform.device_names)


def test_a_throughput_plan_whose_device_graph_cycles_says_so():
    row, text = throughput_report({"a": "A", "b": "B", "c": "A"})
    assert row["device_graph_acyclic"] is False and "has a cycle" in text
    row, text = throughput_report({"a": "A", "b": "B", "c": "B"})
    assert row["device_graph_acyclic"] is True and "cycle" not in text


def test_auto_picks_a_solver_for_each_objective_and_mode():
    graph = graph_of([("a", "b", 1)])
    direct, staged = unit_platform(), unit_platform(transfer_model="host_staged")
    costs = table(direct, {"a": 1.0, "b": 1.0})
    assert default_solver(Problem(graph, direct, costs, objective="latency")) == "split"
    assert default_solver(Problem(graph, direct, costs, objective="throughput")) == "milp"
    assert default_solver(Problem(graph, direct, costs, objective="pipeline", stages=2)) == "slicegraph"
    assert default_solver(Problem(graph, staged, table(staged, {"a": 1.0, "b": 1.0}), objective="throughput")) \
        == "downsets"


def test_throughput_baselines_score_heft_placement_in_the_period_mode():
    graph = graph_of([("a", "b", 1), ("a", "c", 1)])
    platform = unit_platform()
    costs = table(platform, {"a": 1.0, "b": 4.0, "c": 4.0})
    latency = list_scheduling_baselines(Problem(graph, platform, costs, objective="latency"))
    throughput = list_scheduling_baselines(Problem(graph, platform, costs, objective="throughput"))
    assert set(latency) == set(throughput) == {"heft", "greedy"}
    # a period is never longer than the one inference's makespan of the same placement
    assert throughput["heft"] <= latency["heft"]
    assert list_scheduling_baselines(Problem(graph, platform, costs, objective="pipeline", stages=2)) == {}
