"""What several suites share: timing a solve, geometric means, progress bars, row output, data paths."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from statistics import geometric_mean

from tqdm import tqdm

from ..errors import DivimlInputError
from ..simulator import simulate
from ..solvers import get_solver
from ..writes import write_text
from .suite import Row

# One logger for every suite, so that their warnings keep reading "tvm_diviml.bench: ...".
log = logging.getLogger("tvm_diviml.bench")

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The msr-fiddle data set (Archer et al., Tarnawski et al.), beside the repository when it is present.
MSR_FIDDLE_DIR = os.path.join(REPOSITORY, "..", "shared", "data", "msr-fiddle")


def best_time(action: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` runs: the least disturbed by whatever else the machine does."""
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - began)
    return best


def geomean(values: Iterable[float]) -> float | None:
    """The geometric mean of ratios (None for none), so that 2x better and 2x worse cancel out."""
    values = list(values)
    return geometric_mean(values) if values else None


def progress(items=None, *, desc: str, unit: str, total: int | None = None) -> tqdm:
    """A progress bar on stderr that disappears when done, leaving only the rows on stdout."""
    return tqdm(items, total=total, desc=desc, unit=unit, leave=False)


def timed_solve(name: str, problem, time_limit_s: float, notes: list[str], watch=None):
    """(plan with its simulated value, wall seconds), or (None, seconds) with a note in ``notes`` when
    the solver fails or its plan is infeasible (the latency and llm suites). ``watch``: an
    ``Incumbents`` the solver offers its plans to as they improve."""
    began = time.perf_counter()
    try:
        plan = get_solver(name, time_limit_s=time_limit_s).solve(problem, watch=watch)
    except DivimlInputError as error:
        notes.append(f"{name}: {error}")
        return None, time.perf_counter() - began
    except Exception as error:  # one broken solver must not end an hour-long run: note it, go on
        log.warning("%s failed on %s", name, problem.graph.name, exc_info=True)
        notes.append(f"{name} failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
        return None, time.perf_counter() - began
    seconds = time.perf_counter() - began
    sim = simulate(problem, plan)
    if not sim.feasible:
        notes.append(f"{name}: infeasible plan ({'; '.join(sim.problems[:1])})")
        return None, seconds
    plan.value_s = sim.value_s
    return plan, seconds


def row_line(row: Row) -> str:
    """A row as one line of ``key=value`` pairs (floats to 4 digits), as ``diviml bench`` prints it."""
    return "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items() if k != "suite")


def markdown_table(rows: list[Row]) -> str:
    """The rows as a Markdown table whose columns are the first row's keys."""
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in (row.get(k) for k in keys)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_markdown(rows: list[Row], path: str) -> None:
    """Write ``markdown_table(rows)`` to ``path``, whole or not at all; a file that cannot be written is bad
    input, not a crash."""
    write_text(path, markdown_table(rows) + "\n", "--markdown")
