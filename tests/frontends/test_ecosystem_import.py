"""Models from outside the zoo: the front-end rewrites for what TVM imports but cannot compile, the
one-line error where no rewrite exists, operators lowering leaves outside kernels, and ``.pt2``
programs (``torch.export.save``) on the command line."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from tvm import relax

from tvm_diviml.cli import main
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.frontends.importers import from_relax, load_torch_program, register_pytree_types
from tvm_diviml.passes import apply_plan, build, extract
from tvm_diviml.plan import Plan
from tvm_diviml.presets import get_platform
from tvm_diviml.runtime.vm import SingleVMRunner

CPU2 = get_platform("cpu2")


def bool_cumsum_module():
    """``cumsum`` of a comparison, as Hugging Face's GPT-2 and LLaMA compute packed-sequence ids."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 8], "float32"))
    with builder.function("main", [x], attrs={"num_input": 1}):
        with builder.dataflow():
            positive = builder.emit(relax.op.greater(x, relax.const(0.0, "float32")))
            running = builder.emit(relax.op.cumsum(positive, axis=1))
            out = builder.emit_output(relax.op.add(relax.op.astype(running, "float32"), x))
        builder.emit_func_output(out)
    return builder.get()


def run_placed(mod, params, inputs, kind: str = "alternating"):
    extraction = extract(mod, "main")
    order = extraction.graph.topo_order
    devices = {"alternating": [("cpu0", "cpu1")[i % 2] for i in range(len(order))], "cpu1": ["cpu1"] * len(order)}
    runner = SingleVMRunner(
        build(apply_plan(mod, Plan(dict(zip(order, devices[kind]))), CPU2, extraction=extraction)), params
    )
    return runner(inputs)


def test_boolean_cumsum_is_rewritten_to_int64_and_matches_numpy():
    x = np.random.default_rng(0).standard_normal((2, 8)).astype("float32")
    built = from_relax(bool_cumsum_module())
    (got,) = run_placed(built.mod, [], [x])
    np.testing.assert_allclose(got, np.cumsum(x > 0, axis=1) + x, rtol=1e-6, atol=1e-6)


def test_a_take_from_the_end_counts_from_the_end():
    """torch's ``x[:, -1]`` imports as ``take`` at -1, which TVM's fast mode reads before the row:
    the front end counts such constant indices from the start (an LSTM's head came out 1e20 off)."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([3, 5, 4], "float32"))
    with builder.function("main", [x], attrs={"num_input": 1}):
        with builder.dataflow():
            last = builder.emit(relax.op.take(x, relax.const(-1, "int64"), axis=1))
            picked = builder.emit(relax.op.take(x, relax.const(np.array([0, -2, -4], "int64")), axis=2))
            row = builder.emit(relax.op.reshape(x, [60]))
            flat = builder.emit(relax.op.take(row, relax.const(np.array([-1, 7], "int64"))))
            out = builder.emit_output(relax.Tuple([last, picked, flat]))
        builder.emit_func_output(out)
    data = np.random.default_rng(0).standard_normal((3, 5, 4)).astype("float32")
    got = run_placed(from_relax(builder.get()).mod, [], [data])
    for have, want in zip(got, [data[:, -1], data[:, :, [0, -2, -4]], data.reshape(-1)[[-1, 7]]], strict=True):
        np.testing.assert_array_equal(have, want)


def test_a_kernel_tvm_cannot_compile_is_named_in_one_line():
    """Without the front end's rewrite, TVM's LLVM code generation rejects the boolean scan."""
    with pytest.raises(DivimlInputError) as caught:
        run_placed(bool_cumsum_module(), [], [np.zeros((2, 8), "float32")], kind="cpu1")
    message = str(caught.value)
    assert "\n" not in message
    assert re.search(r"cannot compile kernel 'cumsum' \(reads bool\[2, 8\]; writes bool\[2, 8\]\) for llvm", message)


def test_profiling_a_kernel_tvm_cannot_compile_names_it_too():
    from tvm_diviml.profiling.measured import MeasureOptions, time_primfuncs

    extraction = extract(bool_cumsum_module(), "main")
    funcs = {name: extraction.mod[name] for name in set(extraction.kernel_func.values())}
    with pytest.raises(DivimlInputError, match=r"cannot compile kernel 'cumsum' \(reads bool\[2, 8\]"):
        time_primfuncs(funcs, CPU2.device("cpu0"), MeasureOptions(progress=False))


def test_an_integer_scan_becomes_a_kernel_and_is_placed():
    """cumsum is lowered by the sort/scan dispatch, not LegalizeOps: extraction must see it as a
    kernel (it used to pass its input through, and RoBERTa's position ids came out wrong)."""
    builder = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType([1, 6], "int64"))
    with builder.function("main", [ids], attrs={"num_input": 1}):
        with builder.dataflow():
            mask = builder.emit(relax.op.astype(relax.op.not_equal(ids, relax.const(1, "int64")), "int32"))
            out = builder.emit_output(relax.op.multiply(relax.op.cumsum(mask, axis=1), mask))
        builder.emit_func_output(out)
    mod = builder.get()
    assert any("cumsum" in k for k in extract(mod, "main").graph.kernels)
    tokens = np.array([[5, 1, 7, 7, 1, 9]], dtype="int64")
    (got,) = run_placed(mod, [], [tokens])
    mask = (tokens != 1).astype("int32")
    np.testing.assert_array_equal(got, np.cumsum(mask, axis=1) * mask)


