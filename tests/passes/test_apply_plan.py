"""The placed (heterogeneous) build: ApplyPlan + build + SingleVMRunner against the single-device reference.

Every zoo model, placed across this machine's two CPU devices (cpu2) under several plans, must give
the single-device build's outputs; one inference copies exactly the activations that cross devices
(never a weight); the CUDA + llvm build compiles and exports without a GPU; bad plans and platforms
fail with errors that name the problem. Each model is built and referenced once per module (TVM
compiles and the VM's JIT link cost seconds each); most models and plans run only with ``-m slow``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from collections import defaultdict

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.passes import ApplyPlan, apply_plan, build, extract, placed_build_pipeline
from tvm_diviml.passes.apply_plan import PLACEMENT_ATTR
from tvm_diviml.plan import Plan, ReplicaGroup
from tvm_diviml.platform import Platform
from tvm_diviml.presets import get_platform
from tvm_diviml.runtime.packing import PACKED, unpacked
from tvm_diviml.runtime.placement import Placement
from tvm_diviml.runtime.vm import PlacedExecutable, SingleVMRunner
from tvm_diviml.schedules.tiling import WEIGHT_PARAMS_ATTR
from tvm_diviml.simulator import PlanError
from tvm_diviml.zoo import SMALL_OPTIONS, BuiltModel, build_model, zoo_names
from tvm_diviml.zoo.reference import run_reference

from ..helpers import examples

CPU2 = get_platform("cpu2")
PLAN_KINDS = ("cpu1", "alternating", "random")
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
# What the default suite runs (it must stay near a minute on 2 cores; the TVM build and the VM's JIT
# link take 3-30 s per model and plan): the cheapest models, one CNN under one plan; vit_b16's random
# plans are the hypothesis test's.
DEFAULT_RUNS = {"twin_branch": PLAN_KINDS, "vit_b16": ("cpu1", "alternating")}


@dataclasses.dataclass
class ZooCase:
    model: object  # BuiltModel
    extraction: object  # Extraction
    reference: list  # run_reference's outputs

    @property
    def weights(self) -> list[np.ndarray]:
        return [w for _, w in self.model.params]


def zoo_case(name: str) -> ZooCase:
    model = build_model(name, SMALL_OPTIONS[name])
    return ZooCase(model, extract(model.mod, model.entry), run_reference(model))


@pytest.fixture(scope="module")
def zoo():
    """``zoo(name)``: that model's ZooCase, built once per module whatever order the tests run in."""
    cases: dict[str, ZooCase] = {}

    def get(name: str) -> ZooCase:
        if name not in cases:
            cases[name] = zoo_case(name)
        return cases[name]

    return get


@pytest.fixture(scope="module")
def vit(zoo) -> ZooCase:
    return zoo("vit_b16")


@pytest.fixture(scope="module")
def twin(zoo) -> ZooCase:
    return zoo("twin_branch")


def make_plan(extraction, kind: str, devices=("cpu0", "cpu1"), seed: int = 0) -> Plan:
    """All on the non-host device, alternating by topological index, or a seeded random assignment."""
    order = extraction.graph.topo_order
    if kind == "cpu1":
        return Plan({k: devices[1] for k in order})
    if kind == "alternating":
        return Plan({k: devices[i % len(devices)] for i, k in enumerate(order)})
    rng = random.Random(seed)
    return Plan({k: rng.choice(devices) for k in order})


def run_plan(case: ZooCase, plan: Plan, platform: Platform = CPU2):
    """(applied, runner, outputs) of one placed build and one inference."""
    applied = apply_plan(case.model.mod, plan, platform, extraction=case.extraction)
    runner = SingleVMRunner(build(applied), case.weights)
    return applied, runner, runner(case.model.sample_inputs())


def assert_matches_reference(outputs, reference) -> None:
    assert len(outputs) == len(reference)
    for got, want in zip(outputs, reference):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, **TOLERANCE)


