"""The latency benchmark (`diviml bench --suite latency`) in its quick configuration: every row's
figures must agree with each other, with the graph they describe and with the bound they claim."""

from __future__ import annotations

import json
import math
import os

import pytest

from tvm_diviml.app.workload import load_workload
from tvm_diviml.bench import LATENCY_RATIOS, MSR_FIDDLE_LATENCY, suite_latency
from tvm_diviml.cli import main
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.solvers import SOLVERS

TOLERANCE = 1e-9  # relative: a MILP's dual bound may sit a rounding error above the simulated optimum


@pytest.fixture(scope="module")
def rows():
    return list(suite_latency(time_limit_s=1.0, quick=True))


def measured(rows):
    return [row for row in rows if row["notes"] != "summary"]


def values_of(row):
    return {
        name: row[f"{name}_value_s"]
        for name in SOLVERS
        if f"{name}_value_s" in row and row[f"{name}_value_s"] is not None
    }


def test_the_bound_is_below_every_value_and_gaps_are_measured_against_it(rows):
    for row in measured(rows):
        bound, values = row["lower_bound_s"], values_of(row)
        assert bound > 0 and values, row["model"]
        for name, value in values.items():
            assert bound <= value * (1 + TOLERANCE), (row["model"], name)
            assert row[f"{name}_gap"] == pytest.approx(value / bound - 1, abs=1e-12)
        assert row["best_value_s"] == min(values.values())
        assert values[row["best_solver"]] == row["best_value_s"]
        assert row["split_over_best"] >= 1 - TOLERANCE
        assert row["bound_over_best"] == pytest.approx(bound / row["best_value_s"], rel=1e-12)


def test_kernel_and_edge_counts_are_the_graphs(rows):
    for row in measured(rows):
        if row["group"] == "msr-fiddle":
            graph = load_workload(os.path.join(MSR_FIDDLE_LATENCY, row["model"])).graph
        else:
            graph = load_workload(row["model"], "paper-node", "roofline").graph
        assert (row["kernels"], row["edges"]) == (len(graph), len(graph.edges))


def test_exact_solvers_prove_small_optima_that_no_solver_beats(rows):
    proven = [row for row in measured(rows) if any(row.get(f"{name}_optimal") for name in ("milp", "cpsat"))]
    assert any(row["kernels"] == 6 for row in proven)  # a 6-kernel DAG is proven well within a second
    for row in proven:
        optimum = min(row[f"{name}_value_s"] for name in ("milp", "cpsat") if row.get(f"{name}_optimal"))
        assert optimum <= row["best_value_s"] * (1 + TOLERANCE)
        assert row["lower_bound_s"] >= optimum * (1 - 1e-6)  # the proof's bound is the row's bound


def test_best_devices_names_where_every_kernel_of_the_best_plan_runs(rows):
    for row in measured(rows):
        counts = [entry.rsplit(" ", 1) for entry in row["best_devices"].split(", ")]
        assert sum(int(count) for _, count in counts) == row["kernels"], row["model"]
        assert len({name for name, _ in counts}) == len(counts) <= row["devices"]


def test_one_summary_row_per_group_holds_geometric_means(rows):
    groups = {row["group"] for row in measured(rows)}
    summaries = [row for row in rows if row["notes"] == "summary"]
    assert sorted(row["group"] for row in summaries) == sorted(groups)
    for summary in summaries:
        members = [row for row in measured(rows) if row["group"] == summary["group"]]
        for key in LATENCY_RATIOS:
            present = [row[key] for row in members if row[key] is not None]
            if not present:
                assert summary[key] is None
                continue
            assert min(present) * (1 - 1e-12) <= summary[key] <= max(present) * (1 + 1e-12)
            assert math.log(summary[key]) == pytest.approx(sum(map(math.log, present)) / len(present), abs=1e-12)


def test_exact_solvers_skip_graphs_above_exact_up_to(tmp_path):
    small, large = measured(
        suite_latency(quick=True, exact_up_to=7, solvers=["heft", "milp"], msr_fiddle_dir=str(tmp_path))
    )
    assert small["kernels"] <= 7 < large["kernels"]
    assert small["milp_value_s"] is not None and large["milp_value_s"] is None
    assert "milp skipped" in large["notes"] and large["heft_value_s"] is not None
    assert large["split_time_over_milp"] is None


def test_missing_msr_fiddle_files_skip_their_rows_with_a_note(tmp_path, caplog):
    rows = measured(suite_latency(quick=True, solvers=["heft"], msr_fiddle_dir=str(tmp_path)))
    assert rows and all(row["group"] == "random" for row in rows)
    assert "msr-fiddle" in caplog.text


def test_groups_pick_rows_and_an_unknown_group_is_named(tmp_path):
    rows = measured(suite_latency(quick=True, solvers=["heft"], msr_fiddle_dir=str(tmp_path), groups=["random"]))
    assert len(rows) == 2 and {row["group"] for row in rows} == {"random"}
    with pytest.raises(DivimlInputError, match="unknown latency group 'zo'"):
        list(suite_latency(quick=True, groups=["zo"]))


def test_unknown_solver_is_refused():
    with pytest.raises(DivimlInputError, match="nope"):
        list(suite_latency(quick=True, solvers=["nope"]))


def test_bench_refuses_options_a_suite_does_not_take(capsys):
    assert main(["bench", "--suite", "simulator", "--quick"]) == 2
    assert "--quick" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_cli_runs_the_quick_latency_suite(tmp_path):
    rows_path, table_path = tmp_path / "rows.json", tmp_path / "table.md"
    assert (
        main(
            [
                "bench",
                "--suite",
                "latency",
                "--quick",
                "--time-limit",
                "1",
                "--json",
                str(rows_path),
                "--markdown",
                str(table_path),
            ]
        )
        == 0
    )
    rows = json.loads(rows_path.read_text())
    assert {row["group"] for row in rows} >= {"random"}
    assert all(row["lower_bound_s"] <= row["best_value_s"] * (1 + TOLERANCE) for row in measured(rows))
    assert len(table_path.read_text().splitlines()) == len(rows) + 2
