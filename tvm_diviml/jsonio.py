"""Reading and writing the project's JSON files, with errors that name the file."""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import DivimlInputError

# Limits on numbers read from files: beyond any real device or kernel, and beyond what the MILP and
# CP-SAT scale without overflow.
MAX_QUANTITY = 1e18  # FLOPs, FLOP/s, bytes, bytes/s
MAX_SECONDS = 1e6  # a kernel time, a launch overhead, a link latency


def require_number(
    value: Any,
    field: str,
    *,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float = MAX_QUANTITY,
    hint: str | None = None,
) -> float:
    """``value`` as a finite float, at least ``minimum`` / more than ``above``, at most ``maximum``;
    else one clear error."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DivimlInputError(f"must be a finite number, got {value!r}", field=field, hint=hint)
    if value > maximum:
        raise DivimlInputError(f"{value!r} is beyond any real figure (at most {maximum:g})", field=field, hint=hint)
    if minimum is not None and value < minimum:
        raise DivimlInputError(f"must be at least {minimum:g}, got {value!r}", field=field, hint=hint)
    if above is not None and not value > above:
        raise DivimlInputError(f"must be more than {above:g}, got {value!r}", field=field, hint=hint)
    return float(value)


def read_json(path: str) -> Any:
    """Parse a JSON file; a missing or malformed file becomes a DivimlInputError naming it."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise DivimlInputError("no such file", source=path, hint="check the path") from None
    except json.JSONDecodeError as error:
        raise DivimlInputError(
            f"malformed JSON at line {error.lineno}, column {error.colno}: {error.msg}",
            source=path,
            hint="fix the JSON syntax",
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise DivimlInputError(f"cannot read: {error}", source=path) from None
    except RecursionError:
        raise DivimlInputError(
            "JSON nested too deeply to be a model, platform or cost table",
            source=path,
            hint="check that the file is the one meant",
        ) from None


class JsonFile:
    """``save(path)`` and ``load(path, *context)`` for classes with ``to_json``/``from_json``."""

    def to_json(self) -> dict:
        raise NotImplementedError

    @classmethod
    def from_json(cls, data: Any, *context: Any):
        raise NotImplementedError

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(self.to_json(), handle, indent=1)

    @classmethod
    def load(cls, path: str, *context: Any):
        try:
            return cls.from_json(read_json(path), *context)
        except DivimlInputError as error:
            raise error.within(path) from None
