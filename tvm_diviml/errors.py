"""The one exception type users see (it names the input, the field and what would fix it), and the
CLI's memory of an interrupt."""

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator


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


log = logging.getLogger(__name__)

_interrupted = threading.Event()

# Signals that stop a command as Ctrl-C does: a terminal closed (SIGHUP) or a job stopped (SIGTERM) must
# stop CP-SAT workers and local RPC servers on the way out too.
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def answer_interrupts() -> None:
    """Have every signal of ``INTERRUPT_SIGNALS`` unwind as Ctrl-C does (``on_interrupt``)."""
    for number in INTERRUPT_SIGNALS:
        signal.signal(number, on_interrupt)


def on_interrupt(signum, frame) -> None:
    """The CLI's handler of ``INTERRUPT_SIGNALS``: remember the interrupt, then unwind as Ctrl-C does.

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


class Stop:
    """Whether an interrupt arrived inside ``interrupts_deferred``."""

    def __init__(self) -> None:
        self.requested = threading.Event()


@contextlib.contextmanager
def interrupts_deferred(notice: str = "") -> Iterator[Stop]:
    """Within: the ``INTERRUPT_SIGNALS`` are only remembered (``Stop.requested``, with ``notice`` logged), for
    work that must reach a safe point before it stops: a tuning search, whose C++ loop and worker pools
    crashed (exit -11) or left tracebacks when Ctrl-C unwound them at a random point. The caller stops
    at its safe point and raises KeyboardInterrupt there; a second interrupt raises it at once.
    Outside the main thread, nothing is deferred."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def remember(signum, frame) -> None:
        if stop.requested.is_set():
            raise KeyboardInterrupt
        stop.requested.set()
        if notice:
            log.warning("%s", notice)

    previous = {number: signal.signal(number, remember) for number in INTERRUPT_SIGNALS}
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if stop.requested.is_set() and previous[signal.SIGINT] is on_interrupt:
            _interrupted.set()  # the CLI's handler would have remembered it


def forget_interrupt() -> None:
    """A new command starts uninterrupted (tests run many in one process)."""
    _interrupted.clear()
