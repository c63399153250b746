"""Every tutorial runs as a user would run it, with its defaults, and reports success: a tutorial that
no longer matches the API fails here rather than in a reader's hands."""

import glob
import os
import subprocess
import sys

import pytest

from ..helpers import REPO_ROOT

REPO = REPO_ROOT
TUTORIALS = sorted(glob.glob(os.path.join(REPO, "tutorials", "*.py")))
TIMEOUT_S = 120


def test_there_are_tutorials():
    assert len(TUTORIALS) >= 2


# What `make demo` installs lacks the extras; a tutorial run without them sees these modules missing.
EXTRA_MODULES = ("onnx", "onnxruntime", "onnxscript", "torch", "torchvision", "transformers", "xgboost")
WITHOUT_EXTRAS = (
    "import runpy, sys\n"
    f"sys.modules.update(dict.fromkeys({EXTRA_MODULES!r}))  # None: import fails, find_spec answers None\n"
    "path = sys.argv[1]\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(path, run_name='__main__')\n"
)
# Tutorials that ran to success without the extras: running them again with the extras proves nothing more.
RAN_WITHOUT_EXTRAS: set[str] = set()


def tutorial_process(path: str, *args: str, without_extras: bool = False) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", WITHOUT_EXTRAS] if without_extras else [sys.executable]
    return subprocess.run(
        [*command, path, *args], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )


def failure(path: str, args: tuple[str, ...], result: subprocess.CompletedProcess) -> str:
    return (
        f"{os.path.basename(path)} {' '.join(args)} exited {result.returncode}\n"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
    )


def run_tutorial(path: str, *args: str) -> subprocess.CompletedProcess:
    """Run a tutorial as a user would (this venv's python, from the repository root); fail showing its output."""
    result = tutorial_process(path, *args)
    assert result.returncode == 0, failure(path, args, result)
    return result


# Tutorial 05 starts RPC servers and measures kernels (about 40 s): `make test-all` runs it, and
# tests/runtime/test_rpc.py covers the same run across servers in the default suite.
SLOW_TUTORIALS = {"05_llm_multi_server.py"}


every_tutorial = pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if os.path.basename(p) in SLOW_TUTORIALS else p for p in TUTORIALS],
    ids=os.path.basename,
)


@every_tutorial
def test_tutorial_runs_after_make_demo_or_names_its_extra(path):
    """Right after `make demo` (no extras installed) a tutorial succeeds, or stops in one line that names
    the extra to install; never a traceback."""
    result = tutorial_process(path, without_extras=True)
    if result.returncode == 0:
        RAN_WITHOUT_EXTRAS.add(path)
        return
    said = (result.stdout + result.stderr).strip().splitlines()
    assert len(said) == 1 and "pip install" in said[0] and "extra" in said[0], failure(path, (), result)
    assert any(f"[{extra}]" in said[0] for extra in ("onnx", "torch", "onnxruntime", "tune")), said[0]


@every_tutorial
def test_tutorial_runs_and_succeeds(path):
    if path in RAN_WITHOUT_EXTRAS:
        pytest.skip("it ran to success without the extras (test_tutorial_runs_after_make_demo_or_names_its_extra)")
    run_tutorial(path)


@pytest.mark.slow
def test_bring_your_own_model_imports_a_torch_export_program():
    """The torch path of tutorial 02 is off by default (torch.export alone takes longer than the rest of it)."""
    pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")
    result = run_tutorial(os.path.join(REPO, "tutorials", "02_bring_your_own_model.py"), "--frontends", "torch")
    assert "vs torch:" in result.stdout
    assert "saved and read back two_branch_conv.pt2: inputs [('x', (4, 3, 8, 8), 'float32')]" in result.stdout
