"""OpGraph, Platform, cost tables and Plans: validation and JSON round trips."""

import json
import math

import pytest

from tvm_diviml.cost.roofline import RooflineCostModel
from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph
from tvm_diviml.plan import Plan, PlanError, ReplicaGroup
from tvm_diviml.platform import Platform
from tvm_diviml.presets import get_platform
from tvm_diviml.synthetic import branchy, random_dag

from ..helpers import graph_of, unit_platform


def roundtrip(obj, cls, *args):
    return cls.from_json(json.loads(json.dumps(obj.to_json())), *args)


def test_opgraph_json_roundtrip_keeps_everything():
    graph = OpGraph(
        [
            Kernel(
                "a",
                flops=2e9,
                bytes_moved=10,
                output_bytes=4,
                weights=("w",),
                allowed_devices=("A",),
                colocate="g",
                attrs={"primfunc": "fused_conv"},
            ),
            Kernel("b", weights=("w",)),
        ],
        [Edge("a", "b", 4)],
        inputs=[GraphInput("x", 8, ("a",))],
        outputs=["b"],
        weights={"w": 100},
        name="g1",
        attrs={"source": "test"},
    )
    again = roundtrip(graph, OpGraph)
    assert again.to_json() == graph.to_json()
    assert again.kernels["a"] == graph.kernels["a"] and again.kernels["a"].attrs == {"primfunc": "fused_conv"}
    assert again.weight_bytes(["a", "b"]) == 100  # a shared weight counts once


def test_generated_graphs_roundtrip_and_are_deterministic():
    for graph in (random_dag(30, seed=4), branchy(3, 2)):
        assert roundtrip(graph, OpGraph).to_json() == graph.to_json()
    assert random_dag(30, seed=4).to_json() == random_dag(30, seed=4).to_json()
    assert random_dag(30, seed=4).to_json() != random_dag(30, seed=5).to_json()


def test_networkx_view():
    graph = graph_of([("a", "b", 3), ("a", "c", 1)])
    view = graph.to_networkx()
    assert sorted(view.edges(data="bytes")) == [("a", "b", 3), ("a", "c", 1)]
    assert graph.topo_order[0] == "a" and graph.outputs == ["b", "c"]


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: graph_of([("a", "b", 1), ("b", "c", 1), ("c", "a", 1)]), "cycle: "),
        (lambda: OpGraph([Kernel("a"), Kernel("a")], []), "appears twice"),
        (lambda: OpGraph([Kernel("a")], [Edge("a", "z", 1)]), "unknown kernel 'z'"),
        (lambda: OpGraph([Kernel("a", flops=-1)], []), "non-negative"),
        (lambda: OpGraph([Kernel("a"), Kernel("b")], [Edge("a", "b", -2)]), "non-negative"),
        (lambda: OpGraph([Kernel("a", weights=("w",))], []), "unknown weight 'w'"),
        (lambda: OpGraph([Kernel("a")], [], outputs=["q"]), "output 'q'"),
        (lambda: OpGraph([Kernel("a")], [], inputs=[GraphInput("x", 1, ("q",))]), "unknown kernel 'q'"),
        (lambda: OpGraph([Kernel("a")], [], inputs=[GraphInput("a", 1, ("a",))]), "name of a kernel"),
    ],
)
def test_opgraph_rejects_bad_graphs(build, message):
    with pytest.raises(DivimlInputError, match=message):
        build()


@pytest.mark.parametrize("name", ["cpu2", "paper-node", "h200-node", "gpu4", "gpu64"])
def test_presets_are_valid_and_roundtrip(name):
    platform = get_platform(name)
    again = roundtrip(platform, Platform)
    assert again.to_json() == platform.to_json()
    assert again.host == platform.host
    for device in platform.devices:
        assert 0 < device.efficiency <= 1 and device.effective_flops <= device.peak_flops


