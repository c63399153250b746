"""The exact pipeline MIP and the MTPP lower bounds (solvers/pipeline_mip.py, bounds/pipeline.py)
against brute force over every ordered split and every choice of stage devices, SliceGraph's exact DP
over every topological order, hand-priced cases and the simulator's ``stage_serial`` mode.

Links cost latency + bytes / bandwidth (``unit_platform``); A is the host CPU.
"""

import itertools
import math

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.app.workload import load_workload
from tvm_diviml.bounds import lower_bounds
from tvm_diviml.bounds.pipeline import pipeline_bounds, superblock_bound
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.problem import Problem
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import get_solver
from tvm_diviml.solvers.pipeline_mip import solve_pipeline_mip
from tvm_diviml.solvers.slicegraph import slice_order
from tvm_diviml.toolkit.deadline import Deadline
from tvm_diviml.toolkit.pipeline_model import BuildStopped, MipBuilder, PipelineData, cheapest_pricing

from ..bruteforce import best_pipeline
from ..helpers import (
    TOLERANCE,
    examples,
    graph_of,
    pipeline,
    simulated,
    stage_choice_chain,
    table,
    unit_platform,
)
from ..strategies import DEVICES, constrained_pipeline_problems, dag_problems, pipeline_problems


def close(a, b):
    return math.isclose(a, b, rel_tol=10 * TOLERANCE, abs_tol=1e-9)


# ---------------------------------------------------------------------- the exact MIP
@settings(max_examples=examples(30), deadline=None)
@given(pipeline_problems())
def test_mip_optimum_is_brute_force_and_the_dp_over_every_order(problem):
    optimum = best_pipeline(problem)
    plan = solve_pipeline_mip(problem, Deadline.after(20))
    assert plan.optimal and close(plan.value_s, optimum)
    assert plan.value_s == simulated(problem, plan).value_s and simulated(problem, plan).feasible
    assert plan.lower_bound_s <= plan.value_s and close(plan.lower_bound_s, optimum)
    assert len(plan.stages) <= problem.stages and len(set(plan.stage_devices)) == len(plan.stage_devices)
    orders = list(nx.all_topological_sorts(problem.graph.to_networkx()))
    dp = min(
        slice_order(problem, list(order), list(devices))[0]
        for order in orders
        for devices in itertools.permutations(DEVICES, problem.stages)
    )
    assert close(dp, optimum)


@settings(max_examples=examples(25), deadline=None)
@given(pipeline_problems(max_kernels=4, uneven_links=True))
def test_uneven_links_leave_a_valid_bound_and_claim_only_what_the_simulator_agrees_to(problem):
    optimum = best_pipeline(problem)
    plan = solve_pipeline_mip(problem, Deadline.after(20))
    sim = simulated(problem, plan)
    assert plan.value_s == sim.value_s and plan.value_s >= optimum * (1 - 1e-12)
    assert plan.lower_bound_s <= optimum * (1 + TOLERANCE)
    if plan.optimal:
        assert close(plan.value_s, optimum)


@settings(max_examples=examples(40), deadline=None)
@given(constrained_pipeline_problems())
def test_mip_and_bounds_keep_allowed_devices_groups_and_memory(problem):
    optimum = best_pipeline(problem)
    try:
        plan = solve_pipeline_mip(problem, Deadline.after(20))
    except DivimlInputError:
        assert optimum == math.inf
        return
    sim = simulated(problem, plan)
    assert sim.feasible and plan.optimal and close(plan.value_s, optimum)
    for name, bound in lower_bounds(problem, Deadline.after(5), search=True).items():
        assert bound <= optimum * (1 + TOLERANCE), name


def test_mip_chooses_which_device_takes_which_stage():
    # [a] on B = 2 + input 2 + a out 3 = 7; [b, c] on C = 2 + a in 3 + output 2 = 7. With C first it is 15 at best.
    plan = solve_pipeline_mip(stage_choice_chain(), Deadline.after(10))
    assert (plan.value_s, plan.stages, plan.stage_devices, plan.optimal) == (7.0, [["a"], ["b", "c"]], ["B", "C"], True)
    assert (plan.objective, plan.mode) == ("pipeline", "stage_serial")


def test_a_warm_start_is_improved_on_and_must_be_a_pipeline_plan():
    problem = stage_choice_chain()
    slow = Plan(
        {"a": "C", "b": "C", "c": "C"},
        objective="pipeline",
        mode="stage_serial",
        stages=[["a", "b", "c"]],
        stage_devices=["C"],
    )
    assert simulated(problem, slow).value_s == 16.0  # 12 of work + input 2 + output 2
    plan = solve_pipeline_mip(problem, Deadline.after(10), warm_start=slow)
    assert plan.value_s == 7.0 and plan.optimal
    with pytest.raises(DivimlInputError, match="stage_serial"):
        solve_pipeline_mip(problem, Deadline.after(1), warm_start=Plan(slow.assignment))


