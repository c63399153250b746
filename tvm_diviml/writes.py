"""Files written whole or not at all: an interrupted or failed write leaves the old file (or none),
never half of a new one, and no temporary file behind."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator

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
