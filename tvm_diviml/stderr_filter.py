"""TVM's C++ warnings that a user can do nothing about, kept off the ``diviml`` command's stderr.

TVM writes them from C++ straight to file descriptor 2 ("Fast mode segfaults when there are
out-of-bounds indices" for every gather it builds, "BlockBuilder destroyed with remaining blocks!"
when an importer's builder is dropped, "Scope Loaded:" a dozen times when its VM loads an exported
library), so Python's logging cannot filter them. The command points fd 2 at a pipe whose reader
forwards every other byte at once and drops whole lines that match; ``--debug`` leaves stderr alone.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

UNACTIONABLE = (
    b"Warning: Fast mode segfaults when there are out-of-bounds indices",
    b"BlockBuilder destroyed with remaining blocks!",
    b"Warning: Scope Loaded:",  # TVM 0.27's VM loading an exported library
)
_LOG_LINE_START = b"["  # TVM's C++ log lines start with "[hh:mm:ss] file:line:"
_JOIN_S = 2.0  # at the end: how long to wait for the reader to pass on what is left


def _forward(read_fd: int, write_fd: int) -> None:
    """Copy ``read_fd`` to ``write_fd`` until end of file, less the unactionable lines. A partial line
    that may be a TVM log line waits for its end; any other partial line (a progress bar's ``\\r``
    update) passes at once."""
    pending = b""
    while chunk := os.read(read_fd, 1 << 16):
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        kept = [line for line in lines if not any(pattern in line for pattern in UNACTIONABLE)]
        out = b"".join(line + b"\n" for line in kept)
        if pending and not pending.startswith(_LOG_LINE_START):
            out, pending = out + pending, b""
        if out:
            os.write(write_fd, out)
    if pending:
        os.write(write_fd, pending)


@contextlib.contextmanager
def unactionable_warnings_filtered(enabled: bool = True) -> Iterator[None]:
    """Within it, file descriptor 2 drops ``UNACTIONABLE`` lines; everything else reaches the original
    stderr in order. A no-op when not ``enabled`` or when stderr is not a real file descriptor."""
    try:
        stderr_fd = sys.stderr.fileno() if enabled else None
    except (AttributeError, OSError, ValueError):  # replaced by an object without a descriptor
        stderr_fd = None
    if stderr_fd != 2:
        yield
        return
    sys.stderr.flush()
    original = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    reader = threading.Thread(target=_forward, args=(read_fd, original), name="stderr-filter", daemon=True)
    reader.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # the pipe's last writer in this process closes: the reader sees its end
        reader.join(_JOIN_S)
        if not reader.is_alive():  # else a child that inherited the pipe holds it open: leave the reader be
            os.close(read_fd)
            os.close(original)
