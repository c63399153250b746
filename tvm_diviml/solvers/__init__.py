"""Placement solvers: one module per method, all behind ``Solver.solve(Problem) -> Plan``."""
from __future__ import annotations

from ..errors import DivimlInputError
from .base import Problem, Solver, mode_for
from .cpsat import Cpsat
from .downsets import Downsets
from .list_scheduling import Greedy, Heft
from .milp import Milp
from .single_device import FastestSingleDevice
from .slicegraph import SliceGraph
from .split import Split
from .symmetric import Symmetric
from .throughput import Replicas

SOLVERS: dict[str, type[Solver]] = {cls.name: cls for cls in (FastestSingleDevice, Milp, Greedy, Heft, Split,
                                                                    Cpsat, SliceGraph, Replicas, Downsets, Symmetric)}


def get_solver(name: str, **options) -> Solver:
    try:
        return SOLVERS[name](**options)
    except KeyError:
        raise DivimlInputError(f"unknown solver '{name}'", field="solver",
                               hint=f"available: {', '.join(SOLVERS)}") from None


def default_solver(problem: Problem) -> str:
    """What ``--solver auto`` runs: on several servers the symmetric solver (it falls back to the
    whole graph by itself when the model has no repeated blocks), else ``full_graph_solver``."""
    servers = problem.platform.servers
    if len(servers) > 1 and problem.objective in Symmetric.objectives and problem.mode != "host_staged":
        return "symmetric"
    return full_graph_solver(problem)


def full_graph_solver(problem: Problem) -> str:
    """The strongest general method for the objective and cost mode, over the whole graph."""
    if problem.objective == "pipeline":
        return "slicegraph"
    if problem.mode == "host_staged":
        return "downsets"
    # Throughput's MILP has no ordering variables: it proved 120 kernels optimal in seconds, faster than split.
    return "milp" if problem.objective == "throughput" else "split"


__all__ = ["SOLVERS", "Problem", "Solver", "default_solver", "full_graph_solver", "get_solver", "mode_for"]
