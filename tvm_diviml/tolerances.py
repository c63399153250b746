"""Numerical tolerances, named once: what a solver's own tolerances may shift, and how much better a
plan must be to count as better.

MIP solvers work to absolute feasibility tolerances of about 1e-7, so every model counts time in units
near its kernels' times, and every claim built from a solver's numbers is checked against the simulator
within these slacks.
"""

from __future__ import annotations

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
