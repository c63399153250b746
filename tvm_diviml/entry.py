"""The ``diviml`` command's first instant: Ctrl-C, SIGTERM and SIGHUP are answered before the command
line's modules are imported (seconds on a loaded machine), so that an interrupt then ends the command
with "diviml: interrupted" and exit status 130, never an import's traceback."""

import os
import sys

from .errors import answer_interrupts


def main() -> None:
    answer_interrupts()
    try:
        from .cli import entry  # after the signals are answered: an interrupt during this import ends cleanly
    except KeyboardInterrupt:
        sys.stderr.write("diviml: interrupted\n")
        sys.stderr.flush()
        os._exit(130)  # as cli.entry does after an interrupt: an interrupted import leaves state behind
    entry()
