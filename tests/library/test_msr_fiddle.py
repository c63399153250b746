"""The msr-fiddle reader: a hand-made file priced by hand, and every real file read from ../shared."""

import glob
import os

import pytest

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.msr_fiddle import read_expert_split, read_msr_fiddle
from tvm_diviml.plan import Plan
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, get_solver

from ..helpers import hand_file


def price(data, assignment):
    graph, platform, costs = read_msr_fiddle(data)
    plan = Plan(assignment, objective="throughput", mode="host_staged")
    return simulate(Problem(graph, platform, costs), plan)


def test_split_max_load_matches_hand_computation():
    sim = price(hand_file(), {"1": "acc0", "2": "acc0", "3": "acc1", "4": "acc1"})
    # acc0: 1 + 2 ms work + 1's output leaves (0.5) + 2's output leaves (0.25) = 3.75 ms
    # acc1: 3 + 4 ms work + 1 enters (0.5) + 2 enters (0.25) = 7.75 ms
    assert sim.device_busy_s["acc0"] == pytest.approx(3.75e-3)
    assert sim.device_busy_s["acc1"] == pytest.approx(7.75e-3)
    assert sim.value_s == pytest.approx(7.75e-3)
    assert sim.feasible


def test_cpu_pays_no_transfers_and_colour_classes_bind():
    sim = price(hand_file(), {"1": "acc0", "2": "acc0", "3": "acc1", "4": "cpu0"})
    # acc1: 3 ms + 0.75 in + 3's output leaves for the CPU (1.0) = 4.75 ms; cpu0: 10 ms, no transfers
    assert sim.device_busy_s["acc1"] == pytest.approx(4.75e-3)
    assert sim.device_busy_s["cpu0"] == pytest.approx(10e-3)
    assert not sim.feasible and any("co-location group '34'" in p for p in sim.problems)


def test_accelerator_memory_is_their_size_sum():
    sim = price(hand_file(), {"1": "acc0", "2": "acc0", "3": "acc0", "4": "acc0"})
    assert sim.memory_bytes["acc0"] == 120 and not sim.feasible  # 4 x 30 > 100


def test_latency_mode_copies_between_accelerators_take_two_hops():
    graph, platform, costs = read_msr_fiddle(hand_file())
    assert costs.transfer_s(graph.edges[0].bytes, "acc0", "cpu0") == pytest.approx(0.5e-3)
    assert costs.transfer_s(graph.edges[0].bytes, "acc0", "acc1") == pytest.approx(1.0e-3)
    assert costs.transfer_s(graph.edges[0].bytes, "cpu0", "cpu0") == 0


def test_unsupported_nodes_are_cpu_only():
    data = hand_file()
    data["nodes"][1]["supportedOnFpga"] = 0
    graph, _, costs = read_msr_fiddle(data)
    assert graph.kernels["2"].allowed_devices == ("cpu0",)
    assert costs.compute_s("2", "acc0") == float("inf")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"maxFPGAs": -1}, "maxFPGAs"),
        ({"maxFPGAs": 0, "maxCPUs": 0}, "no device"),
        ({"nodes": [{"id": 1}]}, "missing 'cpuLatency'"),
        ({"edges": [{"sourceId": 1, "destId": 9, "cost": 1}]}, "unknown kernel '9'"),
        ({"edges": [{"sourceId": 1, "destId": 2, "cost": -1}]}, "non-negative"),
    ],
)
def test_bad_files_are_named(change, message):
    with pytest.raises(DivimlInputError, match=message):
        read_msr_fiddle(hand_file(**change))


def test_colour_class_with_no_common_device_is_reported():
    data = hand_file(maxCPUs=0)
    data["nodes"][2]["supportedOnFpga"] = 0  # node 3 can run nowhere, and shares a colour with 4
    graph, platform, costs = read_msr_fiddle(data)
    with pytest.raises(DivimlInputError, match="can run on no device"):
        Problem(graph, platform, costs, objective="throughput").validate()
    data["maxCPUs"] = 1
    data["nodes"][3]["supportedOnFpga"] = 1
    graph, platform, costs = read_msr_fiddle(data)
    Problem(graph, platform, costs, objective="throughput").validate()


def test_every_real_file_reads_and_costs_match_the_file(msr_fiddle_dir):
    import json

    files = sorted(glob.glob(os.path.join(msr_fiddle_dir, "*-inputs", "*", "*.json")))
    assert len(files) >= 20
    for path in files:
        data = json.load(open(path))
        graph, platform, costs = read_msr_fiddle(data, os.path.basename(path))
        assert len(graph) == len(data["nodes"]) and len(graph.edges) == len(data["edges"])
        edge = data["edges"][0]
        mine = next(e for e in graph.edges if (e.src, e.dst) == (str(edge["sourceId"]), str(edge["destId"])))
        assert costs.transfer_s(mine.bytes, "acc0", platform.host) == pytest.approx(edge["cost"] * 1e-3)
        node = data["nodes"][0]
        assert costs.compute_s(str(node["id"]), platform.host) == pytest.approx(node["cpuLatency"] * 1e-3)


