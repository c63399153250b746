"""What several commands print alike: JSON on stdout or in a file (with the human report moved to
stderr when the JSON takes stdout), a solve's progress lines, and warnings."""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import json
import math
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

import numpy as np

from ..toolkit.incumbents import Event
from ..units import format_seconds
from ..writes import write_text


def json_safe(value: Any) -> Any:
    """JSON has no infinity: write it as null. NumPy scalars become Python ones."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, tuple) else "->".join(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


# Where ``--json -`` writes: the command's stdout, while its human report goes to stderr.
_JSON_STDOUT: contextvars.ContextVar[TextIO | None] = contextvars.ContextVar("json_stdout", default=None)


@contextlib.contextmanager
def report_on_stderr_beside_json(args: argparse.Namespace) -> Iterator[None]:
    """With ``--json -``, stdout carries the JSON alone: whatever else the command prints goes to stderr."""
    if getattr(args, "json", None) != "-":
        yield
        return
    token = _JSON_STDOUT.set(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_STDOUT.reset(token)


def write_json(data: Any, destination: str, what: str = "--json") -> None:
    """``data`` as JSON on stdout (``-``) or in a file, written whole or not at all."""
    text = json.dumps(json_safe(data), indent=1)
    if destination == "-":
        print(text, file=_JSON_STDOUT.get() or sys.stdout)
    else:
        write_text(destination, text + "\n", what)


def print_warnings(warnings: Iterable[str]) -> None:
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


class ProgressLines:
    """The solve's progress on stderr: the best plan, bound and gap as they improve, from the first
    second on and at most a line a second (a quick solve prints none; Ctrl-C keeps the best plan)."""

    EVERY_S = 1.0

    def __init__(self) -> None:
        self.shown_at = 0.0

    def __call__(self, event: Event) -> None:
        if event.kind == "phase":  # a few per solve, each the start of a step that may be long
            print(f"[{event.at_s:7.1f} s] {event.by} ...", file=sys.stderr, flush=True)
            return
        if event.at_s - self.shown_at < self.EVERY_S:
            return
        self.shown_at = event.at_s
        gap = f"   gap {100 * event.gap:.1f}%" if event.gap is not None else ""
        bound = f"   bound {format_seconds(event.lower_bound_s)}" if event.lower_bound_s > 0 else ""
        best = format_seconds(event.value_s) if event.value_s is not None else "-"
        print(f"[{event.at_s:7.1f} s] best plan {best}{bound}{gap}   ({event.by})", file=sys.stderr, flush=True)
