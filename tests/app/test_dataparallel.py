"""Data parallelism: replicated graphs, their costs, and the batch bound as a minimum over splits."""

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.app.dataparallel import (
    COPY_ATTR,
    ReplicatedCosts,
    copy_devices,
    replicate,
    solve_batch_splits,
    split_workload,
    sub_batch_spec,
)
from tvm_diviml.app.workload import Workload, load_workload
from tvm_diviml.bounds import lower_bound
from tvm_diviml.cost.roofline import RooflineCostModel
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.simulator import memory_per_device, simulate
from tvm_diviml.solvers import Problem

from ..bruteforce import best_latency
from ..helpers import diviml, examples, graph_of, hand_file, table, unit_platform
from ..strategies import DEVICES, dag_problems


def diamond() -> OpGraph:
    """x -> a -> {b, c} -> d; a and d share weight w (a tied embedding), b and c are co-located."""
    kernels = [
        Kernel("a", weights=("w",), output_bytes=4),
        Kernel("b", colocate="g", output_bytes=2),
        Kernel("c", colocate="g", weights=("v",), output_bytes=2),
        Kernel("d", weights=("w",), output_bytes=1),
    ]
    edges = [Edge("a", "b", 4), Edge("a", "c", 4), Edge("b", "d", 2), Edge("c", "d", 2)]
    return OpGraph(kernels, edges, inputs=[GraphInput("x", 8, ("a",))], weights={"w": 100, "v": 10})


def workload(graph, platform, times, model="hand"):
    return Workload(graph, platform, table(platform, times), model, "table")


def optimum(work: Workload) -> float:
    return best_latency(work.graph, work.platform, work.costs)[0]


# ---------------------------------------------------------------------- replicate
def test_replicate_renames_each_copy_and_keeps_edges_within_copies():
    graph = diamond()
    copies = replicate(graph, 3)
    assert len(copies) == 3 * len(graph) and len(copies.edges) == 3 * len(graph.edges)
    for index in range(3):
        for name, kernel in graph.kernels.items():
            twin = copies.kernels[f"b{index}/{name}"]
            assert twin.attrs[COPY_ATTR] == index
            assert twin.weights == kernel.weights and twin.flops == kernel.flops
            assert twin.colocate == (None if kernel.colocate is None else f"b{index}/{kernel.colocate}")
    assert {(e.src, e.dst, e.bytes) for e in copies.edges} == {
        (f"b{i}/{e.src}", f"b{i}/{e.dst}", e.bytes) for i in range(3) for e in graph.edges
    }
    assert [(i.name, i.consumers) for i in copies.inputs] == [(f"b{i}/x", (f"b{i}/a",)) for i in range(3)]
    assert copies.outputs == ["b0/d", "b1/d", "b2/d"]
    assert copies.weights == graph.weights  # shared, not renamed


def test_copies_on_one_device_hold_shared_weights_once():
    graph = graph_of([("a", "b", 0)], weights={"w": 100}, kernel_weights={"a": ["w"], "b": ["w"]})
    copies = replicate(graph, 2)
    together = memory_per_device(copies, Plan({k: "A" for k in copies.kernels}))
    apart = memory_per_device(copies, Plan({k: "A" if k.startswith("b0/") else "B" for k in copies.kernels}))
    assert together == {"A": 100}  # one weight, held once, however many copies run
    assert apart == {"A": 100, "B": 100}


def test_replicate_rejects_a_count_below_one():
    with pytest.raises(DivimlInputError, match="positive integer"):
        replicate(diamond(), 0)


def test_colocation_binds_within_a_copy_only():
    platform = unit_platform()
    copies = replicate(diamond(), 2)
    costs = ReplicatedCosts(table(platform, {k: 1.0 for k in "abcd"}), 2)
    split_groups = {k: "A" for k in copies.kernels} | {"b0/c": "B"}
    copies_apart = {k: "A" if k.startswith("b0/") else "B" for k in copies.kernels}
    assert any(
        "co-location group 'b0/g'" in p for p in simulate(Problem(copies, platform, costs), Plan(split_groups)).problems
    )
    assert simulate(Problem(copies, platform, costs), Plan(copies_apart)).feasible


# ---------------------------------------------------------------------- ReplicatedCosts
def test_replicated_costs_price_every_copy_as_the_base_prices_the_kernel():
    platform = unit_platform(latency=0.5, bandwidth=4.0)
    base = table(platform, {"a": {"A": 3.0, "B": 1.0, "C": 2.0}, "b": 5.0, "c": 7.0, "d": {"A": 1.0, "B": 9.0}})
    costs = ReplicatedCosts(base, 2)
    for index, kernel, device in itertools.product(range(2), "abcd", DEVICES):
        assert costs.compute_s(f"b{index}/{kernel}", device) == base.compute_s(kernel, device)
        assert costs.source(f"b{index}/{kernel}", device) == base.source(kernel, device)
    assert costs.compute_s("b1/d", "C") == float("inf")  # what the base cannot run, no copy can
    assert costs.transfer_s(12, "A", "B") == base.transfer_s(12, "A", "B") == 0.5 + 3.0
    with pytest.raises(KeyError, match="copy 2"):
        costs.compute_s("b2/a", "A")
    with pytest.raises(KeyError, match="not a kernel of a replicated graph"):
        costs.compute_s("a", "A")


