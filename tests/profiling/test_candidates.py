"""Keeping the fastest measured plan (tvm_diviml/profiling/candidates.py): which plans are candidates, and the
choice among them with timings given (no TVM, no clock)."""

from __future__ import annotations

import json
import math
import re

import pytest

from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.plan import Plan
from tvm_diviml.presets import get_platform
from tvm_diviml.profiling.candidates import Candidate, candidate_plans, format_selection, plan_key, select_fastest
from tvm_diviml.solvers import Problem, get_solver
from tvm_diviml.synthetic import branchy

from ..helpers import graph_of


@pytest.fixture
def problem():
    graph = branchy(branches=3, depth=2)
    platform = get_platform("paper-node")
    costs = TableCostModel(
        platform,
        {
            k: {d: (1 + i % 3) * 1e-3 * (1 + j) for j, d in enumerate(platform.device_names)}
            for i, k in enumerate(graph.kernels)
        },
    )
    return Problem(graph, platform, costs, objective="latency")


def test_candidates_are_distinct_ranked_by_prediction_and_keep_the_best_single_device(problem):
    chosen = get_solver("heft").solve(problem)
    for count in (1, 2, 10):
        candidates = candidate_plans(problem, chosen, count)
        keys = [plan_key(c.plan) for c in candidates]
        assert len(set(keys)) == len(keys)
        singles = [c for c in candidates if len(c.plan.devices_used()) == 1]
        best_single = min(
            problem.platform.device_names,
            key=lambda d: sum(problem.costs.compute_s(k, d) for k in problem.graph.kernels),
        )
        assert any(c.plan.devices_used() == [best_single] for c in singles), count
        ranked = [c.predicted_s for c in candidates[:count]]
        assert ranked == sorted(ranked)  # the count best by prediction ...
        if len(candidates) == count + 1:  # ... then the best single device, if not among them
            assert candidates[-1].plan.devices_used() == [best_single]
        assert len(candidates) <= count + 1
    every = candidate_plans(problem, chosen, 10)
    assert {d for c in every if len(c.plan.devices_used()) == 1 for d in c.plan.devices_used()} == set(
        problem.platform.device_names
    )  # each device alone, when the count allows


def test_the_fastest_measured_wins_whatever_was_predicted():
    plans = [Plan({"a": d}) for d in ("cpu", "gpu0", "gpu1")]
    candidates = [
        Candidate("predicted best", plans[0], 1e-3),
        Candidate("predicted worst", plans[1], 9e-3),
        Candidate("whole CPU", plans[2], None, threads=8),
    ]
    timings = {"predicted best": 5e-3, "predicted worst": 2e-3, "whole CPU": 4e-3}
    selection = select_fastest(candidates, lambda c: timings[c.label])
    assert selection.winner.label == "predicted worst"
    assert [c.label for c in selection.candidates] == ["predicted worst", "whole CPU", "predicted best"]
    assert selection.margin == pytest.approx(2.0)
    row = json.loads(json.dumps(selection.to_json()))
    assert row["winner"] == "predicted worst" and row["margin"] == pytest.approx(2.0)
    assert [(c["label"], c["predicted_s"], c["measured_s"]) for c in row["candidates"]] == [
        ("predicted worst", 9e-3, 2e-3),
        ("whole CPU", None, 4e-3),
        ("predicted best", 1e-3, 5e-3),
    ]
    text = format_selection(selection)
    assert re.search(r"predicted worst .*<- kept", text) and "not predicted" in text
    assert "kept predicted worst: 2.00x faster than the next candidate (whole CPU)" in text


def test_a_tie_goes_to_the_earlier_candidate_and_wrong_outputs_never_win():
    plans = [Plan({"a": d}) for d in ("cpu", "gpu0", "gpu1")]
    candidates = [
        Candidate("first", plans[0], 1.0),
        Candidate("second", plans[1], 1.0),
        Candidate("wrong outputs", plans[2], 1.0),
    ]
    timings = {"first": 3.0, "second": 3.0, "wrong outputs": math.inf}
    selection = select_fastest(candidates, lambda c: timings[c.label])
    assert selection.winner.label == "first"


