"""Placement solvers: one module per registry name, all behind ``Solver.solve(Problem) -> Plan``,
loaded lazily (``catalog``); the methods they share live in ``tvm_diviml.toolkit``."""

from __future__ import annotations

from ..errors import DivimlInputError
from ..problem import Problem, mode_for
from .base import Solver
from .catalog import SOLVERS


def get_solver(name: str, **options) -> Solver:
    """A solver by registry name with its options."""
    if name not in SOLVERS:
        raise DivimlInputError(f"unknown solver '{name}'", field="solver", hint=f"available: {', '.join(SOLVERS)}")
    return SOLVERS[name](**options)


def default_solver(problem: Problem) -> str:
    """What ``--solver auto`` runs: on several servers the symmetric solver (it falls back to the
    whole graph by itself when the model has no repeated blocks), else ``full_graph_solver``."""
    servers = problem.platform.servers
    if len(servers) > 1 and problem.objective in SOLVERS["symmetric"].objectives and problem.mode != "host_staged":
        return "symmetric"
    return full_graph_solver(problem)


def full_graph_solver(problem: Problem) -> str:
    """The strongest general method for the objective and cost mode, over the whole graph."""
    if problem.objective == "pipeline" or problem.mode == "host_staged":  # SliceGraph where the ideals do not fit
        return "downsets"
    # Throughput's MILP has no ordering variables: it proved 120 kernels optimal in seconds, faster than split.
    return "milp" if problem.objective == "throughput" else "split"


__all__ = ["SOLVERS", "Problem", "Solver", "default_solver", "full_graph_solver", "get_solver", "mode_for"]