@settings(max_examples=examples(40), deadline=None)
@given(data=st.data(), copies=st.integers(2, 3))
def test_copies_apart_take_the_slowest_copy_and_together_on_the_host_the_sum(data, copies):
    graph, platform, base = data.draw(dag_problems(max_kernels=5))
    replicated, costs = replicate(graph, copies), ReplicatedCosts(base, copies)
    alone = [
        simulate(Problem(graph, platform, base), Plan({k: DEVICES[i] for k in graph.kernels})).value_s
        for i in range(copies)
    ]
    apart = Plan({k: DEVICES[int(k[1])] for k in replicated.kernels})
    assert simulate(Problem(replicated, platform, costs), apart).value_s == pytest.approx(max(alone))
    on_host = Plan({k: platform.host for k in replicated.kernels})  # no transfers: work, one copy after another
    assert simulate(Problem(replicated, platform, costs), on_host).value_s == pytest.approx(copies * alone[0])


def test_copy_devices_says_which_copy_ran_where():
    plan = Plan({"b0/a": "A", "b0/b": "B", "b1/a": "C", "b1/b": "C"}, batch_split=2)
    assert copy_devices(plan) == {0: ["A", "B"], 1: ["C"]}
    assert copy_devices(Plan({"a": "B", "b": "A"})) == {0: ["A", "B"]}


# ---------------------------------------------------------------------- the bound over splits
def test_a_splits_own_bound_can_exceed_the_batch_optimum_so_the_minimum_is_reported():
    # Batch 4 costs 10 on either GPU; a batch of 1 costs 9 there (launch overhead dominates), so four
    # copies load the three devices with at least 36 / 3 = 12 > 10, the batch's true optimum.
    platform = unit_platform()
    unsplit = workload(graph_of([], kernels=["k"]), platform, {"k": {"A": 100.0, "B": 10.0, "C": 10.0}})
    split = Workload(
        replicate(graph_of([], kernels=["k"]), 4),
        platform,
        ReplicatedCosts(table(platform, {"k": {"A": 90.0, "B": 9.0, "C": 9.0}}), 4),
        "hand x4",
        "table",
    )
    plan, sim, row, problem = solve_batch_splits({1: unsplit, 4: split}, "fastest_single_device")
    best = min(optimum(unsplit), optimum(split))
    assert best == 10.0 and optimum(split) == 18.0  # two copies on each GPU
    assert row["batch_splits_tried"][4]["lower_bound_s"] >= 12.0 > best  # not a bound for the batch
    assert row["lower_bound_s"] == 10.0 <= best
    assert row["batch_split"] == plan.batch_split == 1 and row["value_s"] == sim.value_s == 10.0
    assert row["gap"] == 0.0 and row["optimal"] and plan.lower_bound_s == 10.0
    assert problem.graph is unsplit.graph and row["copies"] == {0: ["B"]}


@settings(max_examples=examples(25), deadline=None)
@given(data=st.data(), scale=st.sampled_from([1.0, 1.5, 2.0, 3.0]))
def test_the_reported_bound_holds_for_every_split_and_the_best_plan_wins(data, scale):
    graph, platform, sub_costs = data.draw(dag_problems(max_kernels=3))
    unsplit_times = {k: {d: scale * sub_costs.compute_s(k, d) for d in DEVICES} for k in graph.kernels}
    unsplit = workload(graph, platform, unsplit_times)
    split = Workload(replicate(graph, 2), platform, ReplicatedCosts(sub_costs, 2), "hand x2", "table")
    plan, sim, row, problem = solve_batch_splits({1: unsplit, 2: split}, "fastest_single_device")
    values = {r: entry["value_s"] for r, entry in row["batch_splits_tried"].items()}
    assert row["value_s"] == min(values.values()) == values[row["batch_split"]]
    assert simulate(Problem(problem.graph, platform, problem.costs), plan).value_s == row["value_s"]
    assert row["lower_bound_s"] == min(lower_bound(Problem(w.graph, platform, w.costs)) for w in (unsplit, split))
    assert row["lower_bound_s"] <= min(optimum(unsplit), optimum(split)) + 1e-9


