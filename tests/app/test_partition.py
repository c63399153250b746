"""PartitionForDevices: the plan it attaches is the solver's plan, the build it feeds runs like the
single-device reference, and the registered "diviml" pipeline takes its options from partition_options."""

from __future__ import annotations

import importlib
import json
import math

import numpy as np
import pytest
import tvm

from tvm_diviml.app.partition import PLAN_ATTR, PartitionForDevices, partition_options
from tvm_diviml.cost import RooflineCostModel, TableCostModel
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.frontends.importers import module_as_model
from tvm_diviml.passes import extract
from tvm_diviml.passes.apply_plan import PLACEMENT_ATTR
from tvm_diviml.plan import Plan
from tvm_diviml.platform import Platform
from tvm_diviml.presets import get_platform
from tvm_diviml.runtime.placement import Placement
from tvm_diviml.runtime.vm import PlacedExecutable, SingleVMRunner
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, get_solver
from tvm_diviml.zoo import SMALL_OPTIONS, build_model
from tvm_diviml.zoo.reference import run_reference

# vit_b16 (small): 34 kernels that HEFT spreads over both CPUs of cpu2 under roofline costs, so the
# build has real cross-device copies.
MODEL = "vit_b16"
OPTIONS = {"solver": "heft", "time_limit_s": 2.0}


@pytest.fixture(scope="module")
def model():
    return build_model(MODEL, SMALL_OPTIONS[MODEL])


@pytest.fixture(scope="module")
def reference(model):
    inputs = model.sample_inputs()
    return inputs, run_reference(model, inputs)


def run_placed(executable, placement, model, inputs):
    return SingleVMRunner(PlacedExecutable(executable, placement), [w for _, w in model.params])(inputs)


def assert_matches(outputs, expected):
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def solved(model):
    """What the solver gives on the problem the pass builds: (plan, its simulated value)."""
    platform = get_platform("cpu2")
    graph = extract(model.mod, model.entry).graph
    problem = Problem(graph, platform, RooflineCostModel(graph, platform))
    plan = get_solver("heft", time_limit_s=2.0, seed=0).solve(problem)
    return plan, simulate(Problem(graph, platform, problem.costs), plan).value_s


def test_pipeline_places_as_the_solver_does_and_runs_like_the_reference(model, reference, solved):
    partition = PartitionForDevices("cpu2", **OPTIONS)
    assert partition.plan is None and partition.placement is None
    executable = tvm.compile(model.mod, target=None, relax_pipeline=partition.pipeline())
    expected, _ = solved
    assert partition.plan.assignment == expected.assignment and partition.plan.order == expected.order
    assert set(expected.assignment.values()) == {"cpu0", "cpu1"}
    assert partition.placement.copies_per_run > 0
    inputs, outputs = reference
    assert_matches(run_placed(executable, partition.placement, model, inputs), outputs)


def test_called_directly_the_pass_attaches_the_solvers_plan_and_placement(model, solved):
    partition = PartitionForDevices("cpu2", **OPTIONS)
    placed = partition(model.mod)
    attached = Plan.from_json(json.loads(str(placed.attrs[PLAN_ATTR])))
    expected, simulated_s = solved
    assert attached.assignment == expected.assignment and attached.order == expected.order
    assert math.isclose(attached.simulated_value_s, simulated_s)
    assert Placement.from_json(str(placed.attrs[PLACEMENT_ATTR])) == partition.placement


def test_registered_pipeline_takes_options_from_the_context(model, reference):
    with partition_options("cpu2", **OPTIONS) as partition:
        executable = tvm.compile(model.mod, target=None, relax_pipeline="diviml")
    assert set(partition.plan.assignment.values()) == {"cpu0", "cpu1"}
    inputs, outputs = reference
    assert_matches(run_placed(executable, partition.placement, model, inputs), outputs)