def test_a_tensor_made_outside_any_kernel_is_refused_not_passed_through():
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4], "float32"))
    with builder.function("main", [x], attrs={"num_input": 1}):
        with builder.dataflow():
            made = builder.emit(relax.call_pure_packed("my_library.double", x, ty_args=x.ty))
            out = builder.emit_output(relax.op.add(made, x))
        builder.emit_func_output(out)
    with pytest.raises(
        DivimlInputError,
        match=r"computed by relax.call_pure_packed\(my_library.double\), which lowering "
        r"leaves outside any TIR kernel",
    ):
        extract(builder.get(), "main")


# ---------------------------------------------------------------------- .pt2 programs
@pytest.fixture(scope="module")
def program_file(tmp_path_factory):
    """(path, model, example): a small model with batch norm, saved with torch.export.save."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")

    class TwoBranches(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.left, self.right = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
            self.norm = torch.nn.BatchNorm1d(8)

        def forward(self, x):
            return self.norm(torch.relu(self.left(x)) + torch.tanh(self.right(x)))

    torch.manual_seed(0)
    model = TwoBranches().eval()
    example = torch.randn(4, 8)
    path = str(tmp_path_factory.mktemp("pt2") / "two_branches.pt2")
    torch.export.save(torch.export.export(model, (example,)), path)
    return path, model, example


def test_pt2_program_loads_with_its_example_input_shapes_and_matches_torch(program_file):
    path, model, example = program_file
    built = load_torch_program(path)
    assert built.inputs == [("x", (4, 8), "float32")]
    assert built.origin.startswith("torch.export (torch ")
    (got,) = run_placed(built.mod, [w for _, w in built.params], [example.numpy()])
    np.testing.assert_allclose(got, model(example).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_diviml_graph_and_run_take_a_pt2_program(program_file, capsys):
    path, _, _ = program_file
    assert main(["graph", path]) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"^imported from torch\.export \(torch .+\) through relax\.frontend\.torch \(TVM .+\)$", out, re.MULTILINE
    ), out
    code = main(
        [
            "run",
            path,
            "--platform",
            "cpu2",
            "--cost",
            "roofline",
            "--repeats",
            "2",
            "--inputs",
            "2",
            "--time-limit",
            "5",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert re.search(r"^outputs against the single-device build: .*: equal$", out, re.MULTILINE), out


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        (b"not a zip", r"not a torch.export program \(a .pt2 file is a zip archive\)"),
        (b"PK\x05\x06" + b"\0" * 18, "not a readable torch.export program"),
    ],
)
def test_unreadable_pt2_files_get_one_line_and_exit_2(tmp_path, capsys, content, message):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")
    path = tmp_path / "model.pt2"
    if content is not None:
        path.write_bytes(content)
    assert main(["graph", str(path)]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1, err


def test_pt2_without_torch_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(DivimlInputError, match=r"reading .pt2 files needs torch \(pip install 'tvm-diviml\[torch\]'\)"):
        load_torch_program(str(tmp_path / "model.pt2"))


def test_a_hugging_face_pt2_program_loads_and_matches_torch(tmp_path):
    """Hugging Face models return a ModelOutput, which torch reads back only once its module registered
    it as a pytree node: the module the program names is imported (from transformers only)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")
    hf = pytest.importorskip("transformers", reason="transformers is not installed (pip install 'tvm-diviml[torch]')")
    config = hf.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=64
    )
    torch.manual_seed(0)
    model, ids = hf.BertModel(config).eval(), torch.randint(0, 64, (1, 8))
    path = str(tmp_path / "bert.pt2")
    torch.export.save(torch.export.export(model, (ids,)), path)
    built = load_torch_program(path)
    got = run_placed(built.mod, [w for _, w in built.params], [ids.numpy()])
    want = model(ids)
    np.testing.assert_allclose(got[0], want.last_hidden_state.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_a_pt2_program_naming_a_module_outside_the_allowed_packages_imports_nothing(tmp_path, monkeypatch):
    """A file's type names are data: only transformers' modules are ever imported to read it."""
    import importlib
    import json
    import zipfile

    spec = json.dumps([1, {"type": "os.path.Evil", "context": "null", "children_spec": []}])
    program = {"graph_module": {"module_call_graph": [{"fqn": "", "signature": {"in_spec": spec, "out_spec": spec}}]}}
    path = tmp_path / "named.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("named/models/model.json", json.dumps(program))
    imported = []
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: imported.append(name))
    register_pytree_types(str(path))
    assert imported == []


