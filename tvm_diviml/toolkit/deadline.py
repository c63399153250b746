"""One wall-clock deadline per solve, handed down to every sub-solve, so that a time limit means the
wall time of the whole solve wherever it is given.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Deadline:
    at: float  # time.perf_counter() value at which the solve must end

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.perf_counter() + seconds)

    @classmethod
    def never(cls) -> Deadline:
        return cls(math.inf)

    def left(self) -> float:
        """Seconds until the deadline (0 once it passed)."""
        return max(self.at - time.perf_counter(), 0.0)

    def passed(self) -> bool:
        return time.perf_counter() >= self.at

    def within(self, seconds: float) -> Deadline:
        """The earlier of this deadline and ``seconds`` from now: a sub-solve's own limit, inside ours."""
        return Deadline(min(self.at, time.perf_counter() + seconds))
