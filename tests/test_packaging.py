"""Packaging: a regular (non-editable) wheel ships every package of ``tvm_diviml/`` and works installed
alone in a fresh virtual environment; the TVM FFI pin holds, and the installed TVM can serialise IR
(apache-tvm-ffi 0.1.15.post2 segfaults there)."""

import json
import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a checkout holds that a clean clone does not: left out of the copy the wheel is built from.
NOT_IN_A_CLEAN_CHECKOUT = (
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    ".git",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
)


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
        "import sys, tvm_diviml, tvm_diviml.cli, tvm_diviml.bounds, tvm_diviml.solvers, tvm_diviml.app.report; "
        "[tvm_diviml.solvers.SOLVERS[name] for name in tvm_diviml.solvers.SOLVERS]; "  # the lazy registry, loaded
        "print('tvm' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A regular wheel built from a copy of the checkout as a clean clone has it (no build/ left over)."""
    source = tmp_path_factory.mktemp("checkout") / "tvm-diviml"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_IN_A_CLEAN_CHECKOUT))
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return next(out.glob("tvm_diviml-*.whl"))


def test_the_wheel_ships_every_module_of_every_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    folders = sorted({p.parent for p in (ROOT / "tvm_diviml").rglob("*.py") if "__pycache__" not in p.parts})
    assert len(folders) >= 10 and ROOT / "tvm_diviml" / "toolkit" in folders  # the walk found the package
    for folder in folders:
        assert (folder / "__init__.py").is_file(), f"{folder.relative_to(ROOT)} has no __init__.py: a wheel drops it"
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tvm_diviml").rglob("*.py")}
    missing = sorted(sources - names)
    assert not missing, f"the wheel lacks {missing}"
    assert not any(n.startswith(("passes/", "tests/", "benchmarks/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "diviml = tvm_diviml.entry:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed, not editable. Its dependencies come from the
    test environment's site-packages (a path in a .pth file: no network), whose own .pth files, the
    editable install of this checkout among them, are not read."""
    env = tmp_path_factory.mktemp("fresh") / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "test_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return env


def run_installed(*command: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """``command`` outside the checkout, with no PYTHONPATH that could reach it."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=clean)


def test_the_installed_wheel_imports_itself_and_not_the_checkout(installed, tmp_path):
    code = (
        "import tvm_diviml, tvm_diviml.toolkit.cpsat_worker as w, tvm_diviml.passes as p; "
        "print(tvm_diviml.__file__, w.__file__, p.__file__)"
    )
    result = run_installed(str(installed / "bin" / "python"), "-c", code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    for path in result.stdout.split():
        assert Path(path).resolve().is_relative_to(installed.resolve()), path


def test_the_installed_wheel_plans_with_cpsat_and_runs_a_split_plan_on_cpu2(installed, tmp_path):
    diviml = str(installed / "bin" / "diviml")
    plan = ["plan", "random:kernels=8,seed=1", "--solver", "cpsat", "--time-limit", "20", "--json", "cpsat.json"]
    planned = run_installed(diviml, *plan, cwd=tmp_path)
    assert planned.returncode == 0, planned.stdout[-2000:] + planned.stderr[-2000:]
    row = json.loads((tmp_path / "cpsat.json").read_text())
    assert row["solver"] == "cpsat" and row["feasible"] and row["value_s"] >= row["lower_bound_s"] > 0
    run = ["run", "twin_branch", "--platform", "cpu2", "--solver", "split", "--json", "run.json"]
    ran = run_installed(diviml, *run, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["solver"] == "split" and set(report["assignment"].values()) <= {"cpu0", "cpu1"}
    assert report["run"]["max_rel_diff"] <= 1e-4 and report["run"]["measured_s"] > 0
