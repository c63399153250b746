"""Roofline and link fits recover the figures that generated their data."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.cost.fit import fit_link, fit_roofline

from ..helpers import examples

PEAK, BANDWIDTH, OVERHEAD = 2e11, 5e10, 4e-6  # ridge at 4 FLOP/byte


def kernels(seed: int, compute_bound: int, memory_bound: int, copies: int = 0, peak=PEAK, bandwidth=BANDWIDTH):
    """FLOPs, bytes and the truth (compute-bound or not) of kernels at least 2x off the ridge, whose
    binding term takes 1 us to 10 ms; ``copies`` of them (memory-bound) do no FLOPs."""
    rng = np.random.default_rng(seed)
    n = compute_bound + memory_bound
    ridge = peak / bandwidth
    away = 10 ** rng.uniform(0.3, 2.0, n)
    intensity = np.where(np.arange(n) < compute_bound, ridge * away, ridge / away)
    intensity[n - copies :] = 0.0
    work_s = 10 ** rng.uniform(-6, -2, n)
    is_compute = np.arange(n) < compute_bound
    bytes_moved = work_s * bandwidth
    bytes_moved[is_compute] = work_s[is_compute] * peak / intensity[is_compute]
    return intensity * bytes_moved, bytes_moved, is_compute


def roofline_s(flops, bytes_moved, peak=PEAK, bandwidth=BANDWIDTH, overhead=OVERHEAD):
    return np.maximum(flops / peak, bytes_moved / bandwidth) + overhead


def test_roofline_recovers_noise_free_figures_exactly():
    flops, bytes_moved, is_compute = kernels(0, 12, 12, copies=3)
    fit = fit_roofline(flops, bytes_moved, roofline_s(flops, bytes_moved))
    assert fit.peak_flops == pytest.approx(PEAK, rel=1e-9)
    assert fit.bandwidth_Bps == pytest.approx(BANDWIDTH, rel=1e-9)
    assert fit.overhead_s == pytest.approx(OVERHEAD, rel=1e-9)
    assert fit.median_rel_error < 1e-12 and fit.p90_rel_error < 1e-12
    assert fit.compute_bound.dtype == bool and (fit.compute_bound == is_compute).all()


@pytest.mark.parametrize("noise", [0.01, 0.02])
@pytest.mark.parametrize("seed", range(5))
def test_roofline_recovers_figures_under_noise(seed, noise):
    """Multiplicative noise of 1-2%: 10 ms kernels carry 100-200 us of noise, 25-50x the overhead, so
    the overhead is recovered only because the fit weighs relative error and small kernels count."""
    flops, bytes_moved, is_compute = kernels(seed, 30, 30, copies=5)
    rng = np.random.default_rng(100 + seed)
    seconds = roofline_s(flops, bytes_moved) * (1 + noise * rng.standard_normal(len(flops)))
    fit = fit_roofline(flops, bytes_moved, seconds)
    assert fit.peak_flops == pytest.approx(PEAK, rel=noise)
    assert fit.bandwidth_Bps == pytest.approx(BANDWIDTH, rel=noise)
    assert fit.overhead_s == pytest.approx(OVERHEAD, rel=2 * noise)
    assert fit.median_rel_error < 1.5 * noise and fit.p90_rel_error < 3 * noise
    assert (fit.compute_bound == is_compute).all()


@settings(max_examples=examples(60), deadline=None)
@given(
    peak=st.floats(1e9, 1e14),
    bandwidth=st.floats(1e8, 1e12),
    overhead=st.sampled_from([0.0, 1e-7, 3e-6, 1e-4]),
    compute_bound=st.integers(2, 10),
    memory_bound=st.integers(2, 10),
    seed=st.integers(0, 2**32 - 1),
)
def test_roofline_recovers_any_figures_exactly(peak, bandwidth, overhead, compute_bound, memory_bound, seed):
    """Two kernels a side at least: three kernels fit three unknowns exactly under more than one
    classification, so they cannot tell which figures made them."""
    flops, bytes_moved, is_compute = kernels(seed, compute_bound, memory_bound, peak=peak, bandwidth=bandwidth)
    seconds = roofline_s(flops, bytes_moved, peak, bandwidth, overhead)
    fit = fit_roofline(flops, bytes_moved, seconds)
    assert fit.peak_flops == pytest.approx(peak, rel=1e-6)
    assert fit.bandwidth_Bps == pytest.approx(bandwidth, rel=1e-6)
    assert fit.overhead_s == pytest.approx(overhead, rel=1e-6, abs=1e-9 * seconds.min())
    assert (fit.compute_bound == is_compute).all()


def test_all_memory_bound_sets_the_peak_to_the_ridge_bound():
    """The data show no compute-bound kernel, so they bound the peak only from below: the fit takes
    that bound (the most intense kernel on the ridge) and every prediction stays exact."""
    flops, bytes_moved, _ = kernels(1, 0, 10, copies=2)
    fit = fit_roofline(flops, bytes_moved, roofline_s(flops, bytes_moved))
    assert fit.bandwidth_Bps == pytest.approx(BANDWIDTH, rel=1e-9)
    assert fit.overhead_s == pytest.approx(OVERHEAD, rel=1e-9)
    assert fit.peak_flops == pytest.approx((flops / (bytes_moved / BANDWIDTH)).max(), rel=1e-9)
    assert fit.peak_flops < PEAK and fit.median_rel_error < 1e-12 and fit.compute_bound.sum() <= 1


def test_all_compute_bound_sets_the_bandwidth_to_the_ridge_bound():
    flops, bytes_moved, _ = kernels(2, 10, 0)
    fit = fit_roofline(flops, bytes_moved, roofline_s(flops, bytes_moved))
    assert fit.peak_flops == pytest.approx(PEAK, rel=1e-9)
    assert fit.overhead_s == pytest.approx(OVERHEAD, rel=1e-9)
    assert fit.bandwidth_Bps == pytest.approx((bytes_moved / (flops / PEAK)).max(), rel=1e-9)
    assert fit.bandwidth_Bps < BANDWIDTH and fit.median_rel_error < 1e-12 and fit.compute_bound.sum() >= 9


SIZES = np.array([1 << 10, 4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 32 << 20, 128 << 20], dtype=float)


@settings(max_examples=examples(60), deadline=None)
@given(latency=st.sampled_from([0.0, 1e-6, 8e-6, 1e-3]), bandwidth=st.floats(1e8, 1e12))
def test_link_recovers_noise_free_figures_exactly(latency, bandwidth):
    fit = fit_link(SIZES, latency + SIZES / bandwidth)
    assert fit.latency_s == pytest.approx(latency, rel=1e-9, abs=1e-15)
    assert fit.bandwidth_Bps == pytest.approx(bandwidth, rel=1e-9)
    assert fit.max_rel_error < 1e-12


@pytest.mark.parametrize("latency", [0.0, 8e-6])
@pytest.mark.parametrize("seed", range(5))
def test_link_recovers_figures_under_noise(seed, latency):
    """A link without latency gets latency 0, never a negative one, whatever the noise."""
    rng = np.random.default_rng(seed)
    seconds = (latency + SIZES / 1.2e10) * (1 + 0.01 * rng.standard_normal(len(SIZES)))
    fit = fit_link(SIZES, seconds)
    assert fit.latency_s >= 0 and fit.latency_s == pytest.approx(latency, abs=0.05 * 8e-6)
    assert fit.bandwidth_Bps == pytest.approx(1.2e10, rel=0.02)
    assert fit.max_rel_error < 0.05


@pytest.mark.parametrize(
    "args, match",
    [
        (([1e6, 1e7], [1e5, 1e5], [1e-3, 1e-2]), "at least 3"),
        (([1e6, 1e7, 1e8], [1e5, 1e5], [1e-3, 1e-2, 1e-1]), "same length"),
        (([1e6, np.nan, 1e8], [1e5, 1e5, 1e5], [1e-3, 1e-2, 1e-1]), "flops holds NaN"),
        (([1e6, 1e7, 1e8], [1e5, 1e5, 1e5], [1e-3, np.inf, 1e-1]), "seconds holds NaN or infinite"),
        (([1e6, 1e7, 1e8], [1e5, 1e5, 1e5], [1e-3, 0.0, 1e-1]), "> 0 seconds"),
        (([1e6, 1e7, 1e8], [1e5, 1e5, 1e5], [1e-3, -1e-2, 1e-1]), "> 0 seconds"),
        (([1e6, -1e7, 1e8], [1e5, 1e5, 1e5], [1e-3, 1e-2, 1e-1]), "flops must be >= 0"),
        (([1e6, 1e7, 1e8], [1e5, 0.0, 1e5], [1e-3, 1e-2, 1e-1]), "bytes_moved > 0"),
        (([0.0, 0.0, 0.0], [1e5, 1e6, 1e7], [1e-3, 1e-2, 1e-1]), "no kernel does FLOPs"),
        (([1e6, 1e7, 1e8], [1e5, 1e6, 1e5], [1e-3, 1e-3, 1e-3]), "do not grow"),
    ],
)
def test_roofline_rejects_what_it_cannot_fit(args, match):
    with pytest.raises(ValueError, match=match):
        fit_roofline(*args)


@pytest.mark.parametrize(
    "args, match",
    [
        (([1e6], [1e-3]), "at least 2"),
        (([1e6, 1e6, 1e6], [1e-3, 1.1e-3, 0.9e-3]), "2 different sizes"),
        (([1e3, np.nan], [1e-3, 1e-2]), "nbytes holds NaN"),
        (([1e3, 1e6], [1e-3, 0.0]), "> 0 seconds"),
        (([-1e3, 1e6], [1e-3, 1e-2]), "nbytes must be >= 0"),
        (([[1e3, 1e6]], [[1e-3, 1e-2]]), "1-D"),
        (([1e3, 1e5, 1e7], [1e-3, 1e-3, 1e-3]), "do not grow with size"),
        (([1e3, 1e5, 1e7], [3e-3, 2e-3, 1e-3]), "do not grow with size"),
    ],
)
def test_link_rejects_what_it_cannot_fit(args, match):
    with pytest.raises(ValueError, match=match):
        fit_link(*args)
