"""The schedule picture: a real PNG whose rows and bars are the simulation's, in every cost mode.

Links cost 1 s + 1 s per byte (``unit_platform``); A is the host CPU.
"""

import json
import math
import random
import subprocess
import sys
from collections import Counter

import pytest

from tvm_diviml.cost.roofline import RooflineCostModel
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.gantt import _shorten, draw_schedule, link_label
from tvm_diviml.plan import Plan
from tvm_diviml.presets import get_platform
from tvm_diviml.problem import Problem
from tvm_diviml.simulator import simulate
from tvm_diviml.synthetic import random_dag

from ..helpers import diviml, graph_of, table, unit_platform


def assert_is_a_picture(path):
    from matplotlib.image import imread

    pixels = imread(str(path))
    assert pixels.ndim == 3 and pixels.shape[0] > 0 and pixels.shape[1] > 0
    assert (pixels != pixels[0, 0]).any(), "the image is one flat colour"


def draw(graph, platform, costs, plan, path):
    sim = simulate(Problem(graph, platform, costs), plan)
    return sim, draw_schedule(graph, platform, costs, plan, sim, str(path))


def test_latency_rows_bars_and_lines_by_hand(tmp_path):
    platform = unit_platform()
    graph = graph_of([("a", "b", 1), ("a", "c", 1)])
    costs = table(platform, {"a": 1, "b": 1, "c": 1})
    # a on A 0-1; c on A 1-2; a's tensor to B 1-3 (1 s + 1 byte); b on B 3-4
    sim, drawing = draw(graph, platform, costs, Plan({"a": "A", "b": "B", "c": "A"}), tmp_path / "s.png")
    assert sim.value_s == 4
    assert drawing.rows == ["A", "B", link_label("A", "B")]
    assert drawing.bars == {"A": 2, "B": 1, link_label("A", "B"): 1}
    assert drawing.busy_s == {"A": 2, "B": 1, link_label("A", "B"): 2}
    assert drawing.arrows == 1
    assert drawing.labels == 3  # one-letter names fit on every bar
    assert_is_a_picture(tmp_path / "s.png")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_latency_rows_are_the_devices_used_and_the_links_that_carried_data(tmp_path, seed):
    graph = random_dag(40, seed=seed)
    platform = get_platform("paper-node")
    costs = RooflineCostModel(graph, platform)
    rng = random.Random(seed)
    plan = Plan({k: rng.choice(platform.device_names) for k in graph.kernels})
    sim, drawing = draw(graph, platform, costs, plan, tmp_path / "s.png")
    used = [d for d in platform.device_names if d in plan.assignment.values()]
    carried = Counter(link_label(t.src, t.dst) for t in sim.transfers)
    assert drawing.rows[: len(used)] == used
    assert sorted(drawing.rows[len(used) :]) == sorted(carried)
    assert drawing.bars == {**Counter(plan.assignment.values()), **carried}
    for device in used:
        assert drawing.busy_s[device] == pytest.approx(sim.device_busy_s[device])
    for (src, dst), busy in sim.link_busy_s.items():
        assert drawing.busy_s[link_label(src, dst)] == pytest.approx(busy)
    assert drawing.arrows == sum(t.src in used for t in sim.transfers)
    assert drawing.labels <= len(graph)
    assert_is_a_picture(tmp_path / "s.png")


def test_thousands_of_kernels_draw_with_few_artists_and_no_names(tmp_path):
    graph = random_dag(2000, seed=1)
    platform = get_platform("paper-node")
    costs = RooflineCostModel(graph, platform)
    rng = random.Random(1)
    plan = Plan({k: rng.choice(platform.device_names) for k in graph.kernels})
    sim, drawing = draw(graph, platform, costs, plan, tmp_path / "big.png")
    assert sum(drawing.bars[d] for d in platform.device_names) == 2000
    assert drawing.labels == 0
    assert drawing.artists < 50  # one collection per row, not one artist per bar
    assert_is_a_picture(tmp_path / "big.png")


def test_period_overlap_draws_device_and_link_loads(tmp_path):
    platform = unit_platform()
    graph = graph_of([("a", "b", 1)])
    costs = table(platform, {"a": 1, "b": 3})
    plan = Plan({"a": "A", "b": "B"}, objective="throughput", mode="period_overlap")
    sim, drawing = draw(graph, platform, costs, plan, tmp_path / "p.png")
    assert sim.value_s == 3  # B's load; the link carries 1 s + 1 byte = 2 s
    assert drawing.rows == ["A", "B", link_label("A", "B")]
    assert drawing.busy_s == {"A": 1, "B": 3, link_label("A", "B"): 2}
    assert drawing.compute_s == {"A": 1, "B": 3, link_label("A", "B"): 0}
    assert_is_a_picture(tmp_path / "p.png")


