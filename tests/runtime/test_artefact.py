"""``diviml run --export DIR`` writes an artefact folder that ``tvm_diviml.load(DIR)`` runs in a fresh
process importing no compiler, frontend or solver; a one-device export runs on a bare TVM VM exactly as
docs/deploy.md shows; a replicated build exports and runs as its replicas; an incomplete or changed
folder, and a wrong input, are refused with one clear error."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tvm_diviml.cli import main
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.runtime.artefact import FORMAT_VERSION, LIBRARY, MANIFEST, WEIGHTS, TensorSpec, load, write_artefact
from tvm_diviml.tolerances import compare_outputs

ROOT = Path(__file__).resolve().parents[2]
MODEL = "twin_branch:depth=2,hidden=32,batch=2"
OPTIONS = {"depth": 2, "hidden": 32, "batch": 2}
FAST = ["--cost", "roofline", "--repeats", "2", "--inputs", "4", "--time-limit", "5", "--candidates", "0"]

# Run in a fresh process: load the export, run it on the saved inputs, compare with the saved outputs,
# and report what the load imported beyond TVM itself (a full TVM build imports tvm.relax, and its FFI
# imports torch where torch is installed: those are TVM's, not the load's).
FRESH_LOAD = """
import json, sys
import numpy as np
import tvm
imported_by_tvm = set(sys.modules)
import tvm_diviml
from tvm_diviml.tolerances import compare_outputs

