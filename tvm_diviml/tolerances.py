"""Numerical tolerances, named once: what a solver's own tolerances may shift, how much better a
plan must be to count as better, and how far a build's outputs may stray from a reference build's.

MIP solvers work to absolute feasibility tolerances of about 1e-7, so every model counts time in units
near its kernels' times, and every claim built from a solver's numbers is checked against the simulator
within these slacks. Outputs are compared in one place (``compare_outputs``), by their dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIP_RELATIVE_GAP = 1e-9  # exact solves stop once the incumbent is this close to the bound (relative)
MIP_ABSOLUTE_GAP = 1e-12  # ... or this close in the model's own time unit
SOLVER_SLACK = 1e-6  # relative: what a solver's tolerance may take off a bound or add to a claim
ABSOLUTE_SLACK = 1e-12  # seconds: the same, for values near zero
MEETS = 1e-9  # relative: a value this close to a bound meets it; a plan must beat another by this
TIE_BREAK = 1e-3  # weight of a secondary objective beside the primary one (per term, averaged)
PIPELINE_AGREEMENT = 1e-5  # relative: a simulated pipeline this close to the MIP's optimum is that optimum


def within_slack(value: float, claim: float) -> bool:
    """Whether a simulated ``value`` agrees with a solver's ``claim``, up to the solver's tolerance."""
    return value <= claim * (1 + SOLVER_SLACK) + ABSOLUTE_SLACK


def improves(value: float, incumbent: float) -> bool:
    """Whether ``value`` beats ``incumbent`` by more than rounding."""
    return value < incumbent * (1 - MEETS)


def meets(value: float, bound: float) -> bool:
    """Whether ``value`` reaches the lower ``bound`` (so it is optimal)."""
    return value <= bound * (1 + MEETS)


# Outputs against a reference build of the same program: kernels scheduled and placed otherwise sum in
# another order. float32 outputs stay within 1e-4 of the reference, relative to the output's largest
# magnitude; a coarser float gets OUTPUT_ULPS units in the last place at that magnitude instead
# (float16 9.8e-3, bfloat16 7.8e-2: an fp16 CNN's two builds differed by 1.7e-3, beyond 1e-4 though
# both were as accurate). Integers and booleans must be exact.
OUTPUT_RTOL = 1e-4
OUTPUT_ULPS = 10


def output_rtol(dtype) -> float:
    """The largest relative difference from its reference that an output of ``dtype`` may have."""
    dtype = np.dtype(dtype)
    if dtype.kind in "biu":
        return 0.0
    return max(OUTPUT_RTOL, OUTPUT_ULPS * float(np.finfo(dtype).eps))


@dataclass(frozen=True)
class OutputDifference:
    """One output against its reference. NaN where the reference has NaN, and an infinity where it has
    the same one, are equal; every other place where either is NaN or infinite is ``misplaced``."""

    dtype: str  # the reference's
    abs_diff: float  # the largest |got - want| where both hold finite numbers
    rel_diff: float  # abs_diff over the reference's largest finite magnitude (abs_diff where that is 0)
    misplaced: int
    same_nonfinite: int  # places where both hold NaN, or the same infinity

    def rtol(self, override: float | None = None) -> float:
        return output_rtol(self.dtype) if override is None else override

    def equal(self, rtol: float | None = None) -> bool:
        return not self.misplaced and self.rel_diff <= self.rtol(rtol)


@dataclass(frozen=True)
class OutputComparison:
    """A build's outputs against a reference's; ``rtol`` (None: each output's dtype decides) judges them."""

    outputs: tuple[OutputDifference, ...]

    @property
    def max_abs_diff(self) -> float:
        return max((o.abs_diff for o in self.outputs), default=0.0)

    @property
    def max_rel_diff(self) -> float:
        """The largest relative difference, infinite where NaN or an infinity is misplaced."""
        return math.inf if self.misplaced else self.finite_rel_diff

    @property
    def finite_rel_diff(self) -> float:
        """The largest relative difference where both hold finite numbers."""
        return max((o.rel_diff for o in self.outputs), default=0.0)

    @property
    def misplaced(self) -> int:
        return sum(o.misplaced for o in self.outputs)

    def equal(self, rtol: float | None = None) -> bool:
        return all(o.equal(rtol) for o in self.outputs)

    def describe(self, rtol: float | None = None) -> str:
        """The differences, the tolerance applied and the verdict, in one line."""
        if rtol is not None:
            tolerance = f"rtol {rtol:.3g}, as given"
        else:
            by_dtype = {o.dtype: o.rtol() for o in self.outputs}
            tolerance = ", ".join(f"rtol {t:.3g} for {d}" if t else f"exact for {d}" for d, t in by_dtype.items())
        same = sum(o.same_nonfinite for o in self.outputs)
        beyond = [o for o in self.outputs if o.rel_diff > o.rtol(rtol)]
        if self.misplaced:
            verdict = f"DIFFERENT (NaN or infinity unmatched at {self.misplaced} places)"
        elif beyond:
            verdict = f"DIFFERENT (beyond rtol {beyond[0].rtol(rtol):.3g})"
        else:
            verdict = "equal" + (f" (NaN or infinity at the same {same} places in both)" if same else "")
        return (
            f"max abs diff {self.max_abs_diff:.3g}, max rel diff {self.finite_rel_diff:.3g} "
            f"({tolerance or 'no outputs'}): {verdict}"
        )


def compare_outputs(got: list[np.ndarray], want: list[np.ndarray]) -> OutputComparison:
    """``got`` against the reference ``want``, output by output (same count and shapes)."""
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} outputs, the reference has {len(want)}")
    return OutputComparison(tuple(_difference(np.asarray(g), np.asarray(w)) for g, w in zip(got, want, strict=True)))


def _difference(got: np.ndarray, want: np.ndarray) -> OutputDifference:
    if got.shape != want.shape:
        raise AssertionError(f"an output of shape {got.shape}, the reference's is {want.shape}")
    have, reference = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(have) & np.isfinite(reference)
    same = ~finite & ((have == reference) | (np.isnan(have) & np.isnan(reference)))
    abs_diff = float(np.max(np.abs(have[finite] - reference[finite]), initial=0.0))
    scale = float(np.max(np.abs(reference[np.isfinite(reference)]), initial=0.0))
    return OutputDifference(
        str(want.dtype),
        abs_diff,
        abs_diff / scale if scale > 0 else abs_diff,
        int(np.count_nonzero(~finite & ~same)),
        int(np.count_nonzero(same)),
    )
