"""Every tutorial runs as a user would run it, with its defaults, and reports success: a tutorial that
no longer matches the API fails here rather than in a reader's hands."""

import glob
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUTORIALS = sorted(glob.glob(os.path.join(REPO, "tutorials", "*.py")))
TIMEOUT_S = 120


def test_there_are_tutorials():
    assert len(TUTORIALS) >= 2


def run_tutorial(path: str, *args: str) -> subprocess.CompletedProcess:
    """Run a tutorial as a user would (this venv's python, from the repository root); fail showing its output."""
    result = subprocess.run(
        [sys.executable, path, *args], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert result.returncode == 0, (
        f"{os.path.basename(path)} {' '.join(args)} exited {result.returncode}\n"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
    )
    return result


# Tutorial 05 starts RPC servers and measures kernels (about 40 s): `make test-all` runs it, and
# tests/test_rpc.py covers the same run across servers in the default suite.
SLOW_TUTORIALS = {"05_llm_multi_server.py"}


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if os.path.basename(p) in SLOW_TUTORIALS else p for p in TUTORIALS],
    ids=os.path.basename,
)
def test_tutorial_runs_and_succeeds(path):
    run_tutorial(path)


@pytest.mark.slow
def test_bring_your_own_model_imports_a_torch_export_program():
    """The torch path of tutorial 02 is off by default (torch.export alone takes longer than the rest of it)."""
    pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")
    result = run_tutorial(os.path.join(REPO, "tutorials", "02_bring_your_own_model.py"), "--frontends", "torch")
    assert "vs torch:" in result.stdout
    assert "saved and read back two_branch_conv.pt2: inputs [('x', (4, 3, 8, 8), 'float32')]" in result.stdout
