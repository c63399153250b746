"""Windows of a latency plan solved in turn: kernels fixed where and when a plan runs them (a
``Context``), the least work after each window kernel (its tails), and ``WindowSolver``, which solves
one window after another by CP-SAT or the latency MILP within one deadline. Split's modules and
improvement sweeps are built from these (docs/solvers.md#split).
"""

from __future__ import annotations

import logging

from ..errors import DivimlInputError
from ..plan import Plan
from ..problem import Problem
from .cpsat_session import CpsatSession
from .deadline import Deadline
from .latency_model import LatencyModel
from .windows import Context, WindowSolution, reachability

log = logging.getLogger(__name__)


def bottom_levels(problem: Problem) -> dict[str, float]:
    """Per kernel: the longest path from it to the end, at fastest-device times, communication free."""
    graph, level = problem.graph, {}
    for kernel in reversed(graph.topo_order):
        fastest = min(problem.costs.compute_s(kernel, d) for d in problem.feasible_devices(kernel))
        level[kernel] = fastest + max((level[e.dst] for e in graph.succ[kernel]), default=0.0)
    return level


def window_tails(problem: Problem, window: list[str], bottom: dict[str, float]) -> dict[str, float]:
    """Per window kernel: the least work that must follow it outside the window."""
    inside = set(window)
    return {k: max((bottom[e.dst] for e in problem.graph.succ[k] if e.dst not in inside), default=0.0) for k in window}


def by_start(graph, kernels: list[str], start_s: dict[str, float]) -> list[str]:
    """``kernels`` in the order a schedule ran them (ties by position): a topological order, and the
    order in which a list schedule of that schedule's devices comes closest to it."""
    return sorted(kernels, key=lambda k: (start_s[k], graph.position[k]))


def fixed_context(
    problem: Problem, assignment: dict[str, str], start_s: dict[str, float], finish_s: dict[str, float], kernels
) -> tuple[Context, dict[str, float]]:
    """``kernels`` fixed where and when they run: a Context (each device ready after its last one)
    and their start times (their busy intervals, for the cpsat backend)."""
    context = Context({k: assignment[k] for k in kernels}, {k: finish_s[k] for k in kernels})
    for kernel in kernels:
        device = assignment[kernel]
        context.device_ready_s[device] = max(context.device_ready_s.get(device, 0.0), finish_s[kernel])
    return context, {k: start_s[k] for k in kernels}


class WindowSolver:
    """Solves the windows of one run (split's modules and sweeps) with one backend: CP-SAT in
    ``session``, or the latency MILP (highs, cbc); each window gets at most its share of the window
    time limit and an even share of the time left before ``deadline``."""

    def __init__(
        self,
        problem: Problem,
        backend: str,
        session: CpsatSession | None,
        *,
        deadline: Deadline,
        window_time_limit_s: float,
        seed: int,
    ):
        self.problem, self.backend, self.session = problem, backend, session
        self.deadline, self.window_time_limit_s, self.seed = deadline, window_time_limit_s, seed
        self.descendants = reachability(problem) if backend != "cpsat" else None
        self.solved = self.proven = 0

    def solve(
        self,
        window: list[str],
        context: Context,
        fixed_start_s: dict[str, float],
        tail: dict[str, float | dict[str, float]],
        hint: WindowSolution,
        windows_left: int,
        share: float = 1.0,
    ) -> WindowSolution | None:
        """The window's best schedule found, or None (no time left, or the backend found none), in at
        most ``share`` of the window time limit and an even share of the time left."""
        remaining = self.deadline.left()
        if remaining <= 0:
            return None
        limit = min(share * self.window_time_limit_s, remaining / max(windows_left, 1))
        try:
            if self.session is not None:
                solution = self.session.solve_window(
                    self.problem,
                    window,
                    context,
                    fixed_start_s=fixed_start_s,
                    tail_s=tail,
                    hint=hint,
                    until=self.deadline.within(limit),
                    deadline=self.deadline,
                )
            else:
                model = LatencyModel(
                    self.problem,
                    window,
                    context,
                    backend=self.backend,
                    descendants=self.descendants,
                    upper_bound_s=hint.objective_s,
                    tie_break=True,
                    tail_s=tail,
                    build_by=self.deadline,
                )
                model.warm_start(hint.assignment, hint.start_s, hint.objective_s)
                solution = model.solve(self.deadline.within(limit), seed=self.seed)
        except DivimlInputError as error:  # e.g. a co-location group left without a device; OutOfTime
            log.debug("windows: window of %d kernels skipped: %s", len(window), error)
            return None
        self.solved += 1
        self.proven += bool(solution is not None and solution.optimal)
        return solution

    @property
    def sees_gaps(self) -> bool:
        """Whether window kernels may run in gaps between fixed ones (then order by start alone)."""
        return self.session is not None


def plan_tails(problem: Problem, plan: Plan, sim, window: list[str], after: list[str]) -> dict[str, dict[str, float]]:
    """Per window kernel and device it may run on: the least time from its end to the plan's end,
    when the kernels ``after`` the window keep their devices and run order. A successor s costs
    the transfer to it plus q(s), the longest path from s's start to the end through its graph
    successors, the next kernel on its device and its output's trip home; on a device, a window
    kernel also precedes the first kernel of ``after`` there."""
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    where = plan.assignment
    later = set(after)
    ordered = by_start(graph, after, sim.start_s)
    next_on: dict[str, str] = {}
    first_on: dict[str, str] = {}
    for kernel in reversed(ordered):
        device = where[kernel]
        if device in first_on:
            next_on[kernel] = first_on[device]
        first_on[device] = kernel
    q: dict[str, float] = {}
    for kernel in reversed(ordered):  # successors and device successors start later
        device = where[kernel]
        out = graph.kernels[kernel].output_bytes
        home = costs.transfer_s(out, device, host) if kernel in graph.output_set and out > 0 and device != host else 0.0
        q[kernel] = costs.compute_s(kernel, device) + max(
            [
                home,
                q.get(next_on.get(kernel), 0.0),
                *(
                    q[e.dst] + (costs.transfer_s(e.bytes, device, where[e.dst]) if where[e.dst] != device else 0.0)
                    for e in graph.succ[kernel]
                    if e.dst in later
                ),
            ]
        )
    out: dict[str, dict[str, float]] = {}
    for kernel in window:
        out[kernel] = {}
        for device in problem.feasible_devices(kernel):
            out[kernel][device] = max(
                [
                    q[first_on[device]] if device in first_on else 0.0,
                    *(
                        q[e.dst] + (costs.transfer_s(e.bytes, device, where[e.dst]) if where[e.dst] != device else 0.0)
                        for e in graph.succ[kernel]
                        if e.dst in later
                    ),
                ]
            )
    return out
