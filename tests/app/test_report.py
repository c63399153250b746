"""The plan report: what it says about a plan beyond its numbers."""

from __future__ import annotations

import pytest

from tvm_diviml.app.report import format_row, report_row
from tvm_diviml.bounds import lower_bounds
from tvm_diviml.plan import Plan
from tvm_diviml.planning import Solved, list_scheduling_baselines
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, default_solver
from tvm_diviml.toolkit.deadline import Deadline

from ..helpers import graph_of, table, unit_platform


def throughput_report(assignment):
    graph = graph_of([("a", "b", 1), ("b", "c", 1)])
    platform = unit_platform()
    costs = table(platform, {"a": 1.0, "b": 1.0, "c": 1.0})
    problem = Problem(graph, platform, costs, objective="throughput")
    plan = Plan(assignment, objective="throughput", mode="period_overlap", solver="hand")
    sim = simulate(Problem(graph, platform, costs), plan)
    row = report_row(problem, Solved.of(plan, sim, lower_bounds(problem), {}), "chain", "table")
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
    assert default_solver(Problem(graph, direct, costs, objective="pipeline", stages=2)) == "downsets"
    assert (
        default_solver(Problem(graph, staged, table(staged, {"a": 1.0, "b": 1.0}), objective="throughput"))
        == "downsets"
    )


def test_throughput_baselines_score_heft_placement_in_the_period_mode():
    graph = graph_of([("a", "b", 1), ("a", "c", 1)])
    platform = unit_platform()
    costs = table(platform, {"a": 1.0, "b": 4.0, "c": 4.0})
    latency = list_scheduling_baselines(Problem(graph, platform, costs, objective="latency"), Deadline.after(10))
    throughput = list_scheduling_baselines(Problem(graph, platform, costs, objective="throughput"), Deadline.after(10))
    assert set(latency) == set(throughput) == {"heft", "greedy"}
    # a period is never longer than the one inference's makespan of the same placement
    assert throughput["heft"] <= latency["heft"]
    pipeline = Problem(graph, platform, costs, objective="pipeline", stages=2)
    assert list_scheduling_baselines(pipeline, Deadline.after(10)) == {}


def twin_branches_problem(error: float):
    """Two independent 1 s branches: split over A and B they take 1 s plus copies, on one device 2 s."""
    graph = graph_of([], kernels=["left", "right"])
    platform = unit_platform(latency=0.0)
    costs = table(platform, {"left": 1.0, "right": 1.0})
    costs.prediction_error = error
    return Problem(graph, platform, costs, objective="latency")


def test_auto_keeps_the_single_device_unless_the_split_wins_by_more_than_the_measured_error():
    from tvm_diviml.app.report import solve_and_report

    split, _, row = solve_and_report(twin_branches_problem(0.0), "auto", "twins", "table", time_limit_s=5)
    assert len(split.devices_used()) == 2 and row["kept_single_device"] is None
    assert row["value_s"] == 1.0 and row["baselines"]["fastest_single_device"] == 2.0
    kept, _, row = solve_and_report(twin_branches_problem(0.6), "auto", "twins", "table", time_limit_s=5)
    assert len(kept.devices_used()) == 1 and row["value_s"] == 2.0 and row["solver"] == "fastest_single_device"
    assert (
        "predicted 100.0% faster than the fastest single device, within the measured error of 60.0%"
        in row["kept_single_device"]
    )
    assert row["kept_single_device"] in format_row(row, ["A", "B", "C"])
    chosen, _, row = solve_and_report(twin_branches_problem(0.6), "heft", "twins", "table", time_limit_s=5)
    assert len(chosen.devices_used()) == 2 and row["kept_single_device"] is None  # a named solver is obeyed


def test_a_throughput_plan_that_is_not_built_replicates_where_faster_and_drops_the_unreplicated_bound():
    from tvm_diviml.app.report import solve_and_report

    # One kernel, 3 s on A and 1 s on B: the MILP proves 1 s among plans that run it on one device, yet
    # replicas with shares 1/4 and 3/4 take 0.75 s a period.
    platform = unit_platform(("A", "B"))
    problem = Problem(
        graph_of([], kernels=["k"]), platform, table(platform, {"k": {"A": 3, "B": 1}}), objective="throughput"
    )
    built, _, row = solve_and_report(problem, "auto", "one", "table", time_limit_s=10)  # a build follows
    assert not built.replicas and row["value_s"] == pytest.approx(1.0) and row["lower_bound_s"] == pytest.approx(1.0)
    assert row["replicated"] is None and row["replicas"] == []
    planned, sim, row = solve_and_report(problem, "auto", "one", "table", time_limit_s=10, replicas=True)
    assert planned.replicas and sim.value_s == pytest.approx(0.75) and row["value_s"] == sim.value_s
    assert "solver" not in row["lower_bound_parts"] and row["lower_bound_s"] <= 0.75 * (1 + 1e-9)
    assert row["replicas"] == [{"kernels": 1, "shares": pytest.approx({"A": 0.25, "B": 0.75})}]
    assert row["kernels_per_device"] == {"A": 1, "B": 1}  # each replica runs the kernel
    shown = format_row(row, ["A", "B"])
    assert "the whole model replicated" in shown and "shares of the stream: B 75%, A 25%" in shown


