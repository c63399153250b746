"""The LLM benchmark (`diviml bench --suite llm`) in its quick configuration, run through the CLI: each
row's figures must agree with each other and with the bounds they claim; the summaries with the rows."""

from __future__ import annotations

import itertools
import json

import pytest

from tvm_diviml.bench import LLM_FULL_SOLVERS, LLM_OBJECTIVES, LLM_PLATFORMS, LLM_TARGETS, llm_summaries
from tvm_diviml.cli import main
from tvm_diviml.cost.roofline import RooflineCostModel
from tvm_diviml.presets import get_platform
from tvm_diviml.solvers import Problem, full_graph_solver
from tvm_diviml.synthetic import random_dag

TOLERANCE = 1e-9  # relative: a MILP's proven bound may sit a rounding error above the simulated optimum
TIME_LIMIT_S = 2.0
EVERY_FULL = {name for names in LLM_FULL_SOLVERS.values() for name in names}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The quick suite through the CLI (slow: it extracts a model and solves it ten times, ~40 s)."""
    folder = tmp_path_factory.mktemp("llm")
    rows_path, table_path = folder / "rows.json", folder / "table.md"
    assert (
        main(
            [
                "bench",
                "--suite",
                "llm",
                "--quick",
                "--time-limit",
                str(TIME_LIMIT_S),
                "--json",
                str(rows_path),
                "--markdown",
                str(table_path),
            ]
        )
        == 0
    )
    return json.loads(rows_path.read_text()), table_path.read_text()


@pytest.fixture(scope="module")
def rows(run):
    return run[0]


def measured(rows):
    return [row for row in rows if row["model"] != "summary"]


@pytest.mark.slow
def test_every_platform_and_objective_has_a_row_and_the_table_has_them_all(run):
    rows, table = run
    assert sorted((row["platform"], row["objective"]) for row in measured(rows)) == sorted(
        itertools.product(LLM_PLATFORMS, LLM_OBJECTIVES)
    )
    assert len(table.splitlines()) == len(rows) + 2
    assert len({row["kernels"] for row in measured(rows)}) == 1  # one model, extracted once


@pytest.mark.slow
def test_the_symmetric_value_is_above_its_bound_and_the_gap_is_measured_against_it(rows):
    for row in measured(rows):
        value, bound = row["symmetric_value_s"], row["symmetric_bound_s"]
        assert row["symmetric_fallback"] is None, row  # llama has repeated blocks
        assert 0 < bound <= value * (1 + TOLERANCE)
        assert row["symmetric_gap"] == pytest.approx(value / bound - 1, abs=1e-12)


@pytest.mark.slow
def test_the_best_bound_is_below_every_plan_and_names_its_source(rows):
    for row in measured(rows):
        values = [row["symmetric_value_s"]] + [
            row[f"{name}_value_s"] for name in EVERY_FULL if row[f"{name}_value_s"] is not None
        ]
        assert row["symmetric_bound_s"] <= row["best_bound_s"] <= min(values) * (1 + TOLERANCE)
        assert row["bound_from"] in {"symmetric", *EVERY_FULL}


@pytest.mark.slow
def test_comparisons_are_the_value_and_time_ratios_of_the_objectives_solvers(rows):
    for row in measured(rows):
        full = LLM_FULL_SOLVERS[row["objective"]]
        best = min(row[f"{name}_value_s"] for name in full)
        assert row[f"{row['full_solver']}_value_s"] == best  # the best full plan (the faster on a tie)
        assert row[f"{row['full_solver']}_solve_s"] == min(
            row[f"{name}_solve_s"] for name in full if row[f"{name}_value_s"] == best
        )
        for name in EVERY_FULL:
            value = row[f"{name}_value_s"]
            if name not in full:
                assert value is None and row[f"{name}_solve_s"] is None
                continue
            assert value > 0 and row[f"{name}_solve_s"] > 0
            assert row[f"symmetric_vs_{name}_pct"] == pytest.approx(100 * (row["symmetric_value_s"] / value - 1))
            assert row[f"{name}_timed_out"] == (row[f"{name}_solve_s"] >= 0.98 * TIME_LIMIT_S)
        assert row["symmetric_vs_full_pct"] == row[f"symmetric_vs_{row['full_solver']}_pct"]
        assert row["speedup"] == pytest.approx(row[f"{row['full_solver']}_solve_s"] / row["symmetric_solve_s"])
        first = row["symmetric_first_plan_s"]
        assert 0 < first <= row["symmetric_solve_s"] and row["symmetric_first_value_s"] >= row["symmetric_value_s"]
        assert row["first_plan_speedup"] == pytest.approx(row[f"{row['full_solver']}_solve_s"] / first)
        assert row["symmetric_first_vs_full_pct"] >= row["symmetric_vs_full_pct"] - 1e-9
        for name in full:
            assert 0 < row[f"{name}_first_plan_s"] <= row[f"{name}_solve_s"]


@pytest.mark.slow
def test_targets_are_judged_only_from_24_layers(rows):
    for row in measured(rows):
        assert row["layers"] < LLM_TARGETS["from_layers"]
        assert row["meets_value_target"] is None and row["meets_speed_target"] is None


@pytest.mark.slow
def test_one_summary_per_objective_holds_the_worst_rows(rows):
    summaries = [row for row in rows if row["model"] == "summary"]
    assert [row["objective"] for row in summaries] == list(LLM_OBJECTIVES)
    for summary in summaries:
        members = [row for row in measured(rows) if row["objective"] == summary["objective"]]
        assert summary["symmetric_vs_full_pct"] == max(row["symmetric_vs_full_pct"] for row in members)
        assert summary["speedup"] == min(row["speedup"] for row in members)


def target_row(layers: int, pct: float, speedup: float) -> dict:
    judged = layers >= LLM_TARGETS["from_layers"]
    return {
        "model": f"llama:layers={layers}",
        "layers": layers,
        "objective": "latency",
        "symmetric_vs_full_pct": pct,
        "speedup": speedup,
        "first_plan_speedup": 2 * speedup,
        "meets_value_target": pct <= LLM_TARGETS["symmetric_vs_full_pct"] if judged else None,
        "meets_speed_target": speedup >= LLM_TARGETS["speedup"] if judged else None,
    }


@pytest.mark.parametrize(
    "pct, speedup, met", [(1.5, 60.0, (True, True)), (2.5, 60.0, (False, True)), (-0.5, 10.0, (True, False))]
)
def test_summaries_judge_only_rows_with_enough_layers(pct, speedup, met):
    rows = [target_row(8, 9.0, 1.0), target_row(24, 0.5, 400.0), target_row(48, pct, speedup)]
    (summary,) = llm_summaries(rows)
    assert summary["symmetric_vs_full_pct"] == max(0.5, pct)  # the 8-layer row's 9% does not count
    assert summary["speedup"] == min(400.0, speedup)
    assert summary["first_plan_speedup"] == 2 * min(400.0, speedup)
    assert (summary["meets_value_target"], summary["meets_speed_target"]) == met


def test_bench_refuses_an_option_the_llm_suite_does_not_take(capsys):
    assert main(["bench", "--suite", "llm", "--bound-time-limit", "1"]) == 2
    assert "--bound-time-limit" in capsys.readouterr().err


@pytest.mark.parametrize("objective", LLM_OBJECTIVES)
def test_the_first_full_solver_is_what_auto_runs_on_the_whole_graph(objective):
    graph, platform = random_dag(6, seed=0), get_platform(LLM_PLATFORMS[0])
    problem = Problem(graph, platform, RooflineCostModel(graph, platform), objective=objective)
    assert LLM_FULL_SOLVERS[objective][0] == full_graph_solver(problem)