def test_paper_node_has_a_cpu_and_two_distinct_gpus():
    platform = get_platform("paper-node")
    gpus = [d for d in platform.devices if d.kind == "cuda"]
    assert [d.kind for d in platform.devices].count("cpu") == 1 and len(gpus) == 2
    assert gpus[0].peak_flops != gpus[1].peak_flops
    cpu2 = get_platform("cpu2")
    assert [d.device for d in cpu2.devices] == ["cpu:0", "cpu:1"] and all(d.num_threads == 1 for d in cpu2.devices)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["devices"][0].update(target="llvm -mcpu=znver3"), "has options"),
        (lambda d: d["devices"][0].update(device="gpu0"), "kind:index"),
        (lambda d: d["devices"][0].update(efficiency=1.5), "efficiency"),
        (lambda d: d["devices"][0].update(colour="red"), "unknown keys"),
        (lambda d: d["devices"][1].update(name=d["devices"][0]["name"]), "appears twice"),
        (lambda d: d["links"].pop(), "no link from"),
        (lambda d: d.update(host="nowhere"), "host 'nowhere'"),
        (lambda d: d.update(devices=[]), "at least one device"),
    ],
)
def test_platform_json_rejects_bad_input(mutate, message):
    data = get_platform("paper-node").to_json()
    mutate(data)
    with pytest.raises(DivimlInputError, match=message):
        Platform.from_json(data)


def test_platform_default_link_fills_every_pair():
    data = {
        "name": "p",
        "devices": [
            {"name": "c", "target": {"kind": "llvm"}, "device": "cpu:0", "peak_flops": 1e12, "bandwidth_Bps": 1e11},
            {
                "name": "g",
                "target": "nvidia/nvidia-a100",
                "device": "cuda:0",
                "peak_flops": 1.95e13,
                "bandwidth_Bps": 2e12,
            },
        ],
        "default_link": {"latency_s": 1e-5, "bandwidth_Bps": 1e10},
    }
    platform = Platform.from_json(data)
    assert platform.transfer_s(1e10, "c", "g") == pytest.approx(1 + 1e-5)
    assert platform.transfer_s(1e10, "g", "g") == 0


def test_cost_table_roundtrip_and_coverage_errors(tmp_path):
    platform = unit_platform()
    graph = graph_of([("a", "b", 1)])
    costs = TableCostModel(platform, {"a": {"A": 1, "B": 2, "C": None}, "b": {"A": 1, "B": 1, "C": 1}})
    path = tmp_path / "costs.json"
    costs.save(str(path))
    again = TableCostModel.load(str(path), platform, graph)
    assert again.compute_s("a", "B") == 2 and math.isinf(again.compute_s("a", "C"))
    with pytest.raises(DivimlInputError, match="missing cost for kernel 'b' on device 'C'"):
        TableCostModel(platform, {"a": {"A": 1, "B": 1, "C": 1}, "b": {"A": 1, "B": 1}}).check_covers(graph)
    with pytest.raises(DivimlInputError, match="missing cost for kernel 'b'"):
        TableCostModel(platform, {"a": {"A": 1, "B": 1, "C": 1}}).check_covers(graph)
    with pytest.raises(DivimlInputError, match="unknown device 'Q'"):
        TableCostModel(platform, {"a": {"Q": 1}, "b": {"A": 1}}).check_covers(graph)
    with pytest.raises(DivimlInputError, match="negative"):
        TableCostModel(platform, {"a": {"A": -1, "B": 1, "C": 1}, "b": {"A": 1, "B": 1, "C": 1}}).check_covers(graph)


def test_roofline_is_monotone_in_flops_and_bytes_and_uses_effective_peaks():
    platform = get_platform("paper-node")
    kernels = [
        Kernel(f"k{i}", flops=f, bytes_moved=b)
        for i, (f, b) in enumerate([(1e9, 1e6), (2e9, 1e6), (2e9, 1e9), (4e9, 1e9)])
    ]
    costs = RooflineCostModel(OpGraph(kernels, []), platform)
    for device in platform.device_names:
        times = [costs.compute_s(k.name, device) for k in kernels]
        assert times == sorted(times)
    cpu = platform.device("cpu")
    assert costs.compute_s("k0", "cpu") == pytest.approx(
        1e9 / (cpu.peak_flops * cpu.efficiency) + cpu.launch_overhead_s
    )