def test_fastest_single_device_on_inference_files(msr_fiddle_dir):
    for path in sorted(glob.glob(os.path.join(msr_fiddle_dir, "*-inputs", "*", "*_inference.json"))):
        import json

        graph, platform, costs = read_msr_fiddle(json.load(open(path)))
        for objective in ("latency", "throughput"):
            problem = Problem(graph, platform, costs, objective=objective)
            plan = get_solver("fastest_single_device").solve(problem)
            sim = simulate(Problem(graph, platform, costs), plan)
            assert sim.feasible and plan.value_s == sim.value_s
            feasible = [v["value_s"] for v in plan.attrs["per_device"].values() if v["value_s"] is not None]
            assert plan.value_s == min(feasible)


def test_without_cpus_every_accelerator_still_pays_one_hop_per_copy():
    """maxCPUs = 0: host memory is still there (device 'host', which runs nothing), so the loads are
    those of the file with a CPU: acc0 3.75 ms, acc1 7.75 ms (see the first test)."""
    data = hand_file(maxCPUs=0)
    graph, platform, _ = read_msr_fiddle(data)
    assert platform.host == "host" and platform.device("host").kind == "cpu"
    assert all(k.allowed_devices == ("acc0", "acc1") for k in graph.kernels.values())
    sim = price(data, {"1": "acc0", "2": "acc0", "3": "acc1", "4": "acc1"})
    assert sim.device_busy_s["acc0"] == pytest.approx(3.75e-3)
    assert sim.device_busy_s["acc1"] == pytest.approx(7.75e-3)
    swapped = price(data, {"1": "acc1", "2": "acc1", "3": "acc0", "4": "acc0"})
    assert swapped.device_busy_s["acc1"] == pytest.approx(3.75e-3)
    assert swapped.device_busy_s["acc0"] == pytest.approx(7.75e-3)


# ---------------------------------------------------------------------- human-expert splits
def expert(fpgas, cpus=((),)):
    return {
        "cpus": [{"load": 0.0, "nodes": list(n)} for n in cpus],
        "fpgas": [{"load": -1, "nodes": list(n)} for n in fpgas],
        "maxLoad": -1,
    }


def test_expert_split_is_read_and_scored_by_the_simulator():
    graph, platform, costs = read_msr_fiddle(hand_file())
    plan = read_expert_split(expert([[1, 2], [3, 4]]), graph, platform)
    assert plan.assignment == {"1": "acc0", "2": "acc0", "3": "acc1", "4": "acc1"}
    assert plan.mode == "host_staged" and plan.solver == "human-expert"
    assert simulate(Problem(graph, platform, costs), plan).value_s == pytest.approx(7.75e-3)
    plan = read_expert_split(expert([[], [1, 2]], cpus=[[3, 4]]), graph, platform)
    assert plan.assignment == {"1": "acc1", "2": "acc1", "3": "cpu0", "4": "cpu0"}


@pytest.mark.parametrize(
    "split, message",
    [
        (expert([[1, 2], [3]]), "leaves node '4' unplaced"),
        (expert([[1, 2], [3, 4, 2]]), "places node 2 again"),
        (expert([[1, 2], [3, 4, 9]]), "node 9"),
        (expert([[1], [2], [3, 4]]), "'acc2'"),
        (expert([[1, 2, 3, 4]], cpus=[[], [5]]), "'cpu1'"),
        ({"fpgas": [{"load": 1}]}, "'nodes' list"),
        ([1, 2], "not an expert split"),
    ],
)
def test_bad_expert_splits_name_the_node(split, message):
    graph, platform, _ = read_msr_fiddle(hand_file())
    with pytest.raises(DivimlInputError, match=message):
        read_expert_split(split, graph, platform)


def test_real_expert_splits_place_every_node_of_their_layer_graph(msr_fiddle_dir):
    import json

    for path in sorted(glob.glob(os.path.join(msr_fiddle_dir, "human-experts", "*_inference_expert.json"))):
        name = os.path.basename(path).replace("_expert", "")
        graph, platform, costs = read_msr_fiddle(
            json.load(open(os.path.join(msr_fiddle_dir, "throughput-inputs", "LayerGraphs", name)))
        )
        sim = simulate(Problem(graph, platform, costs), read_expert_split(json.load(open(path)), graph, platform))
        assert sim.feasible and sim.value_s > 0


def test_bench_suite_on_the_two_smallest_files(msr_fiddle_dir):
    from tvm_diviml.bench import suite_msr_fiddle

    rows = list(suite_msr_fiddle(quick=True, msr_fiddle_dir=msr_fiddle_dir))
    graphs = [r for r in rows if "expert_value_s" not in r]
    experts = [r for r in rows if "expert_value_s" in r]
    assert len(graphs) == 2 and {r["graph"] for r in experts} == {r["model"] for r in graphs}
    for row in graphs:
        assert row["gap"] >= -1e-9 and row["lower_bound_s"] <= row["best_bound_s"]
        if row["dp_exact"]:  # the DP's optimum bounds SliceGraph on the same problem
            assert row["slicegraph_value_s"] >= row["downsets_value_s"] * (1 - 1e-9)
    exact = {r["model"] for r in graphs if r["dp_exact"]}
    assert exact
    for row in experts:  # an ordered contiguous expert split cannot beat the contiguous optimum
        assert row["expert_feasible"]
        if row["graph"] in exact and row["expert_contiguous"]:
            assert row["ours_value_s"] <= row["expert_value_s"] * (1 + 1e-9)


def test_bench_suite_is_skipped_without_the_files(tmp_path):
    from tvm_diviml.bench import suite_msr_fiddle

    assert list(suite_msr_fiddle(msr_fiddle_dir=str(tmp_path))) == []
