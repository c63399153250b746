"""Lower bounds on the best value any plan can reach (TVM-free).

Each part is a valid bound on its own and the reported bound is their maximum; kernels are priced
at their fastest feasible device, so no bound depends on a plan. Latency gets the critical path
(also with transfers priced), the largest kernel, the average load, the LP load bound and the window
load bound (heads, tails and the load between them) and the overlap load bound (one placement for
every window, each kernel's least overlap with it), and given time the same with a few kernels'
devices enumerated (``overlap_branching``); period modes the load bounds that stay valid
with replicas; pipelines (``stage_serial``) the MTPP bounds of ``bounds.pipeline.pipeline_bounds``,
with MIP bounds when given ``mip_time_limit_s``; every mode the largest co-location group. Reports
print the gap value / bound - 1 with every plan.

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
from .common import fastest_times, largest_group
from .cover_alongside import CoverAlongside
from .latency import critical_path_bound, series_bound, transfer_path_bound
from .overlap_branching import overlap_branching_bound
from .overlap_load import overlap_load_bound
from .pipeline import pipeline_bounds
from .throughput import lp_load_bound
from .window_load import window_load_bound

log = logging.getLogger(__name__)
# Up to this many kernels the load LP runs even past the deadline: 0.1 s on llama's 411 kernels, and
# without it a solve that used its whole limit reported a bound 15% lower (the average load).
LP_ALWAYS_UP_TO = 2_000
# Up to this many kernels the latency bounds over heads and tails (transfer_path, window_load,
# overlap_load) run even past the deadline: on 100,000 kernels they take 10 s, the other bounds 2 s.
PATHS_ALWAYS_UP_TO = 20_000


@without_huge_pages
def lower_bounds(
    problem: Problem,
    mip_time_limit_s: float = 0.0,
    upper_s: float = math.inf,
    deadline: Deadline | None = None,
    alongside: CoverAlongside | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Named lower bounds valid for ``problem``'s objective and cost mode. ``mip_time_limit_s`` > 0
    adds the MIP bounds of pipelines (seconds shared among them) and, for latency, the series
    decomposition's bound (CP-SAT per segment, where it is exact) and ``overlap_branching``; 0 keeps every bound cheap.
    ``upper_s``: a known plan's value (pipelines: it spares the downset DP a pass). ``deadline``: past
    it, the load LPs are left out (on 10,000s of kernels each takes seconds). ``alongside``: a
    pipeline's stage cover started beside the solver, whose bound is taken in place of running it.
    The bounds are those of the problem as ``toolkit.solvable`` models it: the same optimum (with
    every device in the period modes, where a replicated kernel may run on all identical ones).
    ``progress``: told each search as it starts, with its time limit (the searches take seconds to minutes)."""
    say = progress or (lambda _: None)
    searches_until = Deadline.after(mip_time_limit_s)  # the cheap bounds take their share (a second on 2,000 kernels)
    problem = solvable(problem, every_device=problem.mode in ("period_overlap", "host_staged"))
    mode = problem.mode
    fastest = fastest_times(problem)
    parts: dict[str, float] = {}
    if mode == "stage_serial":
        cover = alongside.result if alongside is not None and alongside.running else None
        if mip_time_limit_s > 0:
            say(f"bound: the pipeline MIPs, up to {mip_time_limit_s:.0f} s")
        parts.update(pipeline_bounds(problem, mip_time_limit_s, upper_s=upper_s, alongside=cover))
    else:
        parts["average_load"] = sum(fastest.values()) / len(problem.platform.devices)
        if mode != "period_overlap":
            parts["largest_kernel"] = max(fastest.values(), default=0.0)
    late = deadline is not None and deadline.passed()
    if not late or len(problem.graph) <= LP_ALWAYS_UP_TO:
        parts["lp_load"] = lp_load_bound(problem)
    else:  # an LP over every kernel: seconds on 10,000s of them
        log.info("the time limit has passed: the load LP bound is left out")
    group = largest_group(problem)
    if group > 0:
        parts["largest_group"] = group
    if mode == "latency":
        parts["critical_path"] = critical_path_bound(problem)
        if late and len(problem.graph) > PATHS_ALWAYS_UP_TO:
            log.info("the time limit has passed: the bounds over heads and tails are left out")
            return parts
        parts["transfer_path"] = transfer_path_bound(problem)
        parts["window_load"] = window_load_bound(problem, deadline)
        parts["overlap_load"] = overlap_load_bound(problem)
        if mip_time_limit_s > 0:
            parts.update(_latency_searches(problem, searches_until, upper_s, parts["overlap_load"], say))
    return parts


def _latency_searches(
    problem: Problem, until: Deadline, upper_s: float, overlap_s: float, say: Callable[[str], None]
) -> dict[str, float]:
    """The latency bounds that search until ``until``: the series decomposition's (at most half the
    time left, where the decomposition is exact), then ``overlap_branching`` in the rest (where it
    raises ``overlap_s``)."""
    parts = {}
    say(f"bound: the series decomposition, up to {until.left() / 2:.0f} s")
    series = series_bound(problem, until.left() / 2)
    if series is not None:
        parts["series"] = series
    say(f"bound: overlap_branching, up to {until.left():.0f} s")
    branched = overlap_branching_bound(problem, until, overlap_s, upper_s)
    if branched > overlap_s:
        parts["overlap_branching"] = branched
    return parts


def lower_bound(problem: Problem, mip_time_limit_s: float = 0.0) -> float:
    """The largest of ``lower_bounds``."""
    return max(lower_bounds(problem, mip_time_limit_s).values(), default=0.0)


__all__ = [
    "CoverAlongside",
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
