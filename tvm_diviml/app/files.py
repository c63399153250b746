"""The files a command reads and writes, checked before any work.

A user's input must never be destroyed by an output of the same command (``diviml graph m.onnx --json
m.onnx``), and an output whose path cannot be written must fail before minutes of work, not after
(the outputs themselves are written whole or not at all: ``tvm_diviml.writes``).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from ..errors import DivimlInputError


@dataclass(frozen=True)
class Read:
    """A file or folder the command reads, as the user named it (``MODEL``, ``--platform``, ...)."""

    path: str
    what: str
    folder: bool = False  # a folder read whole (a tuning database): nothing may be written inside it


@dataclass(frozen=True)
class Written:
    """A file the command writes, with the option that names it (``--json``, ``--export``'s placement)."""

    path: str
    what: str
    folder: bool = False  # a folder the command creates or fills (a per-server export)


def check_files(reads: list[Read], writes: list[Written]) -> None:
    """Refuse, in one line, an output that would replace or land inside what the command reads (the same
    file after resolving links, hard links included), two outputs on one path, and an output that cannot
    be written there (its folder missing or read-only, a folder in its place, a name too long)."""
    taken: dict[str, str] = {}
    created = {os.path.realpath(out.path) for out in writes if out.folder}  # folders the command fills
    for out in writes:
        real = os.path.realpath(out.path)
        same = taken.setdefault(real, out.what)
        if same != out.what:
            raise DivimlInputError(
                f"{same} and {out.what} name the same file, and the second would overwrite the first",
                source=out.path,
                hint="give each output a path of its own",
            )
        for read in reads:
            if _same_file(out.path, read.path) or (read.folder and _inside(real, os.path.realpath(read.path))):
                where = "inside" if read.folder and not _same_file(out.path, read.path) else "over"
                raise DivimlInputError(
                    f"{out.what} would write {where} {read.what} ({read.path}), which this command reads",
                    source=out.path,
                    hint="write the output to another path",
                )
        check_writable(out, created)


def check_writable(out: Written, created: set[str] = frozenset()) -> None:
    """``out`` can be created or replaced by this process (checked, not tried: nothing is written); a
    file's folder must exist unless the command makes it (``created``: a per-server export's)."""
    path = out.path
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(os.path.abspath(path))
    existing = _folder_that_exists(folder)
    if existing != folder and not out.folder and os.path.realpath(folder) not in created:
        raise DivimlInputError(
            f"cannot write {out.what}: folder {folder} does not exist",
            source=path,
            hint="create the folder first, or write elsewhere",
        )
    longest = _limit(existing, "PC_NAME_MAX", 255)
    if len(os.fsencode(name)) > longest or len(os.fsencode(os.path.abspath(path))) >= _limit(
        existing, "PC_PATH_MAX", 4096
    ):
        raise DivimlInputError(
            f"cannot write {out.what}: the name is too long for this file system (at most {longest} bytes a name)",
            source=path[:80] + ("..." if len(path) > 80 else ""),
            hint="give a shorter path",
        )
    if out.folder:
        if os.path.exists(path) and not os.path.isdir(path):
            raise DivimlInputError(
                f"cannot write {out.what}: it is a file, and a folder is written there",
                source=path,
                hint="name a folder, new or existing",
            )
        needed = [path if os.path.isdir(path) else existing]
    elif os.path.isdir(path):
        raise DivimlInputError(
            f"cannot write {out.what}: a folder of that name is in the way", source=path, hint="give a file path"
        )
    elif os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):
        needed = [path]  # /dev/null, a pipe: written in place
    else:  # written beside, then renamed over: the folder must take new files, an existing file be writable
        needed = [existing] + ([path] if os.path.exists(path) else [])
    if not all(os.access(target, os.W_OK) for target in needed):
        raise DivimlInputError(
            f"cannot write {out.what} there (not writable)", source=path, hint="check the permissions"
        )


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


def _folder_that_exists(folder: str) -> str:
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    return folder


def _limit(folder: str, name: str, default: int) -> int:
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return default
