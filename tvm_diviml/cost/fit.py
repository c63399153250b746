"""Least-squares fits of the cost formulas to measurements (TVM-free: numpy).

A roofline, time = max(FLOPs / P, bytes / W) + o, fitted to measured kernel times gives the
*effective* peak and bandwidth of what TVM builds (docs/design.md#cost-models: datasheet peaks
are far off for unscheduled kernels). A link, seconds = latency + bytes / bandwidth, fitted to
copies of several sizes.
Both minimise relative error (rows divided by the measured time), so that small kernels and small
copies count as much as large ones.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..graph import OpGraph
from .base import CostModel

ROUNDING = 1e-12  # relative; a term below ~1e-6 of every measured time counts as absent


@dataclass
class RooflineFit:
    peak_flops: float
    bandwidth_Bps: float
    overhead_s: float
    median_rel_error: float
    p90_rel_error: float
    compute_bound: np.ndarray  # per kernel, in the order given: FLOPs / P > bytes / W


@dataclass
class LinkFit:
    latency_s: float
    bandwidth_Bps: float
    max_rel_error: float


def fit_roofline(flops, bytes_moved, seconds) -> RooflineFit:
    """Fit P, W, o of time = max(flops / P, bytes / W) + o, minimising the squared relative errors.

    The max makes it nonlinear, but any (P, W) classifies the kernels by one threshold on arithmetic
    intensity (compute-bound iff flops / bytes > P / W), so there are at most n + 1 classifications.
    For each, with the kernels sorted by intensity, the problem is linear in (1/P, 1/W, o) >= 0 and
    prefix sums give its normal equations in O(1); the fit keeps the classification whose solution has
    the least error under the max. That finds the global optimum (up to kernels exactly on the ridge),
    where alternating classification and fitting can stop in a local one.

    Degenerate cases: when the best fit puts every kernel in one class (the least squares set 1/P or 1/W
    to zero), the data bound the other figure only from below. It is then set to that bound, which puts
    the most extreme kernel on the ridge: P = max over kernels of flops / (bytes / W) when all are
    memory-bound (no prediction changes), W = max over kernels with FLOPs of bytes / (flops / P) when
    all are compute-bound (kernels without FLOPs then cost bytes / W + o, not o).
    """
    flops, bytes_moved, seconds = _checked(
        "roofline fit", ("flops", flops), ("bytes_moved", bytes_moved), ("seconds", seconds), minimum=3
    )
    if (flops < 0).any() or (bytes_moved <= 0).any():
        raise ValueError("roofline fit: flops must be >= 0 and bytes_moved > 0 for every kernel")
    if not (flops > 0).any():
        raise ValueError("roofline fit: no kernel does FLOPs, so there is no peak to fit")

    order = np.argsort(flops / bytes_moved, kind="stable")
    intensity = (flops / bytes_moved)[order]
    # Row i of the least squares if kernel i is memory- or compute-bound, divided by its measured time
    # (relative error), the columns (1/P, 1/W, o) scaled to unit norm for conditioning.
    per_second = 1 / seconds[order]
    flops_per_s, bytes_per_s = flops[order] * per_second, bytes_moved[order] * per_second
    zeros = np.zeros(len(order))
    scale = np.linalg.norm([flops_per_s, bytes_per_s, per_second], axis=1)
    memory_gram, memory_moment = _normal_equations_below(np.stack([zeros, bytes_per_s, per_second], axis=1) / scale)
    compute_gram, compute_moment = _normal_equations_below(np.stack([flops_per_s, zeros, per_second], axis=1) / scale)
    # Split k: kernels [0, k) memory-bound, [k, n) compute-bound; only where the intensity changes.
    splits = np.concatenate([[0], np.flatnonzero(np.diff(intensity) > 0) + 1, [len(order)]])
    gram = memory_gram[splits] + compute_gram[-1] - compute_gram[splits]
    moment = memory_moment[splits] + compute_moment[-1] - compute_moment[splits]
    thetas = _nonnegative_least_squares(gram, moment) / scale

    best: tuple[float, np.ndarray] | None = None
    for theta in thetas:
        inverse_peak, inverse_bandwidth, overhead = _on_the_ridge(theta, flops, bytes_moved)
        if inverse_peak == 0 or inverse_bandwidth == 0:
            continue
        predicted = np.maximum(flops * inverse_peak, bytes_moved * inverse_bandwidth) + overhead
        error = float((((predicted - seconds) / seconds) ** 2).sum())
        if best is None or error < best[0]:
            best = error, np.array([inverse_peak, inverse_bandwidth, overhead])
    if best is None:
        raise ValueError("roofline fit: the times do not grow with FLOPs or bytes; no roofline fits them")

    inverse_peak, inverse_bandwidth, overhead = best[1]
    predicted = np.maximum(flops * inverse_peak, bytes_moved * inverse_bandwidth) + overhead
    errors = np.abs(predicted - seconds) / seconds
    return RooflineFit(
        float(1 / inverse_peak),
        float(1 / inverse_bandwidth),
        float(overhead),
        float(np.median(errors)),
        float(np.percentile(errors, 90)),
        flops * inverse_peak > bytes_moved * inverse_bandwidth,
    )


def fit_costs(graph: OpGraph, costs: CostModel, device: str) -> RooflineFit:
    """The roofline fitted to ``costs``' prices of ``graph``'s kernels on ``device`` (on a measured
    device: how far to trust the estimate); raises ValueError where no fit is possible."""
    kernels = list(graph.kernels.values())
    return fit_roofline(
        np.array([k.flops for k in kernels]),
        np.array([k.bytes_moved for k in kernels]),
        np.array([costs.compute_s(k.name, device) for k in kernels]),
    )


def fit_link(nbytes, seconds) -> LinkFit:
    """Fit seconds = latency + nbytes / bandwidth (latency >= 0) to copies of several sizes,
    minimising the squared relative errors."""
    nbytes, seconds = _checked("link fit", ("nbytes", nbytes), ("seconds", seconds), minimum=2)
    if (nbytes < 0).any():
        raise ValueError("link fit: nbytes must be >= 0")
    if len(np.unique(nbytes)) < 2:
        raise ValueError("link fit: needs copies of at least 2 different sizes to tell latency from bandwidth")
    columns = np.stack([np.ones(len(nbytes)), nbytes], axis=1) / seconds[:, None]
    scale = np.linalg.norm(columns, axis=0)
    scaled = columns / scale
    latency, inverse_bandwidth = _nonnegative_least_squares(scaled.T @ scaled, scaled.sum(axis=0)) / scale
    if inverse_bandwidth <= 0:
        raise ValueError("link fit: the copy times do not grow with size; measure larger copies")
    errors = np.abs(latency + nbytes * inverse_bandwidth - seconds) / seconds
    return LinkFit(float(latency), float(1 / inverse_bandwidth), float(errors.max()))


def _nonnegative_least_squares(gram: np.ndarray, moment: np.ndarray) -> np.ndarray:
    """argmin ||X θ - y||² over θ >= 0, given X'X (..., s, s) and X'y (..., s), for a handful of unknowns
    and any number of problems at once: the optimum is the least-squares solution on its own set of free
    unknowns, so solve on every set and keep the best feasible one (pinv: a zero column gets zero).
    Sets grow in size, and a larger one must improve the fit by more than rounding (ROUNDING), or
    noise would turn an absent term into a tiny positive one (a peak of 1e30 FLOP/s)."""
    size = moment.shape[-1]
    best, best_value = np.zeros(moment.shape), np.zeros(moment.shape[:-1])  # θ = 0; value = ||Xθ-y||² - ||y||²
    for count in range(1, size + 1):
        for free in map(list, itertools.combinations(range(size), count)):
            theta = np.zeros(moment.shape)
            theta[..., free] = (np.linalg.pinv(gram[..., free, :][..., free]) @ moment[..., free, None])[..., 0]
            value = np.einsum("...i,...ij,...j->...", theta, gram, theta) - 2 * np.einsum(
                "...i,...i->...", moment, theta
            )
            better = (theta >= 0).all(axis=-1) & (value < best_value - ROUNDING * np.abs(best_value))
            best[better], best_value[better] = theta[better], value[better]
    return best


def _normal_equations_below(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """X'X and X'1 of the least squares X θ = 1 on rows [0, k), for every k = 0..n."""

    def sums_below(values: np.ndarray) -> np.ndarray:
        return np.concatenate([np.zeros((1, *values.shape[1:])), np.cumsum(values, axis=0)])

    return sums_below(rows[:, :, None] * rows[:, None, :]), sums_below(rows)


def _on_the_ridge(theta: np.ndarray, flops: np.ndarray, bytes_moved: np.ndarray) -> tuple[float, float, float]:
    """(1/P, 1/W, o) with a zero 1/P or 1/W (a side of the roofline the data never reach) replaced by
    the largest value that keeps every kernel with FLOPs where the fit put it, the most extreme one on
    the ridge."""
    inverse_peak, inverse_bandwidth, overhead = (float(v) for v in theta)
    does_flops = flops > 0
    if inverse_peak == 0 and inverse_bandwidth > 0:
        inverse_peak = float((bytes_moved[does_flops] * inverse_bandwidth / flops[does_flops]).min())
    elif inverse_bandwidth == 0 and inverse_peak > 0:
        inverse_bandwidth = float((flops[does_flops] * inverse_peak / bytes_moved[does_flops]).min())
    return inverse_peak, inverse_bandwidth, overhead


def _checked(fit: str, *named: tuple[str, object], minimum: int) -> list[np.ndarray]:
    """The ``named`` values as 1-D float arrays of one length >= ``minimum``, all finite, the last
    (the seconds) positive; a ValueError that names the fit and the array otherwise."""
    arrays = [np.asarray(values, dtype=float) for _, values in named]
    if any(a.ndim != 1 for a in arrays) or len({len(a) for a in arrays}) != 1:
        raise ValueError(f"{fit}: {', '.join(name for name, _ in named)} must be 1-D sequences of the same length")
    if len(arrays[0]) < minimum:
        raise ValueError(f"{fit}: needs at least {minimum} measurements, got {len(arrays[0])}")
    for (name, _), values in zip(named, arrays, strict=True):
        if not np.isfinite(values).all():
            raise ValueError(f"{fit}: {name} holds NaN or infinite values")
    if (arrays[-1] <= 0).any():
        raise ValueError(f"{fit}: every time must be > 0 seconds")
    return arrays
