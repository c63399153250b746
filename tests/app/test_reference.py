"""``diviml run --input FILE --reference torch|onnxruntime``: the build's outputs held to the user's own
framework on the user's own data (an importer's mistake passes the single-device check unseen), with
the differences per output, PASS or FAIL at --rtol and exit status 1 on a FAIL; every input or framework
that cannot be used is refused in one line, naming the input, what the model expects and the file."""

from __future__ import annotations

import importlib.util
import json
import re

import numpy as np
import pytest

from tvm_diviml.app import reference
from tvm_diviml.app.inputs import InputFile
from tvm_diviml.cli import main
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.zoo import BuiltModel

FAST = ["--platform", "cpu2", "--cost", "roofline", "--objective", "latency", "--repeats", "2", "--time-limit", "5"]
FAST += ["--candidates", "0"]
TORCH_EXTRA = "torch is not installed (pip install 'tvm-diviml[torch]')"


def seeded_cnn():
    """A small CNN whose weights are drawn from a fixed seed, with an input of batch 2 at 16x16."""
    torch = pytest.importorskip("torch", reason=TORCH_EXTRA)
    torch.manual_seed(0)

    class SmallCNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.classify = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(8, 10)

        def forward(self, x):
            return self.classify(torch.relu(self.conv(x)).mean(dim=(2, 3)))

    return SmallCNN().eval(), torch.randn(2, 3, 16, 16)


@pytest.fixture(scope="module")
def cnn_program(tmp_path_factory):
    """(the .pt2 program, an .npz of its input by name)."""
    torch = pytest.importorskip("torch", reason=TORCH_EXTRA)
    folder = tmp_path_factory.mktemp("cnn")
    model, example = seeded_cnn()
    program = str(folder / "cnn.pt2")
    torch.export.save(torch.export.export(model, (example,)), program)
    np.savez(folder / "x.npz", x=np.random.default_rng(1).standard_normal((2, 3, 16, 16), "float32"))
    return program, str(folder / "x.npz")


@pytest.fixture(scope="module")
def two_in_two_out(tmp_path_factory):
    """(a .pt2 program of two inputs returning a tuple that holds a dict, an .npz of its inputs)."""
    torch = pytest.importorskip("torch", reason=TORCH_EXTRA)
    torch.manual_seed(0)

    class TwoInTwoOut(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.left, self.right = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)

        def forward(self, x, y):
            return self.left(x), {"z": self.right(y)}

    folder = tmp_path_factory.mktemp("two")
    program = str(folder / "two.pt2")
    torch.export.save(torch.export.export(TwoInTwoOut().eval(), (torch.randn(2, 8), torch.randn(2, 8))), program)
    rng = np.random.default_rng(2)
    np.savez(folder / "xy.npz", x=rng.standard_normal((2, 8), "float32"), y=rng.standard_normal((2, 8), "float32"))
    return program, str(folder / "xy.npz")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["run", *argv, *FAST])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_pt2_run_on_given_inputs_reports_its_difference_from_torch_and_passes(cnn_program, tmp_path, capsys):
    program, inputs = cnn_program
    row_path = tmp_path / "row.json"
    code, out, err = run(capsys, program, "--reference", "torch", "--input", inputs, "--json", str(row_path))
    assert code == 0, out + err
    headline = re.search(rf"^outputs against torch \(cnn\.pt2 on {re.escape(inputs)}\): PASS$", out, re.M)
    assert headline, out
    assert re.search(
        r"^  output: float32 \(2, 10\), max abs diff \S+, max rel diff \S+, rtol 0\.0001: pass$", out, re.M
    ), out
    # the framework's check comes first, then the build against TVM's single-device build
    assert headline.start() < out.index("outputs against the single-device build")
    checked = json.loads(row_path.read_text())["reference"]
    assert checked["framework"] == "torch" and checked["inputs"] == inputs and checked["verdict"] == "pass"
    (output,) = checked["outputs"]
    assert output["name"] == "output" and output["shape"] == [2, 10] and output["dtype"] == "float32"
    assert 0 <= output["max_rel_diff"] <= output["rtol"] == 1e-4 and output["verdict"] == "pass"