folder, data = sys.argv[1], np.load(sys.argv[2])
model = tvm_diviml.load(folder)
inputs = [data[f"input{i}"] for i in range(len(model.inputs))]
got = model(*inputs)
got = got if isinstance(got, list) else [got]
want = [data[f"output{i}"] for i in range(len(got))]
print(json.dumps({
    "max_rel_diff": compare_outputs(got, want).max_rel_diff,
    "executor": model.manifest.executor["name"],
    "added": sorted(set(sys.modules) - imported_by_tvm),
    "loaded": sorted(sys.modules),
}))
"""
NEVER_IMPORTED = (
    "tvm_diviml.passes",
    "tvm_diviml.solvers",
    "tvm_diviml.app",
    "tvm_diviml.zoo",
    "tvm_diviml.cost",
    "tvm_diviml.cli",
    "onnx",
    "onnxruntime",
    "tvm.relax.frontend.onnx",
    "tvm.relax.frontend.torch",
)
NOT_ADDED = ("torch", "tvm.relax", "tvm.relax.frontend")


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def load_in_fresh_process(folder: Path, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> dict:
    data = folder.parent / "check.npz"
    np.savez(data, **{f"input{i}": x for i, x in enumerate(inputs)}, **{f"output{i}": y for i, y in enumerate(outputs)})
    done = subprocess.run(
        [sys.executable, "-c", FRESH_LOAD, str(folder), str(data)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert not [m for m in report["loaded"] if within(m, NEVER_IMPORTED)], report["loaded"]
    assert not [m for m in report["added"] if within(m, NOT_ADDED)], report["added"]
    return report


def twin_reference() -> tuple[list[np.ndarray], list[np.ndarray]]:
    from tvm_diviml.zoo import build_model
    from tvm_diviml.zoo.reference import run_reference

    model = build_model("twin_branch", OPTIONS)
    inputs = model.sample_inputs(seed=3)
    return inputs, run_reference(model, inputs)


def export(folder: Path, *argv: str) -> Path:
    assert main(["run", *argv, "--export", str(folder)]) == 0
    return folder


@pytest.fixture(scope="module")
def one_device_export(tmp_path_factory) -> Path:
    """The twin on cpu1: one device, run in one VM."""
    return export(tmp_path_factory.mktemp("cpu1") / "out", MODEL, "--platform", "cpu1", *FAST)


def test_an_export_runs_in_a_fresh_process_that_imports_no_compiler(tmp_path, capsys):
    folder = export(tmp_path / "out", MODEL, "--platform", "cpu2", *FAST)
    out = capsys.readouterr().out
    loading = re.escape(f"run it with tvm_diviml.load('{folder}')")
    assert re.search(rf"^exported to {re.escape(str(folder))}/ \(4 files: .*: {loading}", out, re.MULTILINE), out
    assert sorted(os.listdir(folder)) == sorted([LIBRARY, LIBRARY + ".placement.json", WEIGHTS, MANIFEST])
    manifest = json.loads((folder / MANIFEST).read_text())
    from tvm_diviml.zoo import build_model

    model = build_model("twin_branch", OPTIONS)
    assert [w["name"] for w in manifest["weights"]] == [name for name, _ in model.params]
    assert manifest["inputs"] == [{"name": "x", "shape": [2, 32], "dtype": "float32"}]
    assert manifest["outputs"] == [{"name": "output0", "shape": [2, 32], "dtype": "float32"}]
    assert manifest["format_version"] == FORMAT_VERSION and manifest["kind"] == "placed"
    assert set(manifest["files"]) == {LIBRARY, LIBRARY + ".placement.json", WEIGHTS}
    assert {d["tvm_device"] for d in manifest["devices"]} <= {"cpu:0", "cpu:1"}
    assert manifest["executor"]["objective"] == "latency" and manifest["executor"]["in_flight"] == 1

    inputs, outputs = twin_reference()
    report = load_in_fresh_process(folder, inputs, outputs)
    assert report["max_rel_diff"] <= 1e-4
    assert report["executor"] == manifest["executor"]["name"] in ("single VM", "concurrent")


def bare_vm_recipe() -> str:
    """The first Python block under docs/deploy.md's bare-VM heading, as written there."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text.split("## On a bare TVM VirtualMachine", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_a_one_device_export_runs_on_a_bare_vm_as_documented(one_device_export, tmp_path):
    recipe = bare_vm_recipe()
    assert '"out/' in recipe  # the documented folder: run it beside a copy named so
    placement = json.loads((one_device_export / (LIBRARY + ".placement.json")).read_text())
    assert any(kind == "packed" for kind, _, _ in placement["weight_params"]), "the recipe packs no weight"
    shutil.copytree(one_device_export, tmp_path / "out")
    check = "\nnp.savez('result.npz', *outputs, x=x)\nimport sys\n"
    check += "assert not [m for m in sys.modules if m.startswith('tvm_diviml')]  # TVM alone\n"
    done = subprocess.run(
        [sys.executable, "-c", recipe + check], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    from tvm_diviml.zoo import build_model
    from tvm_diviml.zoo.reference import run_reference

    result = np.load(tmp_path / "result.npz")
    want = run_reference(build_model("twin_branch", OPTIONS), [result["x"]])
    assert compare_outputs([result["arr_0"]], want).max_rel_diff <= 1e-4


def test_named_and_positional_inputs_run_and_wrong_ones_are_refused_by_name(one_device_export):
    inputs, outputs = twin_reference()
    with load(str(one_device_export)) as model:
        assert model.manifest.executor["name"] == "single VM"
        assert compare_outputs([model(x=inputs[0])], outputs).max_rel_diff <= 1e-4
        streamed = list(model.stream([inputs[0], inputs]))
        assert len(streamed) == 2 and compare_outputs([streamed[1]], outputs).max_rel_diff <= 1e-4
        refusals = [
            (
                lambda: model(np.zeros((3, 32), np.float32)),
                "field 'x': got (3, 32) float32, the model takes (2, 32) float32",
            ),
            (lambda: model(inputs[0].astype(np.float64)), "got (2, 32) float64, the model takes (2, 32) float32"),
            (lambda: model(y=inputs[0]), "field 'y': the model has no input of that name"),
            (lambda: model(), "field 'x': missing"),
            (lambda: model(inputs[0], inputs[0]), "the model takes 1 inputs, 2 were given"),
        ]
        for call, message in refusals:
            with pytest.raises(DivimlInputError, match=re.escape(message)):
                call()


def corrupt(folder: Path, how: str) -> str:
    """Spoil a copy of an export as ``how`` says; the words its refusal must say."""
    if how == "missing weights":
        (folder / WEIGHTS).unlink()
        return f"the export is incomplete: {WEIGHTS} is missing"
    if how == "changed library":
        data = bytearray((folder / LIBRARY).read_bytes())
        data[len(data) // 2] ^= 1
        (folder / LIBRARY).write_bytes(bytes(data))
        return f"{LIBRARY} differs from the file exported"
    manifest = json.loads((folder / MANIFEST).read_text())
    if how == "no manifest":
        (folder / MANIFEST).unlink()
        return f"no {MANIFEST}: not an export"
    if how == "newer format":
        manifest["format_version"] = FORMAT_VERSION + 1
    elif how == "file outside":
        manifest["files"]["../elsewhere.so"] = "0" * 64
    (folder / MANIFEST).write_text(json.dumps(manifest))
    expected = {"newer format": f"this one reads format {FORMAT_VERSION}", "file outside": "names a file outside"}
    return expected[how]


@pytest.mark.parametrize("how", ["missing weights", "changed library", "no manifest", "newer format", "file outside"])
def test_an_incomplete_or_changed_export_is_refused(one_device_export, tmp_path, how):
    folder = tmp_path / "copy"
    shutil.copytree(one_device_export, folder)
    message = corrupt(folder, how)
    with pytest.raises(DivimlInputError, match=re.escape(message)) as refused:
        load(str(folder))
    assert str(folder) in str(refused.value)


def test_an_export_replaces_an_earlier_one_whole_and_a_failed_one_leaves_it(tmp_path):
    folder = tmp_path / "out"

    def write(value: float, build=lambda staging: (Path(staging) / LIBRARY).write_bytes(b"library")) -> None:
        spec = TensorSpec("x", (1,), "float32")
        write_artefact(
            str(folder), build, kind="placed", weights=[("w", np.full(2, value, np.float32))],
            inputs=[spec], outputs=[spec], executor={"name": "single VM"}, devices={"cpu": "cpu:0"},
        )  # fmt: skip

    write(1.0)
    write(2.0)
    assert np.load(folder / WEIGHTS)["w"][0] == 2.0

    def failing(staging: str) -> None:
        raise RuntimeError("the build failed half way")

    with pytest.raises(RuntimeError):
        write(3.0, failing)
    assert np.load(folder / WEIGHTS)["w"][0] == 2.0 and sorted(os.listdir(tmp_path)) == ["out"]


def test_an_export_over_a_folder_of_other_files_is_refused_before_the_run(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("kept")
    assert main(["run", MODEL, "--platform", "cpu2", *FAST, "--export", str(tmp_path)]) == 2
    assert "the folder holds other files" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["mine.txt"]


def test_a_replicated_build_exports_and_runs_as_its_replicas(tmp_path):
    from tvm_diviml.app.export import export_run
    from tvm_diviml.app.load import load_model
    from tvm_diviml.plan import Plan
    from tvm_diviml.presets import get_platform
    from tvm_diviml.profiling.timing import build_runnable
    from tvm_diviml.runtime.routed import RoutedBuild

    loaded = load_model("twin_branch", OPTIONS)
    platform = get_platform("cpu2")
    builds = [
        build_runnable(
            loaded.built, loaded.extraction, platform, Plan(dict.fromkeys(loaded.extraction.graph.kernels, d))
        )[0]
        for d in ("cpu0", "cpu1")
    ]
    routed = RoutedBuild(builds, [0.5, 0.5], ["cpu0", "cpu1"])
    measured = SimpleNamespace(objective="throughput", in_flight=4)
    line = export_run(str(tmp_path / "out"), routed, loaded.built, measured)
    assert "replicas build" in line
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["kind"] == "replicas" and manifest["executor"]["stream"] and manifest["executor"]["in_flight"] == 4
    assert {"model.part0.so", "model.part1.so", "model.so.builds.json"} <= set(manifest["files"])
    inputs, outputs = twin_reference()
    with load(str(tmp_path / "out")) as model:
        for got in model.stream([inputs] * 4):
            assert compare_outputs([got], outputs).max_rel_diff <= 1e-4
        assert sum(model._runner.sent.values()) == 4 and set(model._runner.sent) == {"cpu0", "cpu1"}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's TorchScript ONNX exporter
def test_a_torchvision_model_from_onnx_runs_as_onnxruntime_does(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")
    torchvision = pytest.importorskip(
        "torchvision", reason="torchvision is not installed (pip install 'tvm-diviml[torch]')"
    )
    pytest.importorskip("onnx", reason="onnx is not installed (pip install 'tvm-diviml[onnx]')")
    ort = pytest.importorskip(
        "onnxruntime", reason="onnxruntime is not installed (pip install 'tvm-diviml[onnxruntime]')"
    )
    torch.manual_seed(0)
    network = torchvision.models.squeezenet1_1(weights=None, num_classes=10).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    path = tmp_path / "squeezenet.onnx"
    torch.onnx.export(network, (torch.from_numpy(x),), str(path), input_names=["image"], dynamo=False)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = session.run(None, {"image": x})
    folder = export(tmp_path / "out", str(path), "--platform", "cpu2", *FAST)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["inputs"] == [{"name": "image", "shape": [1, 3, 64, 64], "dtype": "float32"}]
    assert [o["shape"] for o in manifest["outputs"]] == [[1, 10]]
    report = load_in_fresh_process(folder, [x], want)
    assert report["max_rel_diff"] <= 1e-4
