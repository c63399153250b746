"""Files (and folders) written whole or not at all: an interrupted or failed write leaves the old file
(or none), never half of a new one, and no temporary file behind."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator

from .errors import DivimlInputError


@contextlib.contextmanager
def written_whole(path: str, what: str = "the output") -> Iterator[str]:
    """Yield a temporary path beside ``path``; once the block ends without error it replaces ``path`` at
    once (a rename). An interrupted or failed write leaves ``path`` as it was and no temporary file.
    A path that is not a regular file (``/dev/null``, a pipe) is written directly, never replaced."""
    existing = os.stat(path) if os.path.exists(path) else None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        yield path
        return
    folder = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(folder, f".diviml-{secrets.token_hex(6)}{os.path.splitext(path)[1]}")
    try:
        # created as open() creates a file (the umask applies), or with the mode of the file it replaces
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        if existing is not None:
            os.chmod(temporary, stat.S_IMODE(existing.st_mode))
        yield temporary
        os.replace(temporary, path)
    except OSError as error:
        raise DivimlInputError(f"cannot write {what}: {error.strerror}", source=path) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)


def write_text(path: str, text: str, what: str = "the output") -> None:
    """``text`` written to ``path`` whole or not at all (``written_whole``)."""
    with written_whole(path, what) as temporary, open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)


def check_folder_replaceable(path: str, what: str, replaceable: Callable[[str], bool]) -> None:
    """Refuse ``path`` when it is a folder that holds anything but what ``folder_written_whole`` may
    replace (``replaceable``: an earlier output of the same kind): a write replaces the folder whole."""
    if os.path.isdir(path) and os.listdir(path) and not replaceable(path):
        raise DivimlInputError(
            f"cannot write {what}: the folder holds other files, and it would be replaced whole",
            source=path,
            hint="name a new or empty folder, or an earlier one of these outputs",
        )


@contextlib.contextmanager
def folder_written_whole(path: str, what: str, replaceable: Callable[[str], bool]) -> Iterator[str]:
    """Yield a new temporary folder beside ``path``; once the block ends without error it takes
    ``path``'s place (a folder already there must be empty or ``replaceable``, and is removed). An
    interrupted or failed write leaves ``path`` as it was and no temporary folder."""
    check_folder_replaceable(path, what, replaceable)
    parent = os.path.dirname(os.path.abspath(path))
    staging = os.path.join(parent, f".diviml-{secrets.token_hex(6)}")
    try:
        os.mkdir(staging)
        yield staging
        if os.path.isdir(path):  # moved aside, then removed once the new folder is in its place
            retired = os.path.join(parent, f".diviml-{secrets.token_hex(6)}")
            os.rename(path, retired)
            try:
                os.rename(staging, path)
            except BaseException:
                os.rename(retired, path)
                raise
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.rename(staging, path)
    except OSError as error:
        raise DivimlInputError(f"cannot write {what}: {error.strerror}", source=path) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
