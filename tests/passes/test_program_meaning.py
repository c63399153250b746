"""Programs are built with their meaning or refused in one line, never changed without a word: a
placement keeps the module's functions it did not place, callable and computing what a plain build
computes; a program exported in training mode, drawing random numbers or updating its buffers in place
is refused at import, naming the operator or the buffer and the fix."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tvm_diviml.app.partition import PartitionForDevices
from tvm_diviml.cli import main
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.frontends.importers import from_torch_export, load_onnx
from tvm_diviml.passes import ApplyPlan, extract, placed_build_pipeline
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


# ---------------------------------------------------------------------- programs that train or keep state
def torch_programs():
    """name -> (a torch module in training mode, its example inputs, what the refusal says)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")

    class Normalised(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.norm, self.drop = torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Identity()

        def forward(self, x):
            return self.drop(self.norm(self.linear(x)))

    class Dropped(Normalised):
        def __init__(self):
            super().__init__()
            self.norm, self.drop = torch.nn.Identity(), torch.nn.Dropout(0.5)

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x):
            self.count.add_(1)
            return self.linear(x) * self.count

    class Accumulator(torch.nn.Module):
        def forward(self, x, total):
            total.add_(x)
            return total * 2

    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + torch.randn_like(x)

    x = torch.randn(4, 8)
    return {
        "batch norm": (
            Normalised(),
            (x,),
            r"BatchNorm1d 'norm' runs in training mode \(.*model.eval\(\) before torch.export",
        ),
        "dropout": (Dropped(), (x,), r"Dropout 'drop' runs in training mode \(.*model.eval\(\) before torch.export"),
        "buffer": (Counter().eval(), (x,), r"the program updates buffer 'count' in place; a build .* keeps no state"),
        "input": (Accumulator(), (x, x.clone()), r"the program updates input 'total' in place"),
        "random": (Noisy(), (x,), r"operator 'randn_like' draws random numbers \(aten.randn_like.default\)"),
    }


@pytest.mark.parametrize("name", ["batch norm", "dropout", "buffer", "input", "random"])
def test_a_torch_program_whose_meaning_the_build_would_change_is_refused_in_one_line(name):
    """Before, each imported: the BatchNorm used its running statistics (0.53 relative off torch's
    training-mode outputs), the Dropout vanished, and the counter's second call was 0.5 off."""
    import torch

    module, args, message = torch_programs()[name]
    with pytest.raises(DivimlInputError, match=message) as caught:
        from_torch_export(torch.export.export(module, args))
    assert "\n" not in str(caught.value)


def test_the_same_modules_in_eval_mode_import():
    import torch

    for name in ("batch norm", "dropout"):
        module, args, _ = torch_programs()[name]
        assert from_torch_export(torch.export.export(module.eval(), args)).inputs == [("x", (4, 8), "float32")]


def test_a_saved_training_program_is_refused_by_the_command_line_in_one_line(tmp_path, capsys):
    import torch

    module, args, _ = torch_programs()["batch norm"]
    path = tmp_path / "trained.pt2"
    torch.export.save(torch.export.export(module, args), str(path))
    assert main(["graph", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: field 'MODEL': BatchNorm1d 'norm' runs in training mode" in err and err.count("\n") == 1, err


def onnx_file(tmp_path, node, initializers) -> str:
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install 'tvm-diviml[onnx]')")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
        [onnx.numpy_helper.from_array(np.asarray(value), name) for name, value in initializers.items()],
    )
    path = str(tmp_path / "model.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), path)
    return path


def onnx_cases():
    from onnx import helper

    statistics = {name: np.full(3, value, np.float32) for name, value in (("s", 1), ("b", 0), ("m", 0), ("v", 1))}
    return {
        "batch norm": (
            helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], training_mode=1, name="bn"),
            statistics,
            r"BatchNormalization 'bn' runs in training mode \(training_mode=1\)",
        ),
        "dropout": (
            helper.make_node("Dropout", ["x", "ratio", "training"], ["y"], name="drop"),
            {"ratio": np.float32(0.5), "training": np.bool_(True)},
            r"Dropout 'drop' runs in training mode \(its training_mode is true\)",
        ),
    }


@pytest.mark.parametrize("name", ["batch norm", "dropout"])
def test_an_onnx_model_in_training_mode_is_refused_in_one_line(tmp_path, name):
    """TVM's ONNX importer made every Dropout an identity and imported a training BatchNormalization."""
    pytest.importorskip("onnx", reason="onnx is not installed (pip install 'tvm-diviml[onnx]')")
    node, initializers, message = onnx_cases()[name]
    path = onnx_file(tmp_path, node, initializers)
    with pytest.raises(DivimlInputError, match=message) as caught:
        load_onnx(path)
    assert str(caught.value).startswith(path) and "model.eval()" in str(caught.value)


def test_an_onnx_dropout_in_inference_mode_imports(tmp_path):
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install 'tvm-diviml[onnx]')")
    node = onnx.helper.make_node("Dropout", ["x", "ratio", "training"], ["y"], name="drop")
    path = onnx_file(tmp_path, node, {"ratio": np.float32(0.5), "training": np.bool_(False)})
    assert load_onnx(path).inputs == [("x", (4, 3), "float32")]
