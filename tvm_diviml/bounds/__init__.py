"""Lower bounds on the best value any plan can reach (TVM-free).

Each part is a valid bound on its own and the reported bound is their maximum; kernels are priced
at their fastest feasible device, so no bound depends on a plan. Latency gets the critical path
(also with transfers priced), the largest kernel, the average load, the LP load bound and the window
load bound (heads, tails and the load between them) and the overlap load bound (one placement for
every window, each kernel's least overlap with it), and given time the same with a few kernels'
devices enumerated (``overlap_branching``); period modes the load bounds that stay valid
with replicas; pipelines (``stage_serial``) the MTPP bounds of ``bounds.pipeline.pipeline_bounds``,
with MIP bounds when given time to search; every mode the largest co-location group. Reports
print the gap value / bound - 1 with every plan. The bounds are entries of one catalog (``catalog.py``).

Each part and why it is valid: docs/solvers.md#bounds; the rules that keep bounds valid:
docs/design.md#lower-bounds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from ..problem import Problem
from ..toolkit.deadline import Deadline
from ..toolkit.pages import without_huge_pages
from ..toolkit.solvable import solvable
from .catalog import BOUNDS, Bound, Given
from .common import fastest_times, largest_group
from .cover_alongside import CoverAlongside
from .latency import critical_path_bound, transfer_path_bound
from .overlap_branching import overlap_branching_bound
from .overlap_load import overlap_load_bound
from .pipeline import pipeline_bounds
from .throughput import lp_load_bound
from .window_load import window_load_bound

log = logging.getLogger(__name__)


@without_huge_pages
def lower_bounds(
    problem: Problem,
    deadline: Deadline | None = None,
    *,
    search: bool = False,
    upper_s: float = math.inf,
    alongside: CoverAlongside | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Named lower bounds valid for ``problem``'s objective and cost mode: every entry of the catalog
    (``catalog.BOUNDS``) that applies. ``deadline``: past it, the bounds that take seconds on 10,000s
    of kernels are left out (whether it has passed is asked once, when the first of them comes up);
    none: the cheap bounds all run. ``search``: the MIP bounds of pipelines, and for latency the series
    decomposition's bound (CP-SAT per segment, where it is exact) and ``overlap_branching``, run until
    ``deadline``; without it every bound is cheap. ``upper_s``: a known plan's value (pipelines: it
    spares the downset DP a pass). ``alongside``: a pipeline's stage cover started beside the solver,
    whose bound is taken in place of running it. The bounds are those of the problem as
    ``toolkit.solvable`` models it: the same optimum (with every device in the period modes, where a
    replicated kernel may run on all identical ones). ``progress``: told each search as it starts,
    with its time limit (the searches take seconds to minutes)."""
    if search and deadline is None:
        raise ValueError("a search for bounds needs a deadline")
    deadline = deadline or Deadline.never()
    problem = solvable(problem, every_device=problem.mode in ("period_overlap", "host_staged"))
    cover = alongside.result if alongside is not None and alongside.running else None
    given = Given(search, upper_s, cover, say=progress)
    late: bool | None = None  # whether the deadline had passed when the first bound that minds it came up
    for name, entry in BOUNDS.items():
        if not entry.applies(problem):
            continue
        if len(problem.graph) > entry.late_up_to:
            late = deadline.passed() if late is None else late
            if late:
                log.info("the time limit has passed: the %s bound is left out", name)
                continue
        given.found.update(entry.bound(problem, deadline, given))
    return given.found


def lower_bound(problem: Problem) -> float:
    """The largest of the cheap ``lower_bounds``."""
    return max(lower_bounds(problem).values(), default=0.0)


__all__ = [
    "BOUNDS",
    "Bound",
    "CoverAlongside",
    "Given",
    "critical_path_bound",
    "fastest_times",
    "largest_group",
    "lower_bound",
    "lower_bounds",
    "lp_load_bound",
    "overlap_branching_bound",
    "overlap_load_bound",
    "pipeline_bounds",
    "transfer_path_bound",
    "window_load_bound",
]
