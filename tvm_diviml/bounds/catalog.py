"""The lower bounds by name, as the solvers have theirs (``solvers/catalog.py``): each entry says which
problems it holds for and finds its bounds by a deadline; ``lower_bounds`` runs every entry that applies.

An entry's bounds are named parts (most entries find one, named as the entry; the pipeline entry finds
the MTPP bounds of ``pipeline.pipeline_bounds``). Each part and why it is valid: docs/solvers.md#bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..problem import Problem
from ..toolkit.deadline import Deadline
from .common import fastest_times, largest_group
from .latency import critical_path_bound, series_bound, transfer_path_bound
from .overlap_branching import overlap_branching_bound
from .overlap_load import overlap_load_bound
from .pipeline import pipeline_bounds
from .throughput import lp_load_bound
from .window_load import window_load_bound

# Up to this many kernels the load LP runs even past the deadline: 0.1 s on llama's 411 kernels, and
# without it a solve that used its whole limit reported a bound 15% lower (the average load).
LP_ALWAYS_UP_TO = 2_000
# Up to this many kernels the latency bounds over heads and tails (transfer_path, window_load,
# overlap_load) and the searches run even past the deadline: on 100,000 kernels they take 10 s, the
# other bounds 2 s.
PATHS_ALWAYS_UP_TO = 20_000


@dataclass
class Given:
    """What a bound may use beside its problem and deadline."""

    search: bool = False  # time to search was given: the MIP and CP-SAT bounds run until the deadline
    upper_s: float = math.inf  # a known plan's value: searches stop there (the pipelines' DP spares a pass)
    cover: Callable[[Deadline], float | None] | None = None  # a stage cover running alongside, by a deadline
    found: dict[str, float] = field(default_factory=dict)  # the parts found before, by name
    say: Callable[[str], None] | None = None  # told each search as it starts, with its time

    def announce(self, search: str) -> None:
        if self.say is not None:
            self.say(search)


@dataclass(frozen=True)
class Bound:
    """One catalog entry: ``applies(problem)``, and ``bound(problem, deadline, given)``, its named parts.
    Past the deadline it runs only on graphs of at most ``late_up_to`` kernels (each takes seconds
    on 10,000s of them)."""

    applies: Callable[[Problem], bool]
    bound: Callable[[Problem, Deadline, Given], dict[str, float]]  # its parts, by name
    late_up_to: float = math.inf


Parts = dict[str, float]


def _alone(name: str, bound: Callable[[Problem], float]) -> Callable[[Problem, Deadline, Given], Parts]:
    """An entry's bound for one that reads its problem alone: its value, named."""

    def named(problem: Problem, deadline: Deadline, given: Given) -> Parts:
        return {name: bound(problem)}

    return named


def _pipeline(problem: Problem, deadline: Deadline, given: Given) -> Parts:
    if given.search:
        given.announce(f"bound: the pipeline MIPs, up to {deadline.left():.0f} s")
    searched = deadline if given.search else None
    return pipeline_bounds(problem, searched, upper_s=given.upper_s, alongside=given.cover)


def _average_load(problem: Problem) -> float:
    return sum(fastest_times(problem).values()) / len(problem.platform.devices)


def _largest_kernel(problem: Problem) -> float:
    return max(fastest_times(problem).values(), default=0.0)


def _largest_group(problem: Problem, deadline: Deadline, given: Given) -> Parts:
    group = largest_group(problem)
    return {"largest_group": group} if group > 0 else {}


def _window_load(problem: Problem, deadline: Deadline, given: Given) -> Parts:
    return {"window_load": window_load_bound(problem, deadline)}


def _series(problem: Problem, deadline: Deadline, given: Given) -> Parts:
    """The series decomposition's bound, in at most half the time left (where it is exact)."""
    if not given.search:
        return {}
    given.announce(f"bound: the series decomposition, up to {deadline.left() / 2:.0f} s")
    series = series_bound(problem, deadline.within(deadline.left() / 2))
    return {} if series is None else {"series": series}


def _overlap_branching(problem: Problem, deadline: Deadline, given: Given) -> Parts:
    """``overlap_branching`` in the time left, where it raises ``overlap_load``."""
    if not given.search:
        return {}
    given.announce(f"bound: overlap_branching, up to {deadline.left():.0f} s")
    root = given.found["overlap_load"]
    branched = overlap_branching_bound(problem, deadline, root, given.upper_s)
    return {"overlap_branching": branched} if branched > root else {}


def _mode_is(*modes: str) -> Callable[[Problem], bool]:
    return lambda problem: problem.mode in modes


def _always(_: Problem) -> bool:
    return True


LATENCY = _mode_is("latency")
# In the order the parts are reported (a tie for the largest names the first).
BOUNDS: dict[str, Bound] = {
    "pipeline": Bound(_mode_is("stage_serial"), _pipeline),
    "average_load": Bound(_mode_is("latency", "period_overlap", "host_staged"), _alone("average_load", _average_load)),
    "largest_kernel": Bound(_mode_is("latency", "host_staged"), _alone("largest_kernel", _largest_kernel)),
    "lp_load": Bound(_always, _alone("lp_load", lp_load_bound), LP_ALWAYS_UP_TO),
    "largest_group": Bound(_always, _largest_group),
    "critical_path": Bound(LATENCY, _alone("critical_path", critical_path_bound)),
    "transfer_path": Bound(LATENCY, _alone("transfer_path", transfer_path_bound), PATHS_ALWAYS_UP_TO),
    "window_load": Bound(LATENCY, _window_load, PATHS_ALWAYS_UP_TO),
    "overlap_load": Bound(LATENCY, _alone("overlap_load", overlap_load_bound), PATHS_ALWAYS_UP_TO),
    "series": Bound(LATENCY, _series, PATHS_ALWAYS_UP_TO),
    "overlap_branching": Bound(LATENCY, _overlap_branching, PATHS_ALWAYS_UP_TO),
}