class _RunsCommand:
    """Unpickled, it runs a shell command: what a crafted .pt2 would hide in its payload."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        import os

        return os.system, (self.command,)


def _with_member(source: str, target, member_suffix: str, content: bytes) -> str:
    """A copy of the archive ``source`` at ``target`` whose member ending in ``member_suffix`` holds
    ``content``."""
    import zipfile

    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        for name in original.namelist():
            copy.writestr(name, content if name.endswith(member_suffix) else original.read(name))
    return str(target)


def test_a_pt2_whose_pickled_payload_runs_code_is_refused_without_running_it(program_file, tmp_path, capsys):
    """torch.export.load reads sample inputs (and pickled weights) with weights_only=False after a
    weights-only read fails: the payload would run. Every read is weights-only: one line, exit 2."""
    import io

    import torch

    path, _, _ = program_file
    marker = tmp_path / "ran"
    payload = io.BytesIO()
    torch.save(_RunsCommand(f"touch {marker}"), payload)
    evil = _with_member(path, tmp_path / "evil.pt2", "sample_inputs/model.pt", payload.getvalue())
    assert main(["graph", evil]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert "not a readable torch.export program" in err and err.count("\n") == 1, err


def test_a_pt2_holding_a_pickled_python_object_is_refused_before_torch_reads_it(program_file, tmp_path, capsys):
    import json
    import pickle

    path, _, _ = program_file
    marker = tmp_path / "ran"
    config = {"config": {"evil": {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True}}}
    evil = _with_member(path, tmp_path / "evil.pt2", "_constants_config.json", json.dumps(config).encode())
    import zipfile

    with zipfile.ZipFile(evil, "a") as archive:
        archive.writestr("two_branches/data/constants/opaque_obj_0", pickle.dumps(_RunsCommand(f"touch {marker}")))
    assert main(["graph", evil]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert "constant 'evil' is a pickled Python object" in err and err.count("\n") == 1, err


def test_onnx_external_data_outside_the_model_folder_is_refused_with_onnx_reason(tmp_path, capsys):
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install 'tvm-diviml[onnx]')")
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import set_external_data

    weight = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        [weight],
    )
    model = helper.make_model(graph)
    tensor = model.graph.initializer[0]
    set_external_data(tensor, location="../../../etc/hostname")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    path = tmp_path / "outside.onnx"
    onnx.save(model, str(path))
    assert main(["graph", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not a readable ONNX model (ValidationError" in err and "points outside" in err, err
    assert err.count("\n") == 1, err


def test_a_pt2_naming_a_transformers_module_this_version_lacks_is_one_line(tmp_path, capsys):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install 'tvm-diviml[torch]')")
    import json
    import zipfile

    spec = json.dumps([1, {"type": "transformers.models.no_such_model.modeling.Output", "children_spec": []}])
    program = {"graph_module": {"module_call_graph": [{"fqn": "", "signature": {"in_spec": spec, "out_spec": spec}}]}}
    path = tmp_path / "newer.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("newer/models/model.json", json.dumps(program))
    with pytest.raises(DivimlInputError, match="transformers .* lacks") as error:
        register_pytree_types(str(path))
    assert "transformers.models.no_such_model.modeling" in str(error.value)


def onnx_gemm(path, *, weights_as_inputs: bool):
    """``y = x @ W.T + B`` as ONNX; with ``weights_as_inputs`` W and B are also listed as graph inputs,
    the classic ONNX Model Zoo form (IR version 3: an initializer is an input's default value)."""
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install 'tvm-diviml[onnx]')")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((4, 8)).astype("float32"), rng.standard_normal(4).astype("float32")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])]
    if weights_as_inputs:
        inputs += [
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 8]),
            helper.make_tensor_value_info("B", TensorProto.FLOAT, [4]),
        ]
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1)],
        "gemm",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return w, b


