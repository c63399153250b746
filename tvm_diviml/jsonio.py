"""Reading and writing the project's JSON files, with errors that name the file."""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Any

from .errors import DivimlInputError
from .writes import write_text

# Limits on numbers read from files: beyond any real device or kernel, and beyond what the MILP and
# CP-SAT scale without overflow.
MAX_QUANTITY = 1e18  # FLOPs, FLOP/s, bytes, bytes/s
MAX_SECONDS = 1e6  # a kernel time, a launch overhead, a link latency
# The least rate of any real device or link (FLOP/s, bytes/s): a figure below it is a unit slip (12 GB/s
# written as 12), whose costs (a megabyte in a day) are no machine's.
MIN_RATE = 1e3


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
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > maximum:
        value = math.copysign(math.inf, value)  # too large for a float: beyond any limit below
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DivimlInputError(f"must be a finite number, got {value!r}", field=field, hint=hint)
    if value > maximum:
        raise DivimlInputError(f"{value!r} is beyond any real figure (at most {maximum:g})", field=field, hint=hint)
    if minimum is not None and value < minimum:
        raise DivimlInputError(f"must be at least {minimum:g}, got {value!r}", field=field, hint=hint)
    if above is not None and not value > above:
        raise DivimlInputError(f"must be more than {above:g}, got {value!r}", field=field, hint=hint)
    return float(value)


# An integer literal longer than this is read as a float: a 400-digit count is no real figure, and the
# checks that read it (``require_number``) then name its field; Python refuses past 4,300 digits.
LONGEST_INTEGER_DIGITS = 20


class LongInteger(float):
    """An integer literal of too many digits, as the float it rounds to (inf past 1e308); its repr
    says how many digits it had."""

    def __new__(cls, text: str):
        number = super().__new__(cls, text)
        number.digits = len(text.lstrip("-"))
        return number

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"

    @classmethod
    def of(cls, value: int) -> LongInteger:
        """From a Python integer (str() refuses past 4,300 digits: the count is read off its bits)."""
        try:
            rounded = float(value)
        except OverflowError:
            rounded = math.inf if value > 0 else -math.inf
        number = super().__new__(cls, rounded)
        number.digits = math.floor(abs(value).bit_length() * math.log10(2)) + 1
        return number


def _integer(text: str) -> int | float:
    return int(text) if len(text.lstrip("-")) <= LONGEST_INTEGER_DIGITS else LongInteger(text)


def long_integers_as_floats(data: Any) -> Any:
    """``data``, parsed JSON that did not come through ``read_json`` (an API caller's dict), with every
    integer of more than ``LONGEST_INTEGER_DIGITS`` digits a ``LongInteger``, as ``read_json`` reads it."""
    if isinstance(data, dict):
        return {key: long_integers_as_floats(value) for key, value in data.items()}
    if isinstance(data, list):
        return [long_integers_as_floats(value) for value in data]
    if isinstance(data, int) and not isinstance(data, bool) and abs(data) >= 10**LONGEST_INTEGER_DIGITS:
        return LongInteger.of(data)
    return data


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members; a key given twice is refused (json would silently keep the last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DivimlInputError(
                f"key '{key}' appears twice in one object", field=key, hint="keep one of the two entries"
            )
        out[key] = value
    return out


# The largest JSON file read (a graph of a million kernels is about 200 MB): Python's objects take about ten
# times a file's bytes, and a path to an endless file (/dev/zero, a pipe) must not be read until memory ends.
MAX_JSON_BYTES = 512 << 20


def read_json(path: str) -> Any:
    """Parse a JSON file; a missing, malformed, endless or oversized file becomes a DivimlInputError naming it."""
    try:
        check_regular_file(path, os.stat(path), MAX_JSON_BYTES)  # before open(), which waits on a pipe
        with open(path, "rb") as handle:
            text = handle.read(MAX_JSON_BYTES + 1)
        if len(text) > MAX_JSON_BYTES:
            raise DivimlInputError(
                f"grew beyond {MAX_JSON_BYTES >> 20} MiB while it was read", source=path, hint="read a finished file"
            )
        return json.loads(text.decode("utf-8"), parse_int=_integer, object_pairs_hook=_unique_keys)
    except DivimlInputError as error:
        raise error.within(path) from None
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


def check_regular_file(path: str, status: os.stat_result, limit: int) -> None:
    """Refuse what is not a regular file (a device such as /dev/zero or a pipe never ends) or is larger
    than ``limit`` bytes, before a byte of it is read."""
    if not stat.S_ISREG(status.st_mode):
        raise DivimlInputError(
            "is not a regular file (a device or a pipe, which may never end)", source=path, hint="give a file"
        )
    if status.st_size > limit:
        raise DivimlInputError(
            f"is {status.st_size / 2**20:.0f} MiB, more than the {limit >> 20} MiB read at most",
            source=path,
            hint="check that the file is the one meant",
        )


class JsonFile:
    """``save(path)`` and ``load(path, *context)`` for classes with ``to_json``/``from_json``."""

    def to_json(self) -> dict:
        raise NotImplementedError

    @classmethod
    def from_json(cls, data: Any, *context: Any):
        raise NotImplementedError

    def save(self, path: str) -> None:
        """Write the JSON form to ``path``, whole or not at all."""
        write_text(path, json.dumps(self.to_json(), indent=1), "the file")

    @classmethod
    def load(cls, path: str, *context: Any):
        try:
            return cls.from_json(read_json(path), *context)
        except DivimlInputError as error:
            raise error.within(path) from None