def test_with_candidates_the_pass_keeps_the_fastest_measured_plan(model, reference):
    partition = PartitionForDevices("cpu2", candidates=1, **OPTIONS)
    executable = tvm.compile(model.mod, target=None, relax_pipeline=partition.pipeline())
    selection = partition.selection
    measured = [c.measured_s for c in selection.candidates]
    assert measured == sorted(measured) and len(measured) >= 2  # HEFT's plan and the single devices
    assert partition.plan.assignment == selection.winner.plan.assignment
    assert partition.placement.assignment == selection.winner.plan.assignment
    inputs, outputs = reference
    assert_matches(run_placed(executable, partition.placement, model, inputs), outputs)


def test_measured_costs_are_calibrated_inside_the_model_as_diviml_run_has_them(model, tmp_path, monkeypatch):
    monkeypatch.setenv("DIVIML_CACHE_DIR", str(tmp_path / "cache"))
    partition = PartitionForDevices("cpu2", cost="measured", **OPTIONS)
    extraction = extract(model.mod, model.entry)
    costs = partition.cost_model(extraction, model.mod)
    assert set(costs.provenance.in_context) == {"cpu0", "cpu1"} and costs.executor_segments
    assert isinstance(costs, TableCostModel)  # measured costs are a table, as a cost file is
    uncalibrated = partition.cost_model(extraction)  # without the module: kernels alone
    assert not uncalibrated.provenance.in_context


def test_the_module_is_measured_with_its_own_weights_and_random_ones_only_where_it_lacks_them():
    """The pass times the module it places, not a re-import of it: its entry's ``params`` attribute
    gives the weights it has, seeded random ones fill in those it lacks."""
    x = tvm.relax.Var("x", tvm.relax.TensorType([2, 4], "float32"))
    weights = [tvm.relax.Var(name, tvm.relax.TensorType([4, 4], "float32")) for name in ("first", "second")]
    builder = tvm.relax.BlockBuilder()
    with builder.function("main", [x, *weights], {"num_input": 1}):
        with builder.dataflow():
            output = builder.emit_output(tvm.relax.op.matmul(tvm.relax.op.matmul(x, weights[0]), weights[1]))
        builder.emit_func_output(output)
    mod = builder.get()
    own = np.arange(16, dtype="float32").reshape(4, 4)
    mod["main"] = mod["main"].with_attr("params", [tvm.runtime.tensor(own)])
    measured = module_as_model(mod, "main", seed=3)
    assert measured.mod is mod and [name for name, _, _ in measured.inputs] == ["x"]
    (first, first_array), (second, second_array) = measured.params
    assert (first, second) == ("first", "second") and second_array.shape == (4, 4)
    np.testing.assert_array_equal(first_array, own)
    np.testing.assert_array_equal(second_array, module_as_model(mod, "main", seed=3).params[1][1])  # seeded


def test_registered_pipeline_outside_the_context_says_what_to_do(model):
    with pytest.raises(DivimlInputError, match="partition_options") as error:
        tvm.compile(model.mod, target=None, relax_pipeline="diviml")
    assert "PartitionForDevices" in str(error.value)


def test_contexts_nest_and_unwind():
    from tvm_diviml.app.partition import _ACTIVE

    with partition_options("cpu2", objective="latency") as outer:
        with partition_options("cpu2", objective="throughput") as inner:
            assert _ACTIVE.get() is inner
        assert _ACTIVE.get() is outer
    assert _ACTIVE.get() is None


@pytest.mark.parametrize(
    "options, field",
    [
        ({"objective": "fastest"}, "objective"),
        ({"solver": "gurobi"}, "solver"),
        ({"cost": "guess"}, "cost"),
        ({"cost": "/no/such/costs.json"}, "cost"),
        ({"time_limit_s": 0}, "time_limit_s"),
        ({"candidates": 0}, "candidates"),
        ({"objective": "pipeline", "stages": 0}, "stages"),
        ({"objective": "pipeline", "stages": 2.5}, "stages"),
    ],
)
def test_unknown_options_are_refused_at_construction(options, field):
    with pytest.raises(DivimlInputError) as error:
        PartitionForDevices("cpu2", **options)
    assert error.value.field == field


