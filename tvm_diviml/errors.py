"""The one exception type users see (it names the input, the field and what would fix it), and the
CLI's memory of an interrupt."""

import threading


class DivimlInputError(ValueError):
    """Bad input from a user: a file, a field, an option.

    The CLI prints ``str(error)`` as one line and exits with status 2, so the message must say
    where the problem is (``source``, ``field``) and what to do about it (``hint``).
    """

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None, hint: str | None = None):
        self.source, self.field, self.hint, self.detail = source, field, hint, message
        parts = []
        if source:
            parts.append(str(source))
        if field:
            parts.append(f"field '{field}'")
        text = ": ".join(parts + [message]) if parts else message
        if hint:
            text += f" ({hint})"
        super().__init__(text)

    def within(self, source: str) -> "DivimlInputError":
        """The same error attributed to a file, for errors raised while parsing its contents."""
        if self.source:
            return self
        return DivimlInputError(self.detail, source=source, field=self.field, hint=self.hint)


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an error's message (a library's error may carry a whole dump)."""
    lines = [line.strip(" :") for line in str(error).splitlines() if line.strip(" :")]
    return lines[0][:limit] if lines else "no message"


class ServerFailure(RuntimeError):
    """A remote server died or stopped answering in the middle of a run: neither bad input nor a bug
    of ours. The CLI prints ``str(error)`` (which names the server, its address and the segment) as
    one line and exits with status 3, after releasing the other servers."""


_interrupted = threading.Event()


def on_interrupt(signum, frame) -> None:
    """The CLI's SIGINT and SIGTERM handler: remember the interrupt, then unwind as Ctrl-C does.

    TVM turns a KeyboardInterrupt raised while one of its calls runs into a plain RuntimeError, which
    a handler for a kernel's failure (a schedule rule refused, a kernel that does not build) would take
    for one and go on: those handlers call ``raise_if_interrupted`` first."""
    _interrupted.set()
    raise KeyboardInterrupt


def raise_if_interrupted() -> None:
    """Re-raise an interrupt that a TVM call turned into another error."""
    if _interrupted.is_set():
        raise KeyboardInterrupt


def interrupted() -> bool:
    return _interrupted.is_set()


def forget_interrupt() -> None:
    """A new command starts uninterrupted (tests run many in one process)."""
    _interrupted.clear()
