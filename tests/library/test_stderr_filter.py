"""TVM's unactionable C++ warnings are dropped from the command's stderr; everything else arrives whole
and in order, progress bars' partial lines included; ``--debug`` (enabled=False) keeps them."""

import subprocess
import sys

import pytest

WRITER = """
import os, sys
from tvm_diviml.stderr_filter import unactionable_warnings_filtered
with unactionable_warnings_filtered(enabled={enabled}):
    os.write(2, b"first line\\n")
    os.write(2, b"[09:21:32] /project/include/tvm/topi/transform.h:1261: Warning: Fast mode segfaults when "
                b"there are out-of-bounds indices. Make sure input indices are in bound\\n")
    os.write(2, b"\\rtiming kernels:  50%")
    os.write(2, b"\\rtiming kernels: 100%\\n")
    os.write(2, b"[10:00:00] /project/src/relax/ir/block_builder.cc:65: Warning: BlockBuilder destroyed ")
    os.write(2, b"with remaining blocks!\\n")
    os.write(2, b"[00:54:08] /project/src/runtime/vm/executable.cc:340: Warning: Scope Loaded: \\n")
    print("from python", file=sys.stderr)
    os.write(2, b"[10:00:01] /project/src/other.cc:1: Warning: something a user should see\\n")
    os.write(2, b"no newline at the end")
"""


def stderr_of(enabled: bool) -> str:
    done = subprocess.run(
        [sys.executable, "-c", WRITER.format(enabled=enabled)], capture_output=True, timeout=60, check=True
    )
    return done.stderr.decode()  # not text=True: it would read the progress bar's \r as a line end


def test_unactionable_lines_dropped_and_the_rest_kept_in_order():
    assert stderr_of(True) == (
        "first line\n"
        "\rtiming kernels:  50%\rtiming kernels: 100%\n"
        "from python\n"
        "[10:00:01] /project/src/other.cc:1: Warning: something a user should see\n"
        "no newline at the end"
    )


def test_debug_keeps_everything():
    said = stderr_of(False)
    assert all(warning in said for warning in ("Fast mode segfaults", "BlockBuilder destroyed", "Scope Loaded"))
    assert said.startswith("first line\n")


@pytest.mark.parametrize("flag", [[], ["--debug"]])
def test_the_command_filters_unless_debug(flag, tmp_path):
    """The installed command wraps its whole run: a warning written to fd 2 inside it is gone (kept with --debug)."""
    script = (
        "import os, sys\n"
        "from tvm_diviml import cli\n"
        "cli.main = lambda: os.write(2, b'[0] x.cc:1: Warning: Fast mode segfaults when there are out-of-bounds "
        "indices\\nkept\\n') and 0\n"
        f"sys.argv = ['diviml', *{flag!r}]\n"
        "cli.entry()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stderr.endswith("kept\n")
    assert ("Fast mode" in done.stderr) == bool(flag)