def test_an_onnx_model_listing_its_weights_as_inputs_takes_them_as_weights(tmp_path):
    from tvm_diviml.frontends.importers import load_onnx

    path = tmp_path / "zoo_form.onnx"
    w, b = onnx_gemm(path, weights_as_inputs=True)
    built = load_onnx(str(path))
    assert [name for name, _, _ in built.inputs] == ["x"]
    x = np.random.default_rng(1).standard_normal((1, 8)).astype("float32")
    (got,) = run_placed(built.mod, [p for _, p in built.params], [x])
    np.testing.assert_allclose(got, x @ w.T + b, rtol=1e-5, atol=1e-6)


def test_an_onnx_input_of_size_zero_is_refused_naming_it(tmp_path, capsys):
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install 'tvm-diviml[onnx]')")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "empty",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [0, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [0, 8])],
    )
    path = tmp_path / "empty.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    for shape in ([], ["--shape", "v=1"]):  # TVM's importer names the dimension "v"; binding it crashed TVM
        assert main(["graph", str(path), *shape]) == 2
        err = capsys.readouterr().err
        assert "input 'x' has axis 0 of size 0" in err and err.count("\n") == 1, err


def test_a_shape_tvm_cannot_bind_is_one_line():
    """Two symbolic variables of one name: TVM's BindSymbolicVars fails inside (what an ONNX model of
    unnamed dimensions gives)."""
    import tvm

    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([tvm.tirx.Var("n", "int64"), 4], "float32"))
    y = relax.Var("y", relax.TensorType([tvm.tirx.Var("n", "int64"), 4], "float32"))
    with builder.function("main", [x, y], attrs={"num_input": 2}):
        with builder.dataflow():
            out = builder.emit_output(relax.op.add(relax.op.sum(x), relax.op.sum(y)))
        builder.emit_func_output(out)
    with pytest.raises(DivimlInputError, match="TVM cannot bind --shape n=2"):
        from_relax(builder.get(), shapes={"n": 2})
