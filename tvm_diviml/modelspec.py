"""MODEL strings of a name and options (``resnet18:resolution=64``): parsed, printed and checked.
Both the zoo and the workload glue read them, so they live below both."""

from __future__ import annotations

from typing import Any

from .errors import DivimlInputError
from .jsonio import LongInteger


def parse_model_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``name:key=value,key=value`` -> (name, options); values become int, float or str."""
    name, _, rest = spec.partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DivimlInputError(
                f"option '{item}' is not key=value", field="MODEL", hint="write options as name:key=value,key=value"
            )
        options[key.strip()] = _parse_value(value.strip())
    return name, options


# The largest extent TVM's kernels index (int32): a count past it cannot give a tensor, and one past
# int64 broke TVM's own shape constructor with a TypeError.
MAX_COUNT = 2**31 - 1


def check_counts(name: str, options: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Options whose default is a positive integer (layers, heads, branches, seq, ...) must be positive
    integers of at most ``MAX_COUNT``."""
    for key, value in options.items():
        default = defaults.get(key)
        if key == "seed" or isinstance(default, bool) or not isinstance(default, int) or default < 1:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DivimlInputError(
                f"option '{key}' of '{name}' must be a positive integer, got {value!r}",
                field="MODEL",
                hint=f"the default is {name}:{key}={default}",
            )
        if value > MAX_COUNT:
            shown = str(value) if value < 10**30 else repr(LongInteger.of(value))  # str() stops at 4,300 digits
            raise DivimlInputError(
                f"option '{key}' of '{name}' is {shown}, past {MAX_COUNT}, the largest extent TVM's kernels index",
                field="MODEL",
                hint=f"choose a smaller {key} (the default is {name}:{key}={default})",
            )


def format_model_spec(name: str, options: dict[str, Any]) -> str:
    """The inverse of ``parse_model_spec``: ``name:key=value,...`` (the bare name without options)."""
    return name + (":" + ",".join(f"{k}={v}" for k, v in options.items()) if options else "")


def _parse_value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
