"""Large numpy arrays on ordinary pages: numpy asks the kernel for transparent huge pages on every
array of 4 MB or more (madvise), and where the kernel defragments memory on such a fault (THP
``defrag = madvise``, as on this project's VMs) filling a fresh 800 MB array took 4.6-9 s instead of
0.3 s. The DP grids of a 10,000-kernel pipeline are such arrays: `diviml plan` of llama:layers=588 on
gpu8 at K = 8 spent 44 s of its 65 in the kernel (its first slicing 25.7 s), and 6 s of 59 without.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import numpy as np

F = TypeVar("F", bound=Callable)
# numpy's private switch (since 1.19): numpy._core from 2.0, numpy.core before
_set_huge_pages = next(
    (
        getattr(getattr(np, core).multiarray, "_set_madvise_hugepage", None)
        for core in ("_core", "core")
        if hasattr(np, core)
    ),
    None,
)


def without_huge_pages(function: F) -> F:
    """``function`` with numpy's huge-page advice off while it runs (restored after; nothing where
    this numpy has no such switch)."""

    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        if _set_huge_pages is None:
            return function(*args, **kwargs)
        before = _set_huge_pages(False)
        try:
            return function(*args, **kwargs)
        finally:
            _set_huge_pages(before)

    return wrapped  # type: ignore[return-value]
