"""The ``window_load`` bound on one inference's makespan: precedence and contention together.

Each kernel has a head (its earliest start on any device, transfers priced, as in ``transfer_path``)
and a tail (the least time from its end to the makespan). The kernels whose head is at least a and
whose tail is at least b run inside [a, makespan - b] wherever they go, so that window holds their
least fractional load over the devices: makespan >= a + b + that load, for every (a, b) where the set
is not empty. Why it is valid and what it reached: docs/solvers.md#bounds.
"""

from __future__ import annotations

import itertools
import math

import mip
import numpy as np

from ..problem import Problem
from ..tolerances import SOLVER_SLACK
from ..toolkit.deadline import Deadline
from ..toolkit.device_classes import identical_devices
from ..toolkit.mip_backend import new_model
from .latency import work_heads_tails

THRESHOLDS = 64  # head and tail thresholds each (more kernels: evenly spaced among their values)
SCREEN_WORK = 2e8  # multiply-adds for screening every window by the dual grid: well under a second
WEIGHT_POINTS = 300  # device-class weight vectors on the dual grid, at most
EXACT_WINDOWS = 8  # the windows the screening ranks first get the exact LP


def window_load_bound(problem: Problem, deadline: Deadline | None = None) -> float:
    """``window_load`` (module docstring): every window screened by the LP's dual on a grid of device
    weights (any weights give a valid bound), the best few solved exactly by HiGHS until ``deadline``."""
    graph = problem.graph
    if not graph.kernels:
        return 0.0
    work, start, after = work_heads_tails(problem)
    usable = np.isfinite(work)
    head = np.where(usable, start, np.inf).min(axis=1)
    tail = np.where(usable, after, np.inf).min(axis=1)
    classes = [members for members, _ in identical_devices(list(range(work.shape[1])), lambda d: (work[:, d],))]
    class_work = np.stack([work[:, members].min(axis=1) for members in classes], axis=1)
    dearest = 2.0 * class_work[np.isfinite(class_work)].sum() + 1.0  # a relaxation: dear, not closed
    weights = class_weights([len(members) for members in classes])
    least = (weights[:, None, :] * np.where(np.isfinite(class_work), class_work, dearest)[None]).min(axis=2)
    count = max(2, min(THRESHOLDS, int(math.sqrt(SCREEN_WORK / max(least.size, 1)))))
    from_a, from_b = thresholds(head, count), thresholds(tail, count)
    inside = (head[None, None] >= from_a[:, None, None]) & (tail[None, None] >= from_b[None, :, None])
    screened = from_a[:, None] + from_b[None, :] + (inside.astype(float) @ least.T).max(axis=2)
    screened = np.where(inside.any(axis=2), screened, 0.0)  # an empty window proves nothing
    best = float(screened.max())
    for flat in np.argsort(screened, axis=None)[::-1][:EXACT_WINDOWS]:
        if deadline is not None and deadline.passed():
            break
        i, j = np.unravel_index(flat, screened.shape)
        if inside[i, j].any():
            load = fractional_load(class_work[inside[i, j]], [len(members) for members in classes])
            best = max(best, from_a[i] + from_b[j] + load)
    return float(best) * (1 - SOLVER_SLACK)


def thresholds(values: np.ndarray, count: int) -> np.ndarray:
    """At most ``count`` of the distinct finite ``values``, evenly spaced in their order (each is a
    valid threshold; more only tighten)."""
    distinct = np.unique(values[np.isfinite(values)])
    if len(distinct) <= count:
        return distinct
    return distinct[np.linspace(0, len(distinct) - 1, count).round().astype(int)]


def class_weights(sizes: list[int]) -> np.ndarray:
    """Rows of device weights by class: each device of class c weighs share_c / size_c, the shares
    summing to one in steps of 1/n, n as fine as ``WEIGHT_POINTS`` allows (at most 60)."""
    steps = 1
    while steps < 60 and math.comb(steps + len(sizes), len(sizes) - 1) <= WEIGHT_POINTS:
        steps += 1
    shares = [c for c in itertools.product(range(steps + 1), repeat=len(sizes)) if sum(c) == steps]
    return np.array(shares, dtype=float) / steps / np.array(sizes, dtype=float)


def fractional_load(class_work: np.ndarray, sizes: list[int]) -> float:
    """min T: every kernel split over the device classes it can run on, each class's load at most
    T per device (rows: kernels; inf: cannot run there); 0 where HiGHS gives no optimum."""
    unit = float(np.where(np.isfinite(class_work), class_work, 0.0).max()) or 1.0
    model = new_model("window_load", "highs")
    T = model.add_var(lb=0.0)
    load: list[list] = [[] for _ in sizes]
    for row in class_work / unit:
        shares = [(c, model.add_var(lb=0.0, ub=1.0)) for c in range(len(sizes)) if np.isfinite(row[c])]
        model += mip.xsum(x for _, x in shares) == 1
        for c, x in shares:
            load[c].append(float(row[c]) * x)
    for c, terms in enumerate(load):
        if terms:
            model += mip.xsum(terms) <= sizes[c] * T
    model.objective = mip.minimize(T)
    if model.optimize(relax=True) != mip.OptimizationStatus.OPTIMAL:
        return 0.0
    return max(model.objective_value, 0.0) * unit