def test_an_entry_the_module_lacks_is_named_with_those_it_has(model):
    with pytest.raises(DivimlInputError, match="no Relax function 'nope'") as error:
        PartitionForDevices("cpu2", entry="nope")(model.mod)
    assert "name one of forward" in str(error.value)


def test_unknown_platform_is_refused():
    with pytest.raises(DivimlInputError, match="unknown platform"), partition_options("cpu_nine"):
        pass


def test_a_solver_that_cannot_do_the_objective_fails_through_tvm_as_an_input_error(model):
    with pytest.raises(DivimlInputError, match="slicegraph"):
        PartitionForDevices("cpu2", solver="slicegraph", objective="latency")(model.mod)


def test_a_machine_too_small_for_the_weights_fails_as_an_input_error(model):
    data = get_platform("cpu2").to_json()
    for device in data["devices"]:
        device["memory_bytes"] = 1024
    with pytest.raises(DivimlInputError, match="weights"):
        PartitionForDevices(Platform.from_json(data), solver="greedy")(model.mod)


def test_costs_from_a_table_decide_the_placement(model, tmp_path):
    """A table where cpu0 cannot run anything forces every kernel onto cpu1, given as an object or a file."""
    platform = get_platform("cpu2")
    graph = extract(model.mod, model.entry).graph
    table = TableCostModel(platform, {k: {"cpu0": None, "cpu1": 1e-3} for k in graph.kernels})
    path = str(tmp_path / "costs.json")
    table.save(path)
    for cost in (table, path):
        partition = PartitionForDevices(platform, solver="greedy", cost=cost)
        partition(model.mod)
        assert set(partition.plan.assignment.values()) == {"cpu1"}
        assert math.isclose(partition.plan.simulated_value_s, partition.simulation.value_s)


def test_same_options_same_plan(model):
    plans = []
    for _ in range(2):
        partition = PartitionForDevices("cpu2", solver="split", time_limit_s=2.0, seed=3)
        partition(model.mod)
        plans.append(partition.plan)
    assert plans[0].assignment == plans[1].assignment and plans[0].order == plans[1].order


def test_reimport_keeps_one_working_registration():
    """TVM refuses a second register_pipeline under one name; reloading the module must not, and the
    registered pipeline must still see the reloaded module's partition_options."""
    from tvm import relax

    import tvm_diviml.app.partition as partition_module

    reloaded = importlib.reload(partition_module)
    with reloaded.partition_options("cpu2") as active:
        assert relax.get_pipeline("diviml") is not None and active.platform.name == "cpu2"
    with pytest.raises(DivimlInputError, match="partition_options"):
        relax.get_pipeline("diviml")


@pytest.mark.parametrize("name", ["twin_branch", "resnet18", "bert_base"])
def test_diviml_plan_and_the_pass_place_a_zoo_model_alike(name, tmp_path):
    """Both go through planning.plan_model: ``--solver auto`` means the same in the CLI and in TVM."""
    from tvm_diviml.cli import main
    from tvm_diviml.modelspec import format_model_spec

    spec = format_model_spec(name, SMALL_OPTIONS[name])
    assert (
        main(["plan", spec, "--platform", "paper-node", "--time-limit", "10", "--json", str(tmp_path / "p.json")]) == 0
    )
    row = json.loads((tmp_path / "p.json").read_text())
    partition = PartitionForDevices("paper-node", time_limit_s=10.0)
    partition(build_model(name, SMALL_OPTIONS[name]).mod)
    assert partition.plan.solver == row["solver"]
    assert partition.plan.assignment == row["assignment"]
    assert partition.simulation.value_s == pytest.approx(row["value_s"], rel=1e-12)
