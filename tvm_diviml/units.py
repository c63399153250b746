"""Seconds and bytes as a person reads them, for every report, log line and error message."""

from __future__ import annotations

import math


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if math.isinf(seconds):
        return "inf"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3f} {unit}"
    return f"{seconds * 1e9:.1f} ns"


def format_bytes(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def format_rate(per_second: float, unit: str) -> str:
    """A rate such as 1.1 TFLOP/s or 21.6 GB/s (``unit`` FLOP or B), in decimal prefixes as datasheets write them."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if per_second >= scale:
            return f"{per_second / scale:.1f} {prefix}{unit}/s"
    return f"{per_second:.0f} {unit}/s"
