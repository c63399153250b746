"""One wall-clock deadline per solve, handed down to every sub-solve, so that a time limit means the
wall time of the whole solve wherever it is given.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ..errors import DivimlInputError


class OutOfTime(DivimlInputError):
    """A phase stopped at its deadline with nothing to hand back: its caller keeps what it has, and a
    user who asked for that phase alone is told to allow more time."""


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

    def check(self, what: str) -> None:
        """Raise ``OutOfTime`` naming ``what`` once the deadline passed: a long loop calls this per step."""
        if self.passed():
            raise OutOfTime(
                f"{what} did not finish within the time limit", field="time_limit", hint="raise --time-limit"
            )

    def within(self, seconds: float) -> Deadline:
        """The earlier of this deadline and ``seconds`` from now: a sub-solve's own limit, inside ours."""
        return Deadline(min(self.at, time.perf_counter() + seconds))
