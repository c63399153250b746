"""Identical devices: those a solver cannot tell apart (the same prices for everything it charges)
become one class, so that a DP or a MIP chooses a class and a count instead of a device."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np

Description = tuple  # numbers and numpy arrays: what a device charges, as the solver sees it


def identical_devices(
    devices: Sequence[str], describe: Callable[[str], Description]
) -> list[tuple[list[str], Description]]:
    """``devices`` grouped by equal descriptions, in first-seen order: (the group's devices, their
    shared description)."""
    groups: dict[Hashable, tuple[list[str], Description]] = {}
    for device in devices:
        description = describe(device)
        key = tuple(part.tobytes() if isinstance(part, np.ndarray) else part for part in description)
        groups.setdefault(key, ([], description))[0].append(device)
    return list(groups.values())