def test_an_onnx_run_on_a_npy_input_passes_against_onnxruntime(tmp_path, capsys):
    torch = pytest.importorskip("torch", reason=TORCH_EXTRA)
    pytest.importorskip("onnx", reason="onnx is not installed (pip install 'tvm-diviml[onnx]')")
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'tvm-diviml[onnxruntime]')")
    model, example = seeded_cnn()
    path = str(tmp_path / "cnn.onnx")
    torch.onnx.export(model, (example,), path, dynamo=False, input_names=["input.1"], output_names=["scores"])
    np.save(tmp_path / "x.npy", np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype("float32"))
    code, out, err = run(capsys, path, "--reference", "onnxruntime", "--input", str(tmp_path / "x.npy"))
    assert code == 0, out + err
    assert re.search(r"^outputs against onnxruntime \(cnn\.onnx on .*x\.npy\): PASS$", out, re.M), out
    assert re.search(r"^  scores: float32 \(2, 10\), max abs diff .*: pass$", out, re.M), out


def test_outputs_that_stray_from_the_framework_fail_naming_the_output_and_exit_1(
    two_in_two_out, tmp_path, capsys, monkeypatch
):
    """A framework whose dict output is 1% off: that output FAILs, the other passes, the run exits 1 (while the
    build still equals TVM's single-device build); the names follow torch's flattened outputs."""
    program, inputs = two_in_two_out
    real = reference._RUNNERS["torch"]

    def one_percent_off(model_file, arrays):
        names, outputs = real(model_file, arrays)
        return names, [outputs[0], outputs[1] * 1.01]

    monkeypatch.setitem(reference._RUNNERS, "torch", one_percent_off)
    row_path = tmp_path / "row.json"
    code, out, err = run(capsys, program, "--reference", "torch", "--input", inputs, "--json", str(row_path))
    assert code == 1, out + err
    assert re.search(
        r"^outputs against torch \(two\.pt2 on .*xy\.npz\): FAIL \(1 of 2 outputs beyond rtol\)$", out, re.M
    )
    assert re.search(r"^  output\[0\]: float32 \(2, 4\), .*: pass$", out, re.M), out
    assert re.search(r"^  output\[1\]\['z'\]: float32 \(2, 4\), .*max rel diff 0\.0\d+, rtol 0\.0001: FAIL$", out, re.M)
    assert re.search(r"^outputs against the single-device build: .*: equal$", out, re.M), out
    checked = json.loads(row_path.read_text())["reference"]
    assert checked["verdict"] == "fail" and [o["verdict"] for o in checked["outputs"]] == ["pass", "fail"]
    code, out, err = run(capsys, program, "--reference", "torch", "--input", inputs, "--rtol", "0.02")
    assert code == 0 and ": PASS" in out, out + err


def test_the_given_inputs_are_what_the_run_itself_runs_on(two_in_two_out, tmp_path, capsys):
    """A NaN in the second row of x makes that row of the first output NaN (4 places), in the build and in
    the single-device build alike: the timed run and its own check read the file, not random inputs."""
    program, inputs = two_in_two_out
    with np.load(inputs) as given:
        x, y = given["x"].copy(), given["y"]
    x[1, 0] = np.nan
    np.savez(tmp_path / "nan.npz", x=x, y=y)
    code, out, err = run(capsys, program, "--input", str(tmp_path / "nan.npz"))
    assert code == 0, out + err
    assert re.search(
        r"^outputs against the single-device build: .*: equal \(NaN or infinity at the same 4 places", out, re.M
    )


def test_frameworks_outputs_that_cannot_be_paired_fail():
    run_ = reference.FrameworkRun("torch", "m.pt2", ["output[0]", "output[1]"], [np.zeros((2, 4))] * 2)
    fewer = reference.check_against(run_, [np.zeros((2, 4), "float32")], None)
    assert not fewer.passed(None) and fewer.to_json(None)["verdict"] == "fail"
    assert (
        fewer.describe(None)
        == "outputs against torch (m.pt2 on random inputs (seed 0)): FAIL (torch returns 2 outputs, the build 1)"
    )
    reshaped = reference.check_against(run_, [np.zeros((2, 4)), np.zeros((4, 2))], "x.npz")
    assert not reshaped.passed(1.0)
    assert reshaped.mismatch == "output[1] has shape (4, 2) from the build, (2, 4) from torch"