def zoo_params():
    """(model, plan kind) for every zoo model and plan; slow unless DEFAULT_RUNS lists it."""
    names = zoo_names()
    # zoo.check_zoo_name refuses names outside SMALL_OPTIONS before TVM loads: the two must agree
    assert set(names) == set(SMALL_OPTIONS), "a zoo model lacks SMALL_OPTIONS (or they name one not in the zoo)"
    out = []
    for name in names:
        for kind in PLAN_KINDS:
            slow = kind not in DEFAULT_RUNS.get(name, ())
            out.append(pytest.param(name, kind, id=f"{name}-{kind}", marks=[pytest.mark.slow] if slow else []))
    return out


# ------------------------------------------------------------------ 1. every zoo model equals the reference
@pytest.mark.parametrize("name, kind", zoo_params())
def test_zoo_model_matches_single_device_build(zoo, name, kind):
    case = zoo(name)
    plan = make_plan(case.extraction, kind)
    applied, _, outputs = run_plan(case, plan)
    assert applied.placement.assignment == plan.assignment
    assert_matches_reference(outputs, case.reference)


# ------------------------------------------------------------------ 2. hypothesis: random assignments
@settings(max_examples=examples(3), deadline=None)
@given(data=st.data())
def test_random_assignment_matches_reference(vit, data):
    kernels = vit.extraction.graph.topo_order
    on_cpu1 = data.draw(st.lists(st.booleans(), min_size=len(kernels), max_size=len(kernels)))
    plan = Plan({k: "cpu1" if flag else "cpu0" for k, flag in zip(kernels, on_cpu1)})
    _, runner, outputs = run_plan(vit, plan)
    assert_matches_reference(outputs, vit.reference)
    expected = expected_copies(vit.extraction, plan.assignment, CPU2.host)
    assert count_to_device_calls(runner, vit.model.sample_inputs()) == expected


# ------------------------------------------------------------------ 3. weights uploaded once
def expected_copies(extraction, assignment: dict[str, str], host: str) -> int:
    """Activation copies per inference, from the graph alone: each tensor (a view counts as its
    base) goes once to every other device that reads it; inputs start and outputs end on the host."""

    def base(ref):
        while ref.kind == "view":
            ref = extraction.views[ref][0]
        return ref

    readers: dict = defaultdict(set)
    for kernel, args in extraction.kernel_args.items():
        for ref in map(base, args):
            if ref.kind in ("kernel", "input"):
                readers[ref].add(assignment[kernel])
    for ref in map(base, extraction.outputs):
        readers[ref].add(host)
    return sum(
        len(devices - {host if ref.kind == "input" else assignment[ref.name]}) for ref, devices in readers.items()
    )


def count_to_device_calls(runner: SingleVMRunner, inputs) -> int:
    calls = []

    def instrument(func, symbol, before_run, ret_value, *args):
        if before_run and symbol == "vm.builtin.to_device":
            calls.append(symbol)
        return 0  # VMInstrumentReturnKind.NO_OP: run the call normally

    runner.vm.set_instrument(instrument)
    try:
        runner(inputs)
    finally:
        runner.vm.set_instrument(None)
    return len(calls)


@pytest.mark.parametrize("kind", ["random", "cpu1"])
def test_one_inference_copies_activations_never_weights(vit, kind):
    plan = make_plan(vit.extraction, kind, seed=3)
    applied, runner, _ = run_plan(vit, plan)
    expected = expected_copies(vit.extraction, plan.assignment, CPU2.host)
    inputs = vit.model.sample_inputs()
    assert count_to_device_calls(runner, inputs) == expected
    assert count_to_device_calls(runner, inputs) == expected  # the second inference as well
    assert applied.placement.copies_per_run == expected
    if kind == "cpu1":
        # Hand count: the one input goes to cpu1 and the one output comes back; the dozens of weights never move.
        assert len(vit.model.inputs) == 1 and len(vit.extraction.outputs) == 1
        assert expected == 2
        assert len(vit.model.params) > 10
        assert {device for _, _, device in applied.placement.weight_params} == {"cpu1"}


