"""Packaging: the passes/ folder is installed as tvm_diviml.passes, the TVM FFI pin holds, and the
installed TVM can serialise IR (apache-tvm-ffi 0.1.15.post2 segfaults there)."""

import subprocess
import sys
import zipfile
from importlib import metadata


def test_tvm_ffi_is_pinned_to_the_working_release():
    assert metadata.version("apache-tvm-ffi") == "0.1.14.post0"
    assert metadata.version("apache-tvm").startswith("0.27")


def test_ir_json_roundtrip_in_a_fresh_process():
    # In a subprocess: a broken FFI release kills the process instead of raising.
    code = "from tvm_diviml.passes import ir_json_roundtrip_ok; print(ir_json_roundtrip_ok())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    assert result.stdout.strip() == "True"


def test_core_library_imports_no_tvm():
    code = (
        "import sys, tvm_diviml, tvm_diviml.cli, tvm_diviml.bounds, tvm_diviml.solvers, tvm_diviml.report; "
        "[tvm_diviml.solvers.SOLVERS[name] for name in tvm_diviml.solvers.SOLVERS]; "  # the lazy registry, loaded
        "print('tvm' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


def test_regular_wheel_contains_the_passes_package(tmp_path):
    root = __file__.rsplit("/tests/", 1)[0]
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", root, "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    wheel = next(tmp_path.glob("tvm_diviml-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "tvm_diviml/passes/__init__.py" in names and "tvm_diviml/simulator.py" in names
    assert not any(n.startswith("passes/") or n.startswith("tests/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "diviml = tvm_diviml.cli:entry" in zipfile.ZipFile(wheel).read(entry_points).decode()