def test_plan_json_roundtrip():
    plan = Plan(
        {"a": "A", "b": "B"},
        objective="throughput",
        mode="period_overlap",
        replicas=[ReplicaGroup(["a"], {"A": 0.25, "B": 0.75})],
        solver="x",
        value_s=1.5,
        batch_split=2,
        attrs={"note": 1},
    )
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    pipeline = Plan(
        {"a": "A", "b": "B"},
        objective="pipeline",
        mode="stage_serial",
        stages=[["a"], ["b"]],
        stage_devices=["A", "B"],
        order={"A": ["a"], "B": ["b"]},
    )
    assert Plan.from_json(json.loads(json.dumps(pipeline.to_json()))) == pipeline
    with pytest.raises(DivimlInputError, match="cost mode"):
        Plan({"a": "A"}, mode="fast")
    with pytest.raises(DivimlInputError, match="sum to 1"):
        Plan({"a": "A"}, replicas=[ReplicaGroup(["a"], {"A": 0.5})])


def test_a_plan_file_keeps_the_typed_claims_under_attrs_as_before():
    plan = Plan({"a": "A"}, optimal_among="plans without replicas", simulated_value_s=2.0, attrs={"ideals": 4})
    written = json.loads(json.dumps(plan.to_json()))
    assert written["attrs"] == {"ideals": 4, "optimal_among": "plans without replicas", "simulated_value_s": 2.0}
    assert not {"optimal_among", "simulated_value_s", "series", "method"} & set(written)
    assert Plan.from_json(written) == plan
    old = {"assignment": {"a": "A"}, "attrs": {"series": {"cuts": 3}, "method": "downset DP", "note": 1}}
    read = Plan.from_json(old)
    assert (read.series, read.method, read.attrs) == ({"cuts": 3}, "downset DP", {"note": 1})


def test_a_plan_is_checked_against_its_graph_and_platform():
    graph, platform = graph_of([("a", "b", 1)]), unit_platform()
    Plan({"a": "A", "b": "B"}).check(graph, platform)
    with pytest.raises(PlanError, match="leaves kernel 'b' unassigned: it does not match"):
        Plan({"a": "A"}).check(graph, platform)
    with pytest.raises(PlanError, match="names kernel 'z', which graph '.*' does not have"):
        Plan({"a": "A", "b": "A", "z": "A"}).check(graph)
    with pytest.raises(PlanError, match="unknown device 'Z', which platform '.*' lacks"):
        Plan({"a": "A", "b": "Z"}).check(graph, platform)
    Plan({"a": "A", "b": "Z"}).check(graph)  # no platform: the devices are not asked about
    twice = [ReplicaGroup(["a"], {"A": 1.0}), ReplicaGroup(["a"], {"B": 1.0})]
    with pytest.raises(PlanError, match="two replica groups"):
        Plan({"a": "A", "b": "B"}, replicas=twice).check(graph, platform)
    with pytest.raises(PlanError, match="replica group shares the stream with unknown device 'Q'"):
        Plan({"a": "A", "b": "B"}, replicas=[ReplicaGroup(["a"], {"Q": 1.0})]).check(graph, platform)


def test_a_plan_copy_keeps_the_placement_and_shares_nothing_mutable():
    plan = Plan(
        {"a": "A", "b": "B"},
        objective="throughput",
        mode="period_overlap",
        solver="heft",
        value_s=2.0,
        lower_bound_s=1.0,
        optimal=True,
        replicas=[ReplicaGroup(["b"], {"B": 0.5, "C": 0.5})],
        attrs={"heft_estimate_s": 2.0},
    )
    copy = plan.copy("milp")
    assert (copy.assignment, copy.replicas, copy.value_s, copy.solver) == (plan.assignment, plan.replicas, 2.0, "milp")
    assert copy.lower_bound_s is None and not copy.optimal and not copy.attrs  # a claim of the other solver's
    copy.assignment["a"] = "C"
    copy.replicas[0].shares["B"] = 1.0
    assert plan.assignment["a"] == "A" and plan.replicas[0].shares["B"] == 0.5