def test_identical_gpus_are_one_choice_and_the_mip_matches_slicegraph():
    workload = load_workload("random:kernels=12,seed=2", "gpu4", "roofline")
    problem = pipeline(workload.graph, workload.platform, workload.costs, 3)
    heuristic = get_solver("slicegraph", seed=0, time_limit_s=5).solve(problem)
    plan = solve_pipeline_mip(problem, Deadline.after(20), warm_start=heuristic)
    assert plan.optimal and plan.attrs["links_exact"]
    assert plan.value_s == simulated(problem, plan).value_s <= heuristic.value_s
    assert plan.lower_bound_s <= plan.value_s


def test_mip_refuses_other_objectives_and_too_many_stages():
    problem = stage_choice_chain()
    with pytest.raises(DivimlInputError, match="pipeline"):
        solve_pipeline_mip(Problem(problem.graph, problem.platform, problem.costs), Deadline.after(1))
    with pytest.raises(DivimlInputError, match="4 stages need 4 devices"):
        solve_pipeline_mip(pipeline(problem.graph, problem.platform, problem.costs, 4), Deadline.after(1))


# ---------------------------------------------------------------------- lower bounds
@settings(max_examples=examples(30), deadline=None)
@given(st.one_of(pipeline_problems(), pipeline_problems(max_kernels=4, uneven_links=True)))
def test_every_bound_lies_below_the_optimum(problem):
    optimum = best_pipeline(problem)
    parts = lower_bounds(problem, Deadline.after(5), search=True)
    assert {"average_load", "largest_kernel", "neighbourhood", "separation", "lp_load", "downsets"} <= set(parts)
    # the DP, where it proves the optimum, stops the MIPs
    mips = pipeline_bounds(problem, Deadline.after(5), downsets=False)
    assert {"three_superblock", "guess_bottleneck", "exact_mip"} <= set(mips)
    for name, bound in (parts | mips).items():
        assert bound <= optimum * (1 + TOLERANCE), name


def chain_1_1_10(stages=2):
    """a -> b -> c taking 1, 1 and 10 s on every device; a sends 7 bytes to b (8 s on a link), b sends
    nothing: the best is [a, b] | [c] = 10 ([a] | [b, c] costs 9 | 19, one stage 12)."""
    platform = unit_platform()
    graph = graph_of([("a", "b", 7), ("b", "c", 0)])
    return pipeline(graph, platform, table(platform, {"a": 1, "b": 1, "c": 10}), stages)


def test_guessing_the_bottleneck_is_valid_only_as_the_minimum_over_positions():
    problem = chain_1_1_10()
    data = PipelineData.of(problem)
    cheap = [cheapest_pricing(problem, data)] * 3
    # Block 1 the bottleneck: [a, b] | [c] breaks the guess (2 < 10), so all in block 1: 12 > the optimum 10.
    # (Were f(B) not priced exactly, the MIP would book a's tensor as leaving B and reach 10.)
    first = superblock_bound(data, cheap, (0, 1), guess=True, deadline=Deadline.after(10))
    second = superblock_bound(data, cheap, (1, 0), guess=True, deadline=Deadline.after(10))
    assert close(first, 12.0) and close(second, 10.0)
    parts = pipeline_bounds(problem, Deadline.after(10), downsets=False)
    assert close(parts["guess_bottleneck"], 10.0) and close(parts["three_superblock"], 10.0)
    assert best_pipeline(problem) == 10.0
    assert parts["average_load"] == 6.0 and parts["largest_kernel"] == 10.0
    # the downset DP proves the optimum itself, and then no MIP runs
    solved = pipeline_bounds(problem, Deadline.after(10))
    assert set(solved) == {"average_load", "largest_kernel", "neighbourhood", "separation", "downsets"}
    assert solved["downsets"] == 10.0


def test_mips_left_out_for_time_keep_the_minimum_over_positions_valid(monkeypatch, caplog):
    """On 10,000 kernels one superblock model takes seconds to build: where a build is stopped, the
    MIPs left are not started, and the positions not tried keep the floor in the minimum (position 1
    alone gives 12, above the optimum 10)."""
    import tvm_diviml.bounds.pipeline as bounds

    problem = chain_1_1_10()

    def stopped_at_position_2(data, pricings, capacities, **options):
        if options["guess"] and capacities == (1, 0):
            raise BuildStopped("the superblocks MIP was not built within its time")
        return superblock_bound(data, pricings, capacities, **options)

    monkeypatch.setattr(bounds, "superblock_bound", stopped_at_position_2)
    stats: dict = {}
    with caplog.at_level("INFO", logger="tvm_diviml.bounds.pipeline"):
        parts = pipeline_bounds(problem, Deadline.after(10), downsets=False, stage_cover=False, stats=stats)
    assert parts["guess_bottleneck"] <= best_pipeline(problem) == 10.0
    assert close(parts["three_superblock"], 10.0) and "exact_mip" not in parts
    assert stats["stopped_by_time"] == 2 and "2 of 5 MIPs left out" in caplog.text