def test_a_split_whose_solver_gives_up_still_counts_with_its_bound():
    # Memory 50: the batch's 60-byte output fits nowhere; two copies of a 20-byte output fit on one device.
    platform = unit_platform(memory=50)
    unsplit = workload(graph_of([], kernels=["k"], output_bytes={"k": 60}), platform, {"k": 10.0})
    sub = graph_of([], kernels=["k"], output_bytes={"k": 20})
    split = Workload(replicate(sub, 2), platform, ReplicatedCosts(table(platform, {"k": 6.0}), 2), "x2", "table")
    plan, _, row, _ = solve_batch_splits({1: unsplit, 2: split}, "fastest_single_device")
    assert "no single device" in row["batch_splits_tried"][1]["error"]
    assert row["batch_splits_tried"][1]["value_s"] is None
    assert row["batch_splits_tried"][1]["lower_bound_s"] == 10.0  # its largest kernel
    assert row["batch_split"] == plan.batch_split == 2
    assert row["value_s"] == 12.0  # both copies on the host, one after the other
    assert row["lower_bound_s"] == 6.0 and row["gap"] == pytest.approx(1.0)
    too_big = Workload(
        replicate(graph_of([], kernels=["k"], output_bytes={"k": 30}), 2),
        platform,
        ReplicatedCosts(table(platform, {"k": 6.0}), 2),
        "x2",
        "table",
    )
    with pytest.raises(DivimlInputError, match="no single device"):
        solve_batch_splits({1: unsplit, 2: too_big}, "fastest_single_device")


# ---------------------------------------------------------------------- zoo models
def test_the_split_must_divide_the_batch():
    with pytest.raises(DivimlInputError, match=r"batch of 4 cannot be split into 3 .*one of 1, 2, 4"):
        sub_batch_spec("resnet18:batch=4,resolution=32", 3)
    with pytest.raises(DivimlInputError, match=r"batch of 1 cannot be split into 2"):
        sub_batch_spec("resnet18:resolution=32", 2)  # the zoo's default batch
    assert sub_batch_spec("resnet18:batch=4,resolution=32", 2) == ("resnet18:batch=2,resolution=32", 4)


@pytest.mark.parametrize("model", ["random:kernels=5", "graph.json", "some/dir/model.onnx"])
def test_only_zoo_models_have_a_batch_to_split(model):
    with pytest.raises(DivimlInputError, match="batch split needs a zoo model.*MODEL:batch=B"):
        sub_batch_spec(model, 2)


def test_an_unknown_zoo_name_is_refused_with_the_zoo_s_names():
    with pytest.raises(DivimlInputError, match=r"unknown model 'resnett18'.*zoo models: .*resnet18"):
        sub_batch_spec("resnett18:batch=4", 2)


def test_a_cost_table_cannot_price_a_sub_batch():
    with pytest.raises(DivimlInputError, match="cost table prices one batch size"):
        sub_batch_spec("resnet18:batch=2", 2, "costs.json")


def test_a_zoo_split_is_the_sub_batch_model_replicated():
    split = split_workload("resnet18:batch=2,resolution=32", "paper-node", "roofline", 2)
    whole = load_workload("resnet18:batch=2,resolution=32", "paper-node", "roofline")
    assert len(split.graph) == 2 * len(whole.graph) and "2 copies of batch 1" in split.model
    flops = sum(k.flops for k in split.graph.kernels.values())
    assert flops == pytest.approx(sum(k.flops for k in whole.graph.kernels.values()), rel=1e-6)
    assert split.graph.weights == whole.graph.weights
    direct = RooflineCostModel(split.graph, split.platform)  # roofline of the replicated kernels themselves
    for kernel, device in itertools.product(split.graph.kernels, split.platform.device_names):
        assert split.costs.compute_s(kernel, device) == direct.compute_s(kernel, device)


def test_cli_plans_each_split_and_reports_the_minimum_bound(tmp_path):
    out = tmp_path / "row.json"
    result = diviml(
        "plan", "resnet18:batch=2,resolution=32", "--platform", "paper-node", "--batch-split", "2", "--json", out
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(out.read_text())
    tried = row["batch_splits_tried"]
    assert set(tried) == {"1", "2"} and tried["2"]["kernels"] == 2 * tried["1"]["kernels"]
    assert row["lower_bound_s"] == min(t["lower_bound_s"] for t in tried.values())
    assert row["value_s"] == min(t["value_s"] for t in tried.values()) == tried[str(row["batch_split"])]["value_s"]
    assert row["kernels"] == tried[str(row["batch_split"])]["kernels"]
    assert set(row["copies"]) == {str(i) for i in range(row["batch_split"])}
    assert set(d for devices in row["copies"].values() for d in devices) == set(row["assignment"].values())
    assert "batch split 1:" in result.stdout and "batch split 2:" in result.stdout and "copy 0 ran on" in result.stdout


@pytest.mark.parametrize("model", ["random:kernels=5", "fiddle"])
def test_cli_batch_split_without_a_zoo_model_is_one_line_and_exit_2(model, tmp_path):
    if model == "fiddle":
        model = tmp_path / "fiddle.json"
        model.write_text(json.dumps(hand_file()))
    result = diviml("plan", model, "--batch-split", "2")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "batch split needs a zoo model" in result.stderr
