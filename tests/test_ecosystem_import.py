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
from tvm_diviml.passes import apply_plan, build, extract
from tvm_diviml.passes.frontends import from_relax, load_torch_program
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


def test_a_kernel_tvm_cannot_compile_is_named_in_one_line():
    """Without the front end's rewrite, TVM's LLVM code generation rejects the boolean scan."""
    with pytest.raises(DivimlInputError) as caught:
        run_placed(bool_cumsum_module(), [], [np.zeros((2, 8), "float32")], kind="cpu1")
    message = str(caught.value)
    assert "\n" not in message
    assert re.search(r"cannot compile kernel 'cumsum' \(reads bool\[2, 8\]; writes bool\[2, 8\]\) for llvm", message)


def test_profiling_a_kernel_tvm_cannot_compile_names_it_too():
    from tvm_diviml.cost.measured import MeasureOptions, time_primfuncs

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