def test_host_staged_splits_accelerator_loads_into_compute_and_copies(tmp_path):
    platform = unit_platform(transfer_model="host_staged")
    graph = graph_of([("a", "b", 1)])
    costs = table(platform, {"a": 1, "b": 1})
    plan = Plan({"a": "B", "b": "C"}, objective="throughput", mode="host_staged")
    sim, drawing = draw(graph, platform, costs, plan, tmp_path / "h.png")
    # B: a (1) + copy to the host (2); C: copy from the host (2) + b (1)
    assert sim.value_s == 3
    assert drawing.rows == ["B", "C"]
    assert drawing.busy_s == {"B": 3, "C": 3}
    assert drawing.compute_s == {"B": 1, "C": 1}
    assert_is_a_picture(tmp_path / "h.png")


def test_stage_serial_draws_one_bar_per_stage(tmp_path):
    platform = unit_platform()
    graph = graph_of([("a", "b", 1), ("b", "c", 1)])
    costs = table(platform, {"a": 1, "b": 1, "c": 1})
    plan = Plan(
        {"a": "A", "b": "B", "c": "B"},
        objective="pipeline",
        mode="stage_serial",
        stages=[["a"], ["b", "c"]],
        stage_devices=["A", "B"],
    )
    sim, drawing = draw(graph, platform, costs, plan, tmp_path / "st.png")
    # stage 0: a (1) + sends a's tensor (2); stage 1: receives it (2) + b + c (2)
    assert sim.stage_cost_s == [3, 4]
    assert len(drawing.rows) == 2 and drawing.bars == {row: 1 for row in drawing.rows}
    assert [drawing.busy_s[row] for row in drawing.rows] == [3, 4]
    assert [drawing.compute_s[row] for row in drawing.rows] == [1, 2]
    assert "A" in drawing.rows[0] and "B" in drawing.rows[1]
    assert_is_a_picture(tmp_path / "st.png")


def test_an_infinite_makespan_is_refused_by_name(tmp_path):
    platform = unit_platform()
    graph = graph_of([("a", "b", 1)])
    costs = table(platform, {"a": 1, "b": {"A": 1, "B": math.inf, "C": 1}})
    plan = Plan({"a": "A", "b": "B"})
    with pytest.raises(DivimlInputError, match="infinite"):
        draw(graph, platform, costs, plan, tmp_path / "inf.png")
    assert not (tmp_path / "inf.png").exists()


def test_an_unwritable_path_is_an_input_error_naming_it(tmp_path):
    platform = unit_platform()
    graph = graph_of([("a", "b", 1)])
    path = tmp_path / "missing" / "s.png"
    with pytest.raises(DivimlInputError, match="missing"):
        draw(graph, platform, table(platform, {"a": 1, "b": 1}), Plan({"a": "A", "b": "A"}), path)


@pytest.mark.parametrize(
    "name,chars",
    [("fused_conv2d_add_relu3", 10), ("fused_conv2d_add_relu3", 4), ("matmul", 6), ("matmul", 20), ("matmul", 3)],
)
def test_shortened_names_fit_and_keep_both_ends(name, chars):
    short = _shorten(name, chars)
    if chars < 4 and len(name) > chars:
        assert short is None
    elif len(name) <= chars:
        assert short == name
    else:
        assert len(short) == chars and short[0] == name[0] and "\u2026" in short
        assert name.endswith(short.split("\u2026")[1])


def test_the_library_imports_without_matplotlib():
    code = "import sys, tvm_diviml.gantt, tvm_diviml.cli; assert 'matplotlib' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_cli_draws_the_schedule(tmp_path):
    out = tmp_path / "schedule.png"
    result = diviml("plan", "random:kernels=12,seed=1", "--platform", "paper-node", "--gantt", out)
    assert result.returncode == 0, result.stderr
    assert f"schedule drawn to {out}" in result.stdout
    assert_is_a_picture(out)


def test_cli_names_the_file_it_drew_when_the_path_has_no_suffix(tmp_path):
    result = diviml("plan", "random:kernels=12,seed=1", "--gantt", tmp_path / "chart")
    assert result.returncode == 0, result.stderr
    assert f"schedule drawn to {tmp_path / 'chart.png'}" in result.stdout
    assert_is_a_picture(tmp_path / "chart.png")


def test_cli_keeps_json_on_stdout_when_drawing(tmp_path):
    out = tmp_path / "schedule.png"
    result = diviml("plan", "random:kernels=12,seed=1", "--gantt", out, "--json", "-")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["kernels"] == 12
    assert f"schedule drawn to {out}" in result.stderr
    assert_is_a_picture(out)


def test_cli_bad_gantt_path_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "no-such-folder" / "schedule.png"
    result = diviml("plan", "random:kernels=12,seed=1", "--gantt", bad)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("diviml: error: ")]
    assert len(errors) == 1 and str(bad) in errors[0], result.stderr
    assert "Traceback" not in result.stderr