# ---------------------------------------------------------------------- refused, in one line, exit status 2
def refused(capsys, argv: list[str], *fragments: str) -> str:
    assert main(["run", *argv, *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("diviml: error: "), err
    for fragment in fragments:
        assert fragment in err, err
    return err


@pytest.mark.parametrize(
    "model, framework, fragments",
    [
        ("twin_branch:depth=2,hidden=32", "torch", ["has no framework of its own", "give a .pt2 or .onnx file"]),
        ("random:kernels=5", "onnxruntime", ["has no framework of its own"]),
        ("graph.json", "torch", ["a graph .json holds kernels and no program to run"]),
        ("model.onnx", "torch", ["torch runs a .pt2 file; MODEL is an .onnx file", "use --reference onnxruntime"]),
        ("model.pt2", "onnxruntime", ["use --reference torch"]),
        ("models/m.tflite", "torch", ["MODEL is neither a .pt2 nor an .onnx file"]),
    ],
)
def test_reference_is_refused_for_a_model_without_that_framework(capsys, model, framework, fragments):
    refused(capsys, [model, "--reference", framework], "field '--reference'", *fragments)


def test_reference_is_refused_across_rpc_servers(capsys):
    refused(capsys, ["model.pt2", "--reference", "torch", "--rpc", "local"], "not one across RPC servers")


def test_a_framework_not_installed_names_the_extra_to_install(capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    refused(
        capsys,
        ["model.onnx", "--reference", "onnxruntime"],
        "onnxruntime is not installed",
        "pip install 'tvm-diviml[onnxruntime]'",
    )


def test_a_missing_or_foreign_input_file_is_refused_before_the_model_loads(tmp_path, capsys):
    # MODEL does not exist either: the input file is refused first
    refused(capsys, ["absent.pt2", "--input", str(tmp_path / "x.npz")], "x.npz: field '--input': no such file")
    (tmp_path / "x.csv").write_text("1,2\n")
    refused(capsys, ["absent.pt2", "--input", str(tmp_path / "x.csv")], "is neither a .npy nor an .npz file")
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    refused(capsys, ["absent.pt2", "--input", str(tmp_path / "broken.npz")], "not a readable .npz file")


@pytest.mark.parametrize(
    "arrays, fragments",
    [
        ({"x": np.zeros((2, 8), "float32")}, ["no array for input 'y' (float32 (2, 8))"]),
        (
            {"x": np.zeros((2, 8), "float32"), "y": np.zeros((2, 8), "float32"), "w": np.zeros(1)},
            ["array 'w' is no input of the model", "'x' (float32 (2, 8)), 'y' (float32 (2, 8))"],
        ),
        (
            {"x": np.zeros((2, 8), "float32"), "y": np.zeros((3, 8), "float32")},
            ["input 'y' has shape (3, 8), the model expects (2, 8) (float32)"],
        ),
        (
            {"x": np.zeros((2, 8), "float64"), "y": np.zeros((2, 8), "float32")},
            ["input 'x' is float64, the model expects float32 (2, 8)", "array.astype('float32')"],
        ),
        (np.zeros((2, 8), "float32"), ["a .npy file holds one array, and the model has 2 inputs ('x'", "numpy.savez"]),
    ],
    ids=["missing name", "extra name", "wrong shape", "wrong dtype", "npy for two inputs"],
)
def test_an_input_that_does_not_fit_the_model_is_refused_naming_it(two_in_two_out, tmp_path, capsys, arrays, fragments):
    program, _ = two_in_two_out
    if isinstance(arrays, dict):
        path = tmp_path / "given.npz"
        np.savez(path, **arrays)
    else:
        path = tmp_path / "given.npy"
        np.save(path, arrays)
    refused(capsys, [program, "--input", str(path)], f"{path}: field '--input': ", *fragments)


def model_of(inputs, input_ranges=None) -> BuiltModel:
    return BuiltModel("m", None, "main", inputs, input_ranges=input_ranges or {})


def test_an_npz_may_name_an_input_as_its_framework_does():
    """TVM's ONNX importer renames ``input.1`` to ``input_1``: the file may use either name."""
    model = model_of([("input_1", (2, 3), "float32")])
    x = np.ones((2, 3), "float32")
    for name in ("input.1", "input_1"):
        fed = InputFile("x.npz", {name: x}).fed_to(model, ["input.1"])
        assert fed.sample_inputs() == [x] and fed.sample_inputs(seed=5)[0] is x
        assert len(fed.sample_stream(4, distinct=2)) == 4 and fed.sample_stream(4, distinct=2)[3][0] is x


def test_indices_outside_the_table_they_index_are_refused():
    model = model_of([("ids", (1, 4), "int64")], input_ranges={"ids": (0, 100)})
    with pytest.raises(
        DivimlInputError, match=r"input 'ids' holds 100, outside the \[0, 100\) of the table it indexes"
    ):
        InputFile("ids.npy", {None: np.array([[1, 2, 3, 100]])}).fed_to(model)
    fed = InputFile("ids.npy", {None: np.array([[1, 2, 3, 99]])}).fed_to(model)
    assert fed.sample_inputs()[0].tolist() == [[1, 2, 3, 99]]