def test_the_not_repeatable_warning_counts_the_stage_cover_among_the_searches(monkeypatch, caplog):
    """A node-limited bound that the clock stopped says how many of its searches it stopped, the
    cover among them (it read "5 of 4 MIPs" where the cover and four MIPs were stopped)."""
    import tvm_diviml.bounds.pipeline as bounds

    monkeypatch.setattr(bounds, "timed_stage_cover", lambda *args, **options: (None, 1))
    stats: dict = {}
    with caplog.at_level("WARNING", logger="tvm_diviml.bounds.pipeline"):
        pipeline_bounds(chain_1_1_10(), Deadline.after(10), downsets=False, max_nodes=50, stats=stats)
    assert stats["stopped_by_time"] == 1 and stats["mips"] == 5
    assert "1 of 6 searches (the MIPs and the stage cover) stopped" in caplog.text


def test_a_model_past_its_build_deadline_stops_building():
    problem = chain_1_1_10()
    data = PipelineData.of(problem)
    builder = MipBuilder("late", "highs", 1.0, Deadline.after(0.0))
    x = [builder.m.add_var(var_type="B") for _ in range(data.n)]
    with pytest.raises(BuildStopped, match="the late MIP was not built within its time"):
        builder.block_cost(x, data, cheapest_pricing(problem, data))


def test_three_superblocks_price_the_transfers_lb0_ignores():
    # a -> b -> c -> d, 1 s each, 4-byte tensors (5 s on a link), two stages: LB0 is 2, any cut costs 5 + 5 = 10
    # on one side, so the best is all four in one stage: 4. Every superblock split pays a cut too.
    platform = unit_platform()
    graph = graph_of([("a", "b", 4), ("b", "c", 4), ("c", "d", 4)])
    problem = pipeline(graph, platform, table(platform, {k: 1 for k in "abcd"}), 2)
    parts = pipeline_bounds(problem, Deadline.after(10), downsets=False)
    assert parts["average_load"] == 2.0 and best_pipeline(problem) == 4.0
    assert close(parts["three_superblock"], 4.0) and close(parts["guess_bottleneck"], 4.0)


def test_bounds_stay_cheap_without_a_mip_budget():
    parts = lower_bounds(stage_choice_chain())
    assert set(parts) == {"average_load", "largest_kernel", "neighbourhood", "separation", "lp_load"}
    # Cheapest devices: a 2 (B), b 1 (C), c 1 + output 2 (C) or 100 + 0 on the host A: 6 over two stages;
    # the dearest kernel with what it reads: a on B with its input, 2 + 2.
    assert parts["average_load"] == 3.0 and parts["largest_kernel"] == 4.0


def test_the_load_lp_charges_each_stage_the_outputs_it_returns():
    # x and y, 1 s anywhere, each a 1-byte model output (2 s back to the host A from B or C): only A's stage
    # returns nothing, so A takes T of the work and B and C T / 3 each: 2 = 5T / 3 (without the returns 2 / 3).
    platform = unit_platform()
    graph = graph_of([], kernels=["x", "y"], output_bytes={"x": 1, "y": 1})
    problem = pipeline(graph, platform, table(platform, {"x": 1, "y": 1}), 2)
    parts = lower_bounds(problem)
    assert parts["average_load"] == 1.0 and close(parts["lp_load"], 1.2) and best_pipeline(problem) == 2.0


@settings(max_examples=examples(30), deadline=None)
@given(dag_problems(max_kernels=5, transfer_model="host_staged"))
def test_lp_load_bounds_host_staged_plans(case):
    graph, platform, costs = case
    problem = Problem(graph, platform, costs, objective="throughput")
    assert problem.mode == "host_staged"
    parts = lower_bounds(problem)
    best = min(
        simulate(
            Problem(graph, platform, costs),
            Plan(dict(zip(graph.kernels, devices)), objective="throughput", mode="host_staged"),
        ).value_s
        for devices in itertools.product(DEVICES, repeat=len(graph))
    )
    assert parts["lp_load"] <= best * (1 + TOLERANCE)


