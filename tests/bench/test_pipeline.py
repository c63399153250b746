"""The pipeline benchmark (`diviml bench --suite pipeline`) in its quick configuration, and the
pricing of msr-fiddle graphs on K identical accelerators."""

from __future__ import annotations

import math
from statistics import geometric_mean

import pytest

from tvm_diviml.bench import PAPER_PIPELINE_RATIOS, fiddle_accelerators, suite_pipeline
from tvm_diviml.msr_fiddle import read_msr_fiddle
from tvm_diviml.plan import Plan
from tvm_diviml.problem import Problem
from tvm_diviml.simulator import simulate

from ..helpers import hand_file


@pytest.fixture(scope="module")
def rows():
    return list(suite_pipeline(time_limit_s=1.0, bound_time_limit_s=1.0, quick=True, stages=(2, 4)))


def test_every_row_is_slicegraph_against_a_bound_below_it(rows):
    measured = [row for row in rows if row["group"] != "summary"]
    assert {row["stages"] for row in measured} == {2, 4}
    for row in measured:
        assert row["stages"] <= row["kernels"] / 4
        assert row["best_value_s"] <= row["slicegraph_value_s"]
        assert 0 < row["lower_bound_s"] <= row["best_value_s"] * (1 + 1e-9), row
        assert row["ratio"] == pytest.approx(row["lower_bound_s"] / row["best_value_s"])
        assert row["slicegraph_ratio"] == pytest.approx(row["lower_bound_s"] / row["slicegraph_value_s"])
        assert row[f"bound_{row['bound_from']}_s"] == row["lower_bound_s"]


def test_summaries_are_the_geometric_means_beside_the_paper(rows):
    summaries = {row["stages"]: row for row in rows if row["group"] == "summary"}
    for count, summary in summaries.items():
        members = [row for row in rows if row["group"] != "summary" and row["stages"] == count]
        assert summary["graphs"] == len(members)
        assert summary["ratio_geomean"] == pytest.approx(geometric_mean([row["ratio"] for row in members]))
        assert summary["paper_ratio"] == PAPER_PIPELINE_RATIOS[count]


def test_an_msr_fiddle_graph_on_k_accelerators_keeps_its_own_prices():
    graph, _, costs = read_msr_fiddle(
        hand_file(
            nodes=[
                {"id": i, "supportedOnFpga": int(i != 2), "cpuLatency": 10.0, "fpgaLatency": float(i), "size": 30.0}
                for i in (1, 2, 3, 4)
            ]
        )
    )
    free, platform, priced = fiddle_accelerators(graph, costs, 3)
    assert platform.device_names == ["acc0", "acc1", "acc2"]
    assert all(kernel.allowed_devices is None for kernel in free.kernels.values())
    assert priced.compute_s("1", "acc2") == pytest.approx(1e-3)
    assert priced.compute_s("2", "acc1") == pytest.approx(10e-3)  # CPU-only in the file: its CPU time
    # stages {1, 2} | {3, 4}: 1 and 2 send their tensors once (0.5 + 0.25 ms), stage 2 receives both
    plan = Plan(
        {"1": "acc0", "2": "acc0", "3": "acc1", "4": "acc1"},
        objective="pipeline",
        mode="stage_serial",
        stages=[["1", "2"], ["3", "4"]],
        stage_devices=["acc0", "acc1"],
    )
    sim = simulate(Problem(free, platform, priced), plan)
    assert sim.stage_cost_s == pytest.approx([11e-3 + 0.75e-3, 7e-3 + 0.75e-3])
    assert not math.isinf(sim.value_s)


def test_past_the_ideal_cap_node_limited_mips_give_the_same_bounds_every_run():
    from tvm_diviml.app.workload import load_workload
    from tvm_diviml.bench.pipeline import pipeline_solves

    from ..helpers import pipeline

    workload = load_workload("random:kernels=12,seed=2", "gpu4", "roofline")
    problem = pipeline(workload.graph, workload.platform, workload.costs, 3)
    # one ideal at most: the DP declines, the MIPs must bound it
    first, second = (pipeline_solves(problem, 1.0, 60.0, 20_000, mip_nodes=5, dp_ideals=1) for _ in range(2))
    assert first["downsets_value_s"] is None and first["repeatable"] and first["mip_nodes"] == 5
    bounds = {key: value for key, value in first.items() if key.startswith("bound_") and key != "bound_s"}
    assert {"bound_exact_mip_s", "bound_three_superblock_s", "bound_guess_bottleneck_s"} <= set(bounds)
    assert bounds == {key: second[key] for key in bounds}
    assert first["lower_bound_s"] <= first["best_value_s"] * (1 + 1e-9)
