"""The ``overlap_load`` bound on one inference's makespan: ``window_load`` with one placement for every
window at once, each device on its own, and kernels that reach into a window counted by the part
they must spend in it.

A kernel k on device d starts no earlier than its head H[k, d] and ends no later than C - T[k, d]
(its tail), so within a window [a, C - b] it runs at least o = w - (a - H)+ - (b - T)+ of its work
w (when o > 0, the window cannot be empty). Where some kernel has o > 0 on every device it may
use, C >= a + b, and each device's overlaps fit in the window: C >= a + b + sum_k o[k, d] x[k, d]
for every device d, x[k, d] = 1 where k runs on d. The LP over fractional x with every such window
is a relaxation, so its optimum, and that of any subset of its windows, is a lower bound. Rows are
added where the current x breaks them most (row generation), from none. Why it is valid and what it
reached: docs/solvers.md#bounds.
"""

from __future__ import annotations

from collections.abc import Mapping

import mip
import numpy as np

from ..problem import Problem
from ..tolerances import SOLVER_SLACK
from ..toolkit.mip_backend import new_model
from .latency import TransferTimes, work_heads_tails
from .window_load import thresholds

THRESHOLDS = 64  # head and tail thresholds each, fewer where the overlap table would pass CELLS
CELLS = 4_000_000  # thresholds^2 x kernels x devices: the table every round checks (32 MB)
ROUNDS = 40  # LP solves at most
ROWS_PER_ROUND = 24  # the most broken windows added per round
PLACEMENTS = 4_000  # kernels x devices at most: each LP solve stays well under a second


def overlap_load_bound(
    problem: Problem, pins: Mapping[str, str] | None = None, times: TransferTimes | None = None
) -> float:
    """``overlap_load`` (module docstring); 0 where no window holds a kernel on every device, or past
    ``PLACEMENTS`` (there a second LP costs seconds a report should not pay, for little). With
    ``pins`` (kernel -> device), the bound over the plans that put those kernels there (heads and
    tails priced so); ``times``: the problem's ``TransferTimes``, where a caller already made them."""
    graph = problem.graph
    if not graph.kernels or len(graph.kernels) * len(problem.platform.devices) > PLACEMENTS:
        return 0.0
    work, head, tail = work_heads_tails(problem, pins, times)  # (n, devices); work inf where k may not run
    usable = np.isfinite(work)
    if not usable.any(axis=1).all():
        return 0.0
    count = max(2, min(THRESHOLDS, int(np.sqrt(CELLS / work.size))))
    from_a, from_b = thresholds(head[usable], count), thresholds(tail[usable], count)
    unit = float(work[usable].max()) or 1.0
    # overlap[i, j, k, d]: what k on d must run inside [a_i, C - b_j] (0 where it may not run on d)
    slack_a = np.maximum(from_a[:, None, None] - head[None], 0.0)  # (A, n, D)
    slack_b = np.maximum(from_b[:, None, None] - tail[None], 0.0)  # (B, n, D)
    reach = np.where(usable, work, 0.0)[None, None] - slack_a[:, None] - slack_b[None, :]
    overlap = np.where(usable[None, None], np.maximum(reach, 0.0), 0.0) / unit
    forced = (np.where(usable[None, None], reach, np.inf).min(axis=3) > 0).any(axis=2)  # (A, B)
    if not forced.any():
        return 0.0
    offset = (from_a[:, None] + from_b[None, :]) / unit  # (A, B)

    model = new_model("overlap_load", "highs")
    span = model.add_var(lb=0.0)
    share = {(k, d): model.add_var(lb=0.0, ub=1.0) for k, d in zip(*np.nonzero(usable))}
    for k in range(len(work)):
        model += mip.xsum(share[k, d] for d in np.flatnonzero(usable[k])) == 1
    model.objective = mip.minimize(span)
    placed = np.where(usable, 1.0 / usable.sum(axis=1, keepdims=True), 0.0)
    best = 0.0  # the LP's optimum over the rows added so far
    for _ in range(ROUNDS):
        loads = offset[:, :, None] + np.einsum("abkd,kd->abd", overlap, placed)
        broken = np.where(forced[:, :, None], loads - best, -np.inf)
        order = np.argsort(broken, axis=None)[::-1][:ROWS_PER_ROUND]
        rows = [np.unravel_index(flat, broken.shape) for flat in order if broken.flat[flat] > SOLVER_SLACK]
        if not rows:
            break
        for i, j, d in rows:
            terms = [(overlap[i, j, k, d], share[k, d]) for k in np.flatnonzero(overlap[i, j, :, d] > 0)]
            model += span >= offset[i, j] + mip.xsum(float(c) * x for c, x in terms)
        if model.optimize(relax=True) != mip.OptimizationStatus.OPTIMAL:
            break
        best = model.objective_value
        placed = np.zeros_like(placed)
        for (k, d), x in share.items():
            placed[k, d] = x.x
    return best * unit * (1 - SOLVER_SLACK)
