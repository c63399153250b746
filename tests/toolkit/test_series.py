"""Series decomposition: cut kernels and blocks, and the DP over the cuts' devices against brute force."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_diviml.app.report import solve_and_report
from tvm_diviml.bounds import lower_bounds
from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph
from tvm_diviml.problem import Problem
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import get_solver
from tvm_diviml.toolkit.cpsat_session import CpsatSession
from tvm_diviml.toolkit.deadline import Deadline
from tvm_diviml.toolkit.series import decomposable, series_decomposition, series_plan

from ..bruteforce import best_latency
from ..helpers import examples, graph_of, table, unit_platform
from ..strategies import DEVICES


def test_cut_kernels_are_those_every_input_to_output_path_passes():
    # a -> (b | c) -> d -> e, and x reads the model input beside a: a is no cut, d and e are.
    graph = graph_of([("a", "b", 1), ("a", "c", 1), ("b", "d", 1), ("c", "d", 1), ("d", "e", 1), ("x", "d", 1)])
    series = series_decomposition(graph)
    assert series.cuts == ["d", "e"]
    assert [sorted(block) for block in series.blocks] == [["a", "b", "c", "x"], [], []]
    assert series.segment(0)[-1] == "d" and series.segment(2) == []


def test_an_output_in_the_middle_is_a_way_around_the_cuts_after_it():
    graph = graph_of([("a", "b", 1), ("b", "c", 1)], outputs=["b", "c"])
    assert series_decomposition(graph).cuts == ["a", "b"]


def test_memory_and_colocation_make_the_decomposition_inexact():
    # two 6-byte weights: a device of 12 bytes holds both (segments cannot compete), one of 10 does not
    graph = graph_of([("a", "b", 1), ("b", "c", 1)], weights={"u": 6, "w": 6}, kernel_weights={"a": ["u"], "c": ["w"]})
    roomy = Problem(graph, unit_platform(memory=12), table(unit_platform(), {"a": 1, "b": 1, "c": 1}))
    tight = Problem(graph, unit_platform(memory=10), table(unit_platform(), {"a": 1, "b": 1, "c": 1}))
    assert decomposable(roomy, series_decomposition(graph)) is None
    assert "memory can bind on A, B, C" in decomposable(tight, series_decomposition(graph))
    grouped = OpGraph(
        [Kernel("a"), Kernel("b", colocate="g"), Kernel("c", colocate="g")], [Edge("a", "b", 1), Edge("b", "c", 1)]
    )
    problem = Problem(grouped, unit_platform(), table(unit_platform(), {"a": 1, "b": 1, "c": 1}))
    assert "co-location" in decomposable(problem, series_decomposition(grouped))


@st.composite
def chains_of_blocks(draw):
    """Cut kernels c0..cm joined by blocks of 0-2 kernels each (every block kernel reads the cut before
    it and feeds the cut after it, some also each other); at most 7 kernels for the brute force."""
    kernels, edges = ["c0"], []
    blocks = draw(st.lists(st.integers(0, 2), min_size=1, max_size=3))
    for index, size in enumerate(blocks, start=1):
        members = [f"b{index}_{j}" for j in range(size)]
        if len(kernels) + size + 1 > 7:
            break
        kernels += members + [f"c{index}"]
        edges += [Edge(f"c{index - 1}", m, draw(st.integers(0, 4))) for m in members]
        edges += [Edge(m, f"c{index}", draw(st.integers(0, 4))) for m in members]
        if size == 2 and draw(st.booleans()):
            edges.append(Edge(members[0], members[1], draw(st.integers(0, 4))))
        if not members:
            edges.append(Edge(f"c{index - 1}", f"c{index}", draw(st.integers(0, 4))))
    graph = OpGraph(
        [Kernel(k, output_bytes=draw(st.integers(0, 3))) for k in kernels],
        edges,
        inputs=[GraphInput("x", draw(st.integers(0, 4)), ("c0",))],
    )
    platform = unit_platform(latency=draw(st.sampled_from([0.0, 0.5])), bandwidth=draw(st.sampled_from([1.0, 2.0])))
    times = {k: {d: float(draw(st.integers(1, 9))) for d in DEVICES} for k in kernels}
    return graph, platform, table(platform, times)


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains_of_blocks())
def test_the_series_dp_finds_the_brute_force_optimum_and_a_bound_below_it(case):
    graph, platform, costs = case
    problem = Problem(graph, platform, costs)
    optimum, _ = best_latency(graph, platform, costs)
    with CpsatSession(seed=0) as session:
        plan = series_plan(problem, session, Deadline.after(60), segment_time_limit_s=10)
    sim = simulate(Problem(graph, platform, costs), plan)
    assert plan.value_s == sim.value_s and sim.feasible
    assert plan.value_s == pytest.approx(optimum, rel=1e-9, abs=1e-12)
    assert plan.lower_bound_s <= optimum * (1 + 1e-9) and plan.optimal
    # what every latency report gets, given time
    series = lower_bounds(problem, Deadline.after(10), search=True)["series"]
    assert series <= optimum * (1 + 1e-9) and series == pytest.approx(optimum, rel=1e-6)


def chain_of_three_blocks() -> tuple[Problem, float]:
    """c0 -> three parallel kernels -> c1 -> c2, on three unrelated devices; and its optimum."""
    edges = [("c0", f"b{i}", 2) for i in range(3)] + [(f"b{i}", "c1", 1) for i in range(3)] + [("c1", "c2", 3)]
    graph = graph_of(edges, inputs=[("x", 4, ("c0",))])
    platform = unit_platform(latency=0.5, bandwidth=2.0)
    costs = table(platform, {k: {"A": 3.0, "B": 1.0 + i % 3, "C": 2.0} for i, k in enumerate(graph.kernels)})
    return Problem(graph, platform, costs), best_latency(graph, platform, costs)[0]


def test_split_and_cpsat_prove_a_chain_of_blocks_by_its_segments():
    problem, optimum = chain_of_three_blocks()
    for name in ("split", "cpsat"):
        plan = get_solver(name).solve(problem)
        assert plan.optimal and plan.value_s == pytest.approx(optimum, rel=1e-9)
        assert plan.series["cuts"] == 3 and plan.series["segment_solves_proven"] > 0


def test_a_heuristic_report_carries_the_series_bound():
    problem, optimum = chain_of_three_blocks()
    _, _, cheap = solve_and_report(problem, "greedy", "chain", "table")
    _, _, row = solve_and_report(problem, "greedy", "chain", "table", bound_time_limit_s=10)
    assert cheap["lower_bound_s"] < optimum * (1 - 1e-6)  # the cheap bounds miss it here
    assert row["lower_bound_s"] == pytest.approx(optimum, rel=1e-6) and row["lower_bound_parts"]["series"]


def test_a_segment_too_large_to_model_in_time_is_not_decomposed(monkeypatch):
    """A sparse random DAG of 2,000 kernels on 64 GPUs: one segment's model priced 24 million transfers and
    took minutes to build before the time limit was looked at."""
    from tvm_diviml.presets import get_platform
    from tvm_diviml.synthetic import random_dag
    from tvm_diviml.toolkit import series as series_module

    graph = random_dag(40, seed=1)
    platform = get_platform("gpu8")
    problem = Problem(graph, platform, table(platform, {k: 1.0 for k in graph.kernels}))
    series = series_decomposition(graph)
    prices = series_module.largest_segment_prices(problem, series)
    assert prices == 64 * max(sum(len(graph.pred[k]) for k in series.segment(i)) for i in range(len(series.cuts) + 1))
    assert series_module.series_obstacle(problem, series) is None
    monkeypatch.setattr(series_module, "MAX_PRICES", prices - 1)
    assert "prices" in series_module.series_obstacle(problem, series)


def test_the_series_dp_gives_up_once_the_time_limit_has_passed():
    graph = graph_of([("a", "b", 1), ("b", "c", 1), ("b", "d", 1), ("c", "e", 1), ("d", "e", 1)])
    platform = unit_platform()
    problem = Problem(graph, platform, table(platform, {k: 1.0 for k in graph.kernels}))
    with CpsatSession(seed=0) as session:
        assert series_plan(problem, session, Deadline.after(30), segment_time_limit_s=5) is not None
        assert series_plan(problem, session, Deadline.after(0), segment_time_limit_s=5) is None