def test_bounds_of_mips_stopped_early_still_lie_below_a_found_plan():
    """MIPs stopped before their proof, by a node limit (the same stop on every run, however loaded
    the machine) and by short time budgets (wherever the clock stops them), give bounds below a plan:
    a stopped MIP's bound, never its incumbent. The plan comes from a SliceGraph run that stops after
    its generations, not at a time."""
    workload = load_workload("random:kernels=30,seed=3", "gpu4", "roofline")
    problem = pipeline(workload.graph, workload.platform, workload.costs, 4)
    slicegraph = get_solver("slicegraph", seed=0, time_limit_s=3600, generations=10, stall_generations=10)
    value = slicegraph.solve(problem).value_s
    only_mips = {"downsets": False, "stage_cover": False, "exact_mip": False, "superblock_positions": 2}
    stopped = pipeline_bounds(problem, Deadline.after(3600), max_nodes=1, **only_mips)
    assert {"three_superblock", "guess_bottleneck"} <= set(stopped)
    assert stopped["guess_bottleneck"] < value * (1 - TOLERANCE)  # stopped before it proved the plan optimal
    short = [pipeline_bounds(problem, Deadline.after(budget_s), **only_mips) for budget_s in (0.05, 0.5)]
    for parts in (stopped, *short):
        assert all(bound <= value for bound in parts.values())


def test_a_colocation_group_bounds_every_mode_by_its_work_on_its_cheapest_common_device():
    from tvm_diviml.bounds import lower_bounds
    from tvm_diviml.graph import Kernel
    from tvm_diviml.solvers import Problem

    from ..helpers import table, unit_platform

    platform = unit_platform()
    graph = OpGraph([Kernel("a", colocate="g"), Kernel("b", colocate="g", allowed_devices=("A", "B")), Kernel("c")], [])
    costs = table(platform, {"a": {"A": 5.0, "B": 3.0, "C": 1.0}, "b": {"A": 5.0, "B": 4.0, "C": 1.0}, "c": 1.0})
    for objective, stages in (("latency", None), ("throughput", None), ("pipeline", 3)):
        parts = lower_bounds(Problem(graph, platform, costs, objective=objective, stages=stages))
        assert parts["largest_group"] == 7.0  # a and b together on B (C may not run b)


def test_the_neighbourhood_bound_holds_for_any_number_of_stages():
    """b (5 s) reads a's 3-byte tensor (4 s on a unit link; a takes 6 s) and sends 4 bytes (5 s) to c
    (1 s): its stage pays 5 + min(6, 4) + min(5, 1) = 10 however many stages there are."""
    platform = unit_platform()
    graph = graph_of([("a", "b", 3), ("b", "c", 4)])
    for stages in (1, 2, 3):
        problem = pipeline(graph, platform, table(platform, {"a": 6, "b": 5, "c": 1}), stages)
        assert close(lower_bounds(problem)["neighbourhood"], 10.0)
        assert best_pipeline(problem) >= 10.0 * (1 - TOLERANCE)


def test_the_separation_bound_prices_the_tensors_no_plan_keeps_inside_a_stage():
    """a -> b -> c -> d, 5 s each, and a -> d; every tensor 1 byte (2 s on a unit link, paid by the
    stage it leaves and the one it enters). Below a period of 20 s no stage holds a and d, hence
    nothing between them: a's tensor crosses in every such plan, so 2 T >= 20 + 2 + 2 and T >= 12,
    where the average load says 10. The best plan, [a, b] | [c, d], takes 14."""
    platform = unit_platform()
    graph = graph_of([("a", "b", 1), ("b", "c", 1), ("c", "d", 1), ("a", "d", 1)])
    problem = pipeline(graph, platform, table(platform, dict.fromkeys("abcd", 5)), 2)
    parts = lower_bounds(problem)
    assert close(parts["average_load"], 10.0) and close(parts["separation"], 12.0)
    assert close(best_pipeline(problem), 14.0)


@settings(max_examples=examples(20), deadline=None)
@given(pipeline_problems(), st.randoms(use_true_random=False))
def test_the_kept_stage_prices_are_each_kernels_own(problem, rng):
    """stage_work and link_prices keep the whole graph's prices in problem.memo; any part of the graph,
    in any order, asked again, gets each kernel's own."""
    from tvm_diviml.toolkit.pipeline_model import link_prices, stage_work

    names = list(problem.graph.kernels)
    for device in problem.platform.device_names:
        stage_work(problem, names, device)
        part = rng.sample(names, rng.randint(0, len(names)))
        work, feasible = stage_work(problem, part, device)
        for v, k in enumerate(part):
            assert feasible[v] == (device in problem.feasible_devices(k))
            direct = problem.costs.compute_s(k, device) + problem.output_return_s(k, device, empty_pays_latency=True)
            assert work[v] == (direct if feasible[v] else 0.0)
    devices = problem.platform.device_names
    cheapest, _ = link_prices(problem, devices)
    for edge in problem.graph.edges:
        want = min(problem.costs.transfer_s(edge.bytes, a, b) for a in devices for b in devices if a != b)
        assert cheapest(edge.bytes) == cheapest(edge.bytes) == want
    assert link_prices(problem, devices)[0] is cheapest