def tuple_and_constant_model():
    """A BuiltModel the zoo lacks: a kernel with a tuple output (split) read on two devices, and one
    constant read by two kernels (the constants function and per-device constant parameters)."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 8], "float32"))
    w = relax.Var("w", relax.TensorType([8, 8], "float32"))
    offsets = relax.const(np.arange(16, dtype="float32").reshape(4, 4))
    with builder.function("main", [x, w], attrs={"num_input": 1}):
        with builder.dataflow():
            halves = builder.emit(relax.op.split(builder.emit(relax.op.matmul(x, w)), 2, axis=1))
            left, right = relax.TupleGetItem(halves, 0), relax.TupleGetItem(halves, 1)
            shifted = builder.emit(relax.op.reshape(relax.op.add(left, offsets), [16]))
            mixed = builder.emit(relax.op.multiply(relax.op.exp(right), relax.op.subtract(left, offsets)))
            out = builder.emit_output(relax.Tuple([shifted, mixed]))
        builder.emit_func_output(out)
    weight = np.random.default_rng(0).standard_normal((8, 8)).astype("float32")
    return BuiltModel("tuple_and_constant", builder.get(), "main", [("x", (4, 8), "float32")], [("w", weight)])


def test_every_assignment_of_a_tuple_and_constant_model_matches_and_copies_as_counted():
    model = tuple_and_constant_model()
    hand = ZooCase(model, extract(model.mod, model.entry), run_reference(model))
    reads = [ref for args in hand.extraction.kernel_args.values() for ref in args]
    assert sum(ref.kind == "const" for ref in reads) == 2, "the constant no longer reaches two kernels"
    assert any(ref.index is not None for ref in reads), "no kernel's tuple output is read any more"
    order = hand.extraction.graph.topo_order
    for devices in itertools.product(CPU2.device_names, repeat=len(order)):
        plan = Plan(dict(zip(order, devices)))
        applied, runner, outputs = run_plan(hand, plan)
        assert_matches_reference(outputs, hand.reference)
        expected = expected_copies(hand.extraction, plan.assignment, CPU2.host)
        assert count_to_device_calls(runner, model.sample_inputs()) == expected == applied.placement.copies_per_run


def constant_and_view_model():
    """The structure of torchvision's and Hugging Face's models that lost the constants function: a
    constant (as batch-norm statistics become) and an operator the build still legalizes (the reshape
    after a reduction, as in a classifier's flatten); LegalizeOps drops private functions no one calls."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 4, 4], "float32"))
    w = relax.Var("w", relax.TensorType([4, 8], "float32"))
    scale = relax.const(np.linspace(0.5, 1.5, 4, dtype="float32").reshape(4, 1))
    with builder.function("main", [x, w], attrs={"num_input": 1}):
        with builder.dataflow():
            pooled = builder.emit(relax.op.mean(relax.op.multiply(x, scale), axis=[2], keepdims=True))
            flat = builder.emit(relax.op.reshape(pooled, [2, 4]))
            out = builder.emit_output(relax.op.matmul(flat, w))
        builder.emit_func_output(out)
    weight = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    return BuiltModel("constant_and_view", builder.get(), "main", [("x", (2, 4, 4), "float32")], [("w", weight)])


@pytest.mark.parametrize("kind", ["cpu1", "alternating"])
def test_constants_survive_a_build_that_legalizes(kind):
    model = constant_and_view_model()
    case = ZooCase(model, extract(model.mod, model.entry), run_reference(model))
    assert case.extraction.constants and case.extraction.views, "the model no longer has a constant and a view"
    applied, _, outputs = run_plan(case, make_plan(case.extraction, kind))
    assert applied.placement.constants_func
    assert_matches_reference(outputs, case.reference)


def packed_weights_model():
    """A weight and a constant that matmuls read along their output columns (both packed), then a
    product of two activations (neither packed)."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([16, 64], "float32"))
    w = relax.Var("w", relax.TensorType([64, 48], "float32"))
    rng = np.random.default_rng(0)
    constant = relax.const(rng.standard_normal((48, 32)).astype("float32"))
    with builder.function("main", [x, w], attrs={"num_input": 1}):
        with builder.dataflow():
            hidden = builder.emit(relax.op.nn.relu(relax.op.matmul(x, w)))
            features = builder.emit(relax.op.matmul(hidden, constant))
            out = builder.emit_output(relax.op.matmul(features, relax.op.permute_dims(features)))
        builder.emit_func_output(out)
    weight = rng.standard_normal((64, 48)).astype("float32")
    return BuiltModel("packed_weights", builder.get(), "main", [("x", (16, 64), "float32")], [("w", weight)])


@pytest.mark.parametrize("kind", ["cpu1", "alternating"])
def test_weights_and_constants_read_packed_are_uploaded_packed_and_match(kind):
    model = packed_weights_model()
    case = ZooCase(model, extract(model.mod, model.entry), run_reference(model))
    marks = {}
    for node, func_name in case.extraction.kernel_func.items():
        attrs = case.extraction.mod[func_name].attrs
        marks[node] = [int(i) for i in attrs[WEIGHT_PARAMS_ATTR]] if WEIGHT_PARAMS_ATTR in attrs else []
    # the transpose and the product of two activations read no weight
    assert marks == {"fused_matmul_relu": [1], "matmul1": [1], "transpose": [], "matmul2": []}, marks
    applied, _, outputs = run_plan(case, make_plan(case.extraction, kind))
    assert_matches_reference(outputs, case.reference)
    packed = [unpacked(k, name) for k, name, _ in applied.placement.weight_params if k == PACKED]
    assert sorted(k for k, _ in packed) == ["const", "weight"]
    assert applied.placement.constants_func  # the constant, read packed only, is still made


def test_a_primfunc_shared_by_a_kernel_and_the_weight_preparation_builds():
    """The same transpose for an activation (a kernel, given cpu1's target) and for a weight (the lifted
    weight preparation, run on the host), as ONNX exports of BERT have: two functions of one name."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([8, 8], "float32"))
    w = relax.Var("w", relax.TensorType([8, 8], "float32"))
    with builder.function("main", [x, w], attrs={"num_input": 1}):
        with builder.dataflow():
            transposed = builder.emit(relax.op.permute_dims(x))
            out = builder.emit_output(relax.op.matmul(transposed, relax.op.permute_dims(w)))
        builder.emit_func_output(out)
    weight = np.random.default_rng(0).standard_normal((8, 8)).astype("float32")
    model = BuiltModel("shared_transpose", builder.get(), "main", [("x", (8, 8), "float32")], [("w", weight)])
    case = ZooCase(model, extract(model.mod, model.entry), run_reference(model))
    assert case.extraction.transform_params and "transpose" in case.extraction.graph.kernels
    _, _, outputs = run_plan(case, make_plan(case.extraction, "cpu1"))
    assert_matches_reference(outputs, case.reference)


def test_torch_model_with_buffers_builds_placed_and_matches_torch():
    """Batch-norm running statistics and a registered buffer (torch's buffers become constants)."""
    from ..helpers import torch_model_with_buffers

    model, example, built = torch_model_with_buffers()
    case = ZooCase(built, extract(built.mod, built.entry), None)
    _, runner, _ = run_plan(case, make_plan(case.extraction, "alternating"))
    (got,) = runner([example.numpy()])
    np.testing.assert_allclose(got, model(example).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_model_returning_its_input_builds_and_runs():
    """A model may return an input as it came (no kernel makes it): the single VM hands it back."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 8], "float32"))
    w = relax.Var("w", relax.TensorType([8, 8], "float32"))
    with builder.function("main", [x, w], attrs={"num_input": 1}):
        with builder.dataflow():
            out = builder.emit_output(relax.Tuple([builder.emit(relax.op.matmul(x, w)), x]))
        builder.emit_func_output(out)
    model = BuiltModel(
        "passthrough", builder.get(), "main", [("x", (4, 8), "float32")], [("w", np.eye(8, dtype="float32"))]
    )
    hand = ZooCase(model, extract(model.mod, model.entry), run_reference(model))
    _, _, outputs = run_plan(hand, make_plan(hand.extraction, "cpu1"))
    assert_matches_reference(outputs, hand.reference)


# ------------------------------------------------------------------ 4. CUDA + llvm builds and exports here
def entry_calls(mod, entry: str) -> list:
    """The entry function's call_tir calls in emission order."""
    calls = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.call_tir":
            calls.append(expr)

    relax.analysis.post_order_visit(mod[entry], visit)
    return calls


def target_of(target) -> dict:
    exported = target.export()
    return {"kind": exported["kind"], "arch": exported.get("arch")}


@pytest.fixture(scope="module")
def paper_node_build(vit):
    """vit_b16 on paper-node's cpu and both GPUs at random, one shared PrimFunc forced onto cpu and a GPU."""
    platform = get_platform("paper-node")
    order = vit.extraction.graph.topo_order
    func_of = vit.extraction.kernel_func
    rng = random.Random(7)
    assignment = {k: rng.choice(platform.device_names) for k in order}
    shared = next(f for f in func_of.values() if list(func_of.values()).count(f) > 1)
    first, *_, last = [k for k in order if func_of[k] == shared]
    other = next(k for k in order if func_of[k] != shared)
    assignment.update({first: "cpu", last: "rtx2080ti", other: "gtx1080ti"})
    applied = apply_plan(vit.model.mod, Plan(assignment), platform, extraction=vit.extraction)
    return platform, applied, build(applied), shared


def test_cuda_llvm_primfuncs_carry_their_devices_target(paper_node_build, vit):
    platform, applied, _, shared_func = paper_node_build
    order = vit.extraction.graph.topo_order
    calls = entry_calls(applied.mod, applied.placement.entry)
    assert len(calls) == len(order)
    callees: dict[str, set[str]] = defaultdict(set)
    for kernel, call in zip(order, calls):
        device = platform.device(applied.placement.assignment[kernel])
        want = {"kind": device.target["kind"], "arch": device.target.get("arch")}
        callee = applied.mod[call.args[0]]
        assert target_of(callee.attrs["target"]) == want, kernel
        assert target_of(call.ty.vdevice.target) == want, kernel
        callees[vit.extraction.kernel_func[kernel]].add(call.args[0].name_hint)
    for func, names in callees.items():
        targets = {
            json.dumps(platform.device(applied.placement.assignment[k]).target, sort_keys=True)
            for k in order
            if vit.extraction.kernel_func[k] == func
        }
        assert len(names) == len(targets), func  # one copy of the PrimFunc per target
    assert len(callees[shared_func]) >= 2
    assert set(applied.placement.assignment.values()) == set(platform.device_names)


def unused_primfuncs(mod) -> set[str]:
    """PrimFuncs that no Relax function of ``mod`` calls."""
    called = set()

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.args and isinstance(expr.args[0], tvm.ir.GlobalVar):
            called.add(expr.args[0].name_hint)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return {gvar.name_hint for gvar, func in mod.functions_items() if isinstance(func, tvm.tirx.PrimFunc)} - called


def test_apply_plan_adds_no_unused_primfunc(paper_node_build, vit):
    """A PrimFunc used on two targets is there once per target; its untargeted original is not kept
    (it would be compiled for the host for nothing). TVM's own lowering leaves a few unused ones."""
    _, applied, _, _ = paper_node_build
    assert sorted(unused_primfuncs(applied.mod) - unused_primfuncs(vit.extraction.mod)) == []


def test_cuda_llvm_build_exports_and_load_explains_missing_cuda(paper_node_build, tmp_path):
    _, applied, built, _ = paper_node_build
    path = built.export(str(tmp_path / "vit.so"))
    assert (tmp_path / "vit.so").stat().st_size > 0
    exported = Placement.from_json((tmp_path / "vit.so.placement.json").read_text())
    assert dataclasses.replace(exported, library_sha256=None, versions={}) == applied.placement
    if tvm.cuda(0).exist:
        pytest.skip("this machine has a GPU: loading succeeds")
    with pytest.raises(DivimlInputError, match="cuda"):
        PlacedExecutable.load(path)


def test_json_platform_with_absent_gpu_fails_at_new_vm_naming_it(twin):
    if tvm.cuda(0).exist:
        pytest.skip("this machine has a GPU")
    platform = Platform.from_json(
        {
            "name": "cpu-and-gpu",
            "default_link": {"latency_s": 1e-5, "bandwidth_Bps": 1e10},
            "devices": [
                {
                    "name": "host",
                    "target": {"kind": "llvm"},
                    "device": "cpu:0",
                    "peak_flops": 1e12,
                    "bandwidth_Bps": 1e11,
                },
                {
                    "name": "gpu",
                    "target": {"kind": "cuda", "arch": "sm_75"},
                    "device": "cuda:0",
                    "peak_flops": 1e13,
                    "bandwidth_Bps": 6e11,
                },
            ],
        }
    )
    built = build(
        apply_plan(
            twin.model.mod, make_plan(twin.extraction, "cpu1", ("host", "gpu")), platform, extraction=twin.extraction
        )
    )
    with pytest.raises(DivimlInputError, match="cuda:0"):
        SingleVMRunner(built, twin.weights)


# ------------------------------------------------------------------ 5. errors
def test_plan_for_another_model_is_a_plan_error(vit, twin):
    other = make_plan(twin.extraction, "alternating")
    with pytest.raises(PlanError, match="leaves kernel .* unassigned") as raised:
        apply_plan(vit.model.mod, other, CPU2, extraction=vit.extraction)
    assert isinstance(raised.value, DivimlInputError)
    assert "does not match" in str(raised.value)


def test_plan_naming_an_unknown_kernel_is_a_plan_error(twin):
    plan = make_plan(twin.extraction, "alternating")
    plan.assignment["no_such_kernel"] = "cpu0"
    with pytest.raises(PlanError, match="names kernel 'no_such_kernel'"):
        apply_plan(twin.model.mod, plan, CPU2, extraction=twin.extraction)


def test_device_the_platform_lacks_is_named(twin):
    plan = make_plan(twin.extraction, "alternating", devices=("cpu0", "tpu7"))
    with pytest.raises(PlanError, match="'tpu7'.*lacks"):
        apply_plan(twin.model.mod, plan, CPU2, extraction=twin.extraction)


@pytest.mark.parametrize("replicated", ["replicas", "batch_split"])
def test_replicated_plans_are_rejected(twin, replicated):
    plan = make_plan(twin.extraction, "cpu1")
    if replicated == "replicas":
        plan.replicas = [ReplicaGroup(list(plan.assignment), {"cpu0": 0.5, "cpu1": 0.5})]
    else:
        plan.batch_split = 2
    with pytest.raises(PlanError, match="replicas or batch_split"):
        apply_plan(twin.model.mod, plan, CPU2, extraction=twin.extraction)


def test_two_platform_devices_on_one_tvm_device_are_rejected(twin):
    devices = [CPU2.devices[0], dataclasses.replace(CPU2.devices[1], device="cpu:0")]
    platform = Platform("same-cpu", devices, CPU2.links)
    with pytest.raises(DivimlInputError, match="'cpu0' and 'cpu1' are both TVM device cpu:0"):
        apply_plan(twin.model.mod, make_plan(twin.extraction, "alternating"), platform, extraction=twin.extraction)


def test_plan_order_across_devices_that_deadlocks_is_a_plan_error(twin):
    # twin_branch: a0 -> a1 and b0 -> b1 feed the sum. cpu0 runs b1 before a0, cpu1 runs a1 before b0:
    # a0 -> a1 -> b0 -> b1 -> a0 is a cycle, though each device's order alone respects the data.
    a0, a1, b0, b1, total = twin.extraction.graph.topo_order
    edges = {(e.src, e.dst) for e in twin.extraction.graph.edges}
    assert edges == {(a0, a1), (b0, b1), (a1, total), (b1, total)}
    plan = Plan(
        {a0: "cpu0", b1: "cpu0", total: "cpu0", a1: "cpu1", b0: "cpu1"},
        order={"cpu0": [b1, a0, total], "cpu1": [a1, b0]},
    )
    with pytest.raises(PlanError, match="contradicts the data dependencies"):
        apply_plan(twin.model.mod, plan, CPU2, extraction=twin.extraction)


def test_plan_order_other_than_topological_runs_correctly(twin):
    a0, a1, b0, b1, total = twin.extraction.graph.topo_order
    plan = Plan({k: "cpu0" for k in (a0, a1, b0, b1, total)}, order={"cpu0": [b0, b1, a0, a1, total]})
    _, _, outputs = run_plan(twin, plan)
    assert_matches_reference(outputs, twin.reference)


# ------------------------------------------------------------------ 6. ApplyPlan as a module pass; 7. export
@pytest.fixture(scope="module")
def twin_build(twin):
    applied = apply_plan(twin.model.mod, make_plan(twin.extraction, "alternating"), CPU2, extraction=twin.extraction)
    return build(applied)


def test_wrong_number_of_inputs_is_an_error(twin, twin_build):
    runner = SingleVMRunner(twin_build, twin.weights)
    with pytest.raises(DivimlInputError, match="takes 1 inputs"):
        runner(twin.model.sample_inputs() * 2)


@pytest.mark.parametrize("change", ["one_missing", "one_extra"])
def test_wrong_number_of_weights_is_an_error(twin, twin_build, change):
    weights = twin.weights[:-1] if change == "one_missing" else twin.weights + twin.weights[:1]
    with pytest.raises(DivimlInputError, match=f"{len(twin.weights)} weights, {len(weights)} were given"):
        SingleVMRunner(twin_build, weights)


def test_apply_plan_module_pass_builds_with_the_placed_pipeline(twin):
    plan = make_plan(twin.extraction, "random", seed=5)
    placed = ApplyPlan(plan, CPU2)(twin.model.mod)
    placement = Placement.from_json(str(placed.attrs[PLACEMENT_ATTR]))
    assert placement.assignment == plan.assignment
    assert placement.devices[0] == CPU2.host
    executable = tvm.compile(placed, target=None, relax_pipeline=placed_build_pipeline())
    runner = SingleVMRunner(PlacedExecutable(executable, placement), twin.weights)
    assert_matches_reference(runner(twin.model.sample_inputs()), twin.reference)


def test_export_load_round_trip_on_cpu2(twin, twin_build, tmp_path):
    path = twin_build.export(str(tmp_path / "twin.so"))
    loaded = PlacedExecutable.load(path)
    assert dataclasses.replace(loaded.placement, library_sha256=None, versions={}) == twin_build.placement
    assert_matches_reference(SingleVMRunner(loaded, twin.weights)(twin.model.sample_inputs()), twin.reference)


class HalfWritten:
    """An executable whose export stops halfway through writing the library (Ctrl-C, a full disk)."""

    def export_library(self, path):
        with open(path, "wb") as handle:
            handle.write(b"half a library")
        raise KeyboardInterrupt


def test_an_interrupted_export_keeps_the_old_pair_and_a_mixed_pair_is_refused(twin, twin_build, tmp_path):
    path = twin_build.export(str(tmp_path / "twin.so"))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(KeyboardInterrupt):
        PlacedExecutable(HalfWritten(), twin_build.placement).export(path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing new, nothing left over
    assert PlacedExecutable.load(path).placement.assignment == twin_build.placement.assignment
    (tmp_path / "twin.so").write_bytes(b"another export's library")
    with pytest.raises(DivimlInputError, match="come from different exports"):
        PlacedExecutable.load(path)


def test_loading_nothing_says_what_is_missing(tmp_path):
    with pytest.raises(DivimlInputError, match="placement.json"):
        PlacedExecutable.load(str(tmp_path / "absent.so"))


@pytest.mark.parametrize("sidecar", ["{not json", '{"entry": "forward"}'])
def test_damaged_placement_sidecar_is_a_clear_error(tmp_path, sidecar):
    library = tmp_path / "model.so"
    library.write_bytes(b"")
    (tmp_path / "model.so.placement.json").write_text(sidecar)
    with pytest.raises(DivimlInputError, match="placement.json"):
        PlacedExecutable.load(str(library))
