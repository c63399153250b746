"""Placement solvers: one module per method, all behind ``Solver.solve(Problem) -> Plan``."""
from __future__ import annotations

from ..errors import DivimlInputError
from .base import Problem, Solver, mode_for
from .cpsat import Cpsat
from .list_scheduling import Greedy, Heft
from .milp import Milp
from .single_device import FastestSingleDevice
from .slicegraph import SliceGraph
from .split import Split

SOLVERS: dict[str, type[Solver]] = {cls.name: cls for cls in (FastestSingleDevice, Milp, Greedy, Heft, Split,
                                                                    Cpsat, SliceGraph)}


def get_solver(name: str, **options) -> Solver:
    try:
        return SOLVERS[name](**options)
    except KeyError:
        raise DivimlInputError(f"unknown solver '{name}'", field="solver",
                               hint=f"available: {', '.join(SOLVERS)}") from None


__all__ = ["Problem", "Solver", "SOLVERS", "get_solver", "mode_for"]
