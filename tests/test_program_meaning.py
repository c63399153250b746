"""Programs are built with their meaning or refused in one line, never changed without a word: a
placement keeps the module's functions it did not place, callable and computing what a plain build
computes."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.passes import ApplyPlan, extract, placed_build_pipeline
from tvm_diviml.passes.partition import PartitionForDevices
from tvm_diviml.plan import Plan
from tvm_diviml.presets import get_platform
from tvm_diviml.runtime.placement import Placement
from tvm_diviml.runtime.vm import PlacedExecutable

CPU2 = get_platform("cpu2")


def prefill_decode_module():
    """``main`` (placed) beside ``decode`` (symbolic length, calling ``project``) and ``create_cache``."""
    builder = relax.BlockBuilder()
    x, w = relax.Var("x", relax.TensorType([2, 8], "float32")), relax.Var("w", relax.TensorType([8, 8], "float32"))
    with builder.function("main", [x, w], attrs={"num_input": 1}):
        with builder.dataflow():
            hidden = builder.emit(relax.op.nn.relu(relax.op.matmul(x, w)))
            projected = builder.emit(relax.op.matmul(hidden, relax.op.permute_dims(w)))
            out = builder.emit_output(relax.op.add(relax.op.tanh(hidden), projected))
        builder.emit_func_output(out)
    length = tirx.Var("n", "int64")
    x, w = relax.Var("x", relax.TensorType([length, 8], "float32")), relax.Var("w", relax.TensorType([8, 8], "float32"))
    with builder.function("project", [x, w]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.matmul(x, relax.op.permute_dims(w)))
        builder.emit_func_output(out)
    project = builder.get().get_global_var("project")
    x, w = relax.Var("x", relax.TensorType([length, 8], "float32")), relax.Var("w", relax.TensorType([8, 8], "float32"))
    with builder.function("decode", [x, w], attrs={"num_input": 1}):
        with builder.dataflow():
            out = builder.emit_output(relax.op.add(builder.emit(relax.Call(project, [x, w])), x))
        builder.emit_func_output(out)
    with builder.function("create_cache", []):
        with builder.dataflow():
            out = builder.emit_output(relax.op.full([4, 8], relax.const(1.5, "float32")))
        builder.emit_func_output(out)
    return builder.get()


def placed_by_the_pass(mod):
    partition = PartitionForDevices("cpu2", solver="heft", time_limit_s=2.0)
    executable = tvm.compile(mod, target=None, relax_pipeline=partition.pipeline())
    return PlacedExecutable(executable, partition.placement).new_vm()


def placed_across_both_cpus(mod):
    kernels = extract(mod, "main").graph.topo_order
    plan = Plan({kernel: ("cpu0", "cpu1")[i % 2] for i, kernel in enumerate(kernels)})
    placed = ApplyPlan(plan, CPU2)(mod)
    executable = tvm.compile(placed, target=None, relax_pipeline=placed_build_pipeline())
    placement = Placement.from_json(placed.attrs["diviml_placement"])
    assert set(placement.assignment.values()) == {"cpu0", "cpu1"}
    return PlacedExecutable(executable, placement).new_vm()


@pytest.mark.parametrize("place", [placed_by_the_pass, placed_across_both_cpus])
def test_functions_the_placement_did_not_place_stay_callable_and_compute_as_a_plain_build(place):
    """PartitionForDevices and ApplyPlan kept only the placed function: ``vm["decode"]`` failed."""
    mod = prefill_decode_module()
    llvm = tvm.target.Target("llvm")
    plain = relax.VirtualMachine(tvm.compile(mod, llvm, relax_pipeline=relax.get_default_pipeline(llvm)), tvm.cpu())
    placed = place(mod)
    rng = np.random.default_rng(0)
    x, w = (tvm.runtime.tensor(rng.standard_normal(shape).astype("float32")) for shape in ((5, 8), (8, 8)))
    for name, args in (("decode", (x, w)), ("project", (x, w)), ("create_cache", ())):
        np.testing.assert_allclose(placed[name](*args).numpy(), plain[name](*args).numpy(), rtol=1e-6, atol=1e-6)


def test_a_function_calling_the_placed_one_is_refused_in_one_line():
    mod = prefill_decode_module()
    builder = relax.BlockBuilder(mod)
    x, w = relax.Var("x", relax.TensorType([2, 8], "float32")), relax.Var("w", relax.TensorType([8, 8], "float32"))
    with builder.function("twice", [x, w]):
        with builder.dataflow():
            once = builder.emit(relax.Call(mod.get_global_var("main"), [x, w]))
            out = builder.emit_output(relax.Call(mod.get_global_var("main"), [once, w]))
        builder.emit_func_output(out)
    with pytest.raises(DivimlInputError, match=r"function 'twice' calls 'main', the function being placed") as caught:
        placed_across_both_cpus(builder.get())
    assert "\n" not in str(caught.value)
