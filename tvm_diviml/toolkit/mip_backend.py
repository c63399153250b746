"""The MIP backend every exact model and LP bound shares: python-mip with HiGHS (or CBC), set up once;
and the error an exact solve raises when it ends with no plan.

HiGHS comes from highsbox: python-mip would first try highspy, whose library lacks the C API on some
builds and says so on every run.
"""

from __future__ import annotations

import logging
import math
import os

import mip

from ..errors import DivimlInputError
from ..problem import no_plan_exists
from ..tolerances import MIP_ABSOLUTE_GAP, MIP_RELATIVE_GAP

log = logging.getLogger(__name__)
BACKENDS = ("highs", "cbc")  # HiGHS first: 1.4-9x faster than CBC on our 16-20 kernel DAGs


def check_backend(backend: str) -> str:
    """``backend`` if python-mip can use it, else an error naming the choices."""
    if backend not in BACKENDS:
        raise DivimlInputError(
            f"unknown MILP backend '{backend}'", field="backend", hint=f"use one of {', '.join(BACKENDS)}"
        )
    return backend


def new_model(name: str, backend: str) -> mip.Model:
    """A quiet python-mip model (HiGHS from highsbox where present)."""
    check_backend(backend)
    if backend == "highs" and "PMIP_HIGHS_LIBRARY" not in os.environ:
        try:
            import highsbox

            library = os.path.join(highsbox.highs_dist_dir(), "lib", "libhighs.so")
            if os.path.exists(library):
                os.environ["PMIP_HIGHS_LIBRARY"] = library
        except ImportError:
            pass
    model = mip.Model(name, sense=mip.MINIMIZE, solver_name=backend.upper())
    model.verbose = 0
    return model


def optimized(model: mip.Model, **options) -> mip.OptimizationStatus:
    """``model.optimize(**options)``, again without presolve where HiGHS's presolve ends in an error:
    HiGHS 1.15 on an infeasible set partition of the stage recombination reported "MIP solver claims
    optimality, but with ... infeasibilities" and a solve error; without presolve it proves the
    partition infeasible. Every MIP solve goes through here; the LPs (the bounds' relaxations, the
    stage cover's LP) call the solver directly."""
    try:
        return model.optimize(**options)
    except mip.InterfacingError:
        if model.solver_name.upper() != "HIGHS":
            raise
        log.info("%s: HiGHS's presolve failed; solving again without it", model.name)
        model.solver._set_string_option_value("presolve", "off")
        return model.optimize(**options)


def prove_exactly(model: mip.Model, seed: int, threads: int = 1) -> None:
    """Seed and threads, and solve until the gap closes to the tolerances (not the solvers' defaults)."""
    model.seed, model.threads = seed, threads
    model.max_mip_gap, model.max_mip_gap_abs = MIP_RELATIVE_GAP, MIP_ABSOLUTE_GAP


def proven_bound(model: mip.Model, unit: float) -> float | None:
    """The solver's certified lower bound on the objective, in seconds (None before it has one)."""
    bound = model.objective_bound
    return None if bound is None or not math.isfinite(bound) else max(bound, 0.0) * unit


def nothing_found(status: mip.OptimizationStatus, method: str, heuristic: str) -> DivimlInputError:
    """The error for an exact solve with no plan and no incumbent: proven infeasible, or out of time."""
    if status == mip.OptimizationStatus.INFEASIBLE:
        return no_plan_exists(method)
    return DivimlInputError(
        f"the {method} found no plan within its time limit",
        field="time_limit",
        hint=f"raise --time-limit or use --solver {heuristic}",
    )