def test_a_throughput_plan_proven_only_without_replicas_says_so():
    from tvm_diviml.app.report import solve_and_report

    # a (1 s) runs only on A, b takes 6 s on A and 3 s on B, the edge free: A alone 7 s, a on A and b on B
    # 3 s (optimal without replicas), b's stage replicated 7/3 s (A 1 + 6y, B 3 - 3y, y = 2/9). With an
    # error margin of 25% the replicas (22% faster) are not kept: the MILP's proof holds only among
    # plans without replicas, and the bound that counts is the one valid with them (the LP's 7/3 s).
    from tvm_diviml.graph import Edge, Kernel, OpGraph

    graph = OpGraph([Kernel("a", allowed_devices=("A",)), Kernel("b")], [Edge("a", "b", 0)])
    platform = unit_platform(("A", "B"))
    costs = table(platform, {"a": 1, "b": {"A": 6, "B": 3}})
    costs.prediction_error = 0.25
    problem = Problem(graph, platform, costs, objective="throughput")
    plan, sim, row = solve_and_report(problem, "auto", "two", "table", time_limit_s=10, replicas=True)
    assert not plan.replicas and sim.value_s == pytest.approx(3.0) and row["replicated"] is None
    assert row["lower_bound_s"] == pytest.approx(7 / 3, rel=1e-5) and row["optimal_among"] == "plans without replicas"
    assert "proven optimal among plans without replicas" in format_row(row, ["A", "B"])


def forced_split(objective, stages=None):
    """a may run only on B and c only on C: no single device can run the model."""
    from tvm_diviml.graph import Kernel, OpGraph

    base = graph_of([("a", "b", 1), ("b", "c", 1)])
    kernels = [Kernel(k.name, allowed_devices={"a": ("B",), "c": ("C",)}.get(k.name)) for k in base.kernels.values()]
    graph = OpGraph(kernels, list(base.edges))
    platform = unit_platform()
    return Problem(
        graph,
        platform,
        table(platform, {"a": {"B": 1.0}, "b": 1.0, "c": {"C": 1.0}}),
        objective=objective,
        stages=stages,
    )


@pytest.mark.parametrize(
    "objective, solver, stages",
    [
        ("latency", "auto", None),
        ("latency", "milp", None),
        ("latency", "heft", None),
        ("latency", "cpsat", None),
        ("throughput", "auto", None),
        ("throughput", "split", None),
        ("pipeline", "auto", 2),
        ("pipeline", "milp", 3),
    ],
)
def test_a_model_no_single_device_can_run_is_planned_and_the_missing_baseline_said(objective, solver, stages):
    from tvm_diviml.app.report import solve_and_report

    plan, sim, row = solve_and_report(forced_split(objective, stages), solver, "forced", "table", time_limit_s=10)
    assert sim.feasible and plan.assignment["a"] == "B" and plan.assignment["c"] == "C"
    assert row["baselines"]["fastest_single_device"] is None and row["speedup_over_fastest_single_device"] is None
    assert "no single device can run the whole model" in format_row(row, ["A", "B", "C"])


def test_the_header_names_each_device_cost_source_and_counts_them_past_four():
    from tvm_diviml.app.report import _cost_sources

    few = {"cpu": "measured", "gpu0": "estimated"}
    assert _cost_sources(few) == "cpu measured, gpu0 estimated"
    many = {"cpu": "measured", **{f"gpu{i}": "estimated" for i in range(64)}}
    assert _cost_sources(many) == "cpu measured, 64 devices estimated"


def test_a_solve_whose_time_is_spent_starts_no_mip_bound():
    """plan_model's time limit covers plan, baselines and bounds: with too little time left for a
    bound MIP to build its model, only the combinatorial bounds are given (still below the plan)."""
    from tvm_diviml.planning import plan_model
    from tvm_diviml.synthetic import random_dag

    graph = random_dag(30, seed=2)
    platform = unit_platform()
    problem = Problem(graph, platform, table(platform, {k: {"A": 3.0, "B": 1.0, "C": 2.0} for k in graph.kernels}))
    problem = Problem(problem.graph, platform, problem.costs, objective="pipeline", stages=3)
    roomy = plan_model(problem, "slicegraph", time_limit_s=60, bound_time_limit_s=10)  # not proven: bounds run
    rushed = plan_model(problem, "slicegraph", time_limit_s=0.5, bound_time_limit_s=10)
    mips = {"stage_cover", "three_superblock", "guess_bottleneck", "exact_mip", "downsets"}
    assert mips & set(roomy.bounds) and not mips & set(rushed.bounds)
    assert rushed.bound_s <= roomy.value_s * (1 + 1e-9)


def test_a_solve_answers_once_with_status_value_bound_and_gap():
    from tvm_diviml.planning import plan_model

    solved = plan_model(twin_branches_problem(0.0), "auto", time_limit_s=5)
    assert solved.status == "optimal" and solved.value_s == solved.simulation.value_s == 1.0
    assert solved.bound_s == max(solved.bounds.values()) and solved.gap == pytest.approx(0.0, abs=1e-9)
    problem = twin_branches_problem(0.0)
    plan = Plan({"left": "A", "right": "A"}, solver="hand")
    sim = simulate(problem, plan)
    assert Solved.of(plan, sim, {"average_load": 1.0}, {}).status == "feasible"
    interrupted = Solved.of(plan, sim, {"average_load": 1.0}, {}, interrupted=True)
    assert (interrupted.status, interrupted.gap) == ("interrupted", pytest.approx(1.0))
    unbounded = Solved.of(plan, sim, {}, {})
    assert (unbounded.bound_s, unbounded.gap) == (0.0, None)
    sim.feasible = False
    assert Solved.of(plan, sim, {"average_load": 2.0}, {}).status == "infeasible"  # even where the bound meets it