def test_no_candidates_and_a_count_below_one_are_refused(problem):
    with pytest.raises(DivimlInputError, match="no candidate plans"):
        select_fastest([], lambda c: 1.0)
    with pytest.raises(DivimlInputError, match="--candidates"):
        candidate_plans(problem, get_solver("heft").solve(problem), 0)


def test_a_stream_always_times_the_replicated_plans_and_the_best_pipeline_and_leaves_cycles_out():
    """On two CPUs a chain a -> b -> c -> d: the whole model replicated and a 2-stage pipeline are
    candidates whatever their rank, each priced as its stream runs (with its inputs in flight); a plan
    that goes cpu0 -> cpu1 -> cpu0 is listed, not built, with why."""
    from tvm_diviml.simulator import stream_price

    graph = graph_of([("a", "b", 4), ("b", "c", 4), ("c", "d", 4)])
    platform = get_platform("cpu2")
    costs = TableCostModel(platform, {k: {d: 1e-3 for d in platform.device_names} for k in "abcd"})
    problem = Problem(graph, platform, costs, objective="throughput")
    cyclic = Plan({"a": "cpu0", "b": "cpu1", "c": "cpu0", "d": "cpu0"}, objective="throughput", mode="period_overlap")
    cyclic.solver = "hand"
    candidates = candidate_plans(problem, cyclic, 1)
    by_label = {c.label: c for c in candidates}
    assert by_label["hand plan"].left_out and "cycle" in by_label["hand plan"].left_out
    replicated = by_label["the whole model replicated"]
    assert replicated.plan.replicas and replicated.left_out is None and replicated.policy == "shares"
    # and the same replicas, each input sent to the replica with the fewest in it: timed, not assumed
    twin = by_label["the whole model replicated, each input to the next free replica"]
    assert twin.plan is replicated.plan and twin.policy == "next_free" and twin.left_out is None
    assert [c.label for c in candidates if c.policy == "next_free"] == [twin.label]  # no twin without replicas
    assert by_label["the best pipeline"].plan.mode == "stage_serial"
    for candidate in candidates:
        price = stream_price(problem, candidate.plan)
        assert candidate.predicted_s == price.period_s and candidate.in_flight == price.in_flight
    assert [c.left_out is None for c in candidates] == sorted((c.left_out is None for c in candidates), reverse=True)
    text = format_selection(select_fastest(candidates, lambda c: 1.0))
    assert "hand plan" in text and "not built: its devices pass tensors back and forth" in text


def test_the_next_free_twin_is_built_from_the_same_executables_with_its_policy(monkeypatch):
    """One executable per route, shared by the replicated plan and its twin; the twin's runner picks
    the next free replica (``RoutedBuild.policy``), the other follows the shares."""
    from tvm_diviml.profiling import timing

    graph = graph_of([("a", "b", 4)])
    platform = get_platform("cpu2")
    costs = TableCostModel(platform, {k: {d: 1e-3 for d in platform.device_names} for k in "ab"})
    problem = Problem(graph, platform, costs, objective="throughput")
    chosen = get_solver("fastest_single_device").solve(problem)
    candidates = [c for c in candidate_plans(problem, chosen, 1) if c.plan.replicas]
    made = []

    def build_runnable(model, extraction, built_for, plan, database=None, progress=None):
        made.append(plan_key(plan))
        return object(), 0.0

    monkeypatch.setattr(timing, "build_runnable", build_runnable)
    builds = timing.build_candidates(None, None, platform, candidates, None, print)
    policies = {c.policy: builds[timing.timing_key(c)][0] for c in candidates}
    assert set(policies) == {"shares", "next_free"} and len(made) == len(set(made)) == 2
    assert all(routed.policy == policy for policy, routed in policies.items())
    assert policies["shares"].builds == policies["next_free"].builds
