"""The ``overlap_branching`` bound on one inference's makespan: ``overlap_load`` with the devices of a few
kernels enumerated.

Every plan puts kernel k on one of its devices, so the least, over those devices d, of ``overlap_load``
with k pinned to d bounds the makespan; pinned, k's successors start no earlier than its work and
transfer from d allow, and its predecessors must deliver to d, which the unpinned heads and tails (the
best device for each kernel on its own) miss. Pinning kernel after kernel makes a tree whose leaves
cover every plan: the lowest leaf is a bound. Best first: the lowest leaf is split on the kernel whose
pinning raises it most among ``CANDIDATES`` (those with the most descendants or ancestors first, whose
pinning moves the most heads or tails), until the deadline passes or every leaf reaches the known plan.
docs/solvers.md#bounds.
"""

from __future__ import annotations

import heapq
import itertools
import math

import networkx as nx

from ..problem import Problem
from ..toolkit.deadline import Deadline
from .latency import TransferTimes
from .overlap_load import PLACEMENTS, overlap_load_bound

CANDIDATES = 8  # kernels tried per split: three LPs each on three devices, 0.1 s each at 40 kernels


def overlap_branching_bound(problem: Problem, deadline: Deadline, root_s: float, upper_s: float = math.inf) -> float:
    """The lowest leaf of the tree grown until ``deadline`` (module docstring), from the unpinned
    ``overlap_load`` bound ``root_s``; leaves at ``upper_s`` (a known plan's makespan) or above are not
    split. Only ``root_s`` where no split raises it, or the graph is past ``PLACEMENTS``."""
    graph = problem.graph
    if len(graph.kernels) * len(problem.platform.devices) > PLACEMENTS or root_s <= 0:
        return root_s
    times = TransferTimes(problem)
    order = _branching_order(problem)
    tie = itertools.count()
    leaves: list[tuple[float, int, dict[str, str]]] = [(root_s, next(tie), {})]
    while not deadline.passed() and leaves[0][0] < upper_s:
        bound, _, pins = leaves[0]
        children = _best_split(problem, pins, order, times, deadline)
        if children is None or min(value for _, value in children) <= bound:
            break  # no split raises the lowest leaf: the tree stops growing here
        heapq.heappop(leaves)
        for child, value in children:
            heapq.heappush(leaves, (value, next(tie), child))
    return leaves[0][0]


def _branching_order(problem: Problem) -> list[str]:
    """Kernels by how many others their pinning can move (descendants or ancestors, the larger)."""
    graph = problem.graph.to_networkx()
    reach = {k: max(len(nx.descendants(graph, k)), len(nx.ancestors(graph, k))) for k in problem.graph.topo_order}
    return sorted(problem.graph.topo_order, key=lambda k: -reach[k])


def _best_split(
    problem: Problem, pins: dict[str, str], order: list[str], times: TransferTimes, deadline: Deadline
) -> list[tuple[dict[str, str], float]] | None:
    """Of the first ``CANDIDATES`` unpinned kernels of ``order`` that may run on several devices, the
    one whose least child is highest: its children (``pins`` plus it on each device) with their
    bounds. None where no kernel was tried in time."""
    best: list[tuple[dict[str, str], float]] | None = None
    tried = 0
    for kernel in order:
        devices = problem.feasible_devices(kernel)
        if kernel in pins or len(devices) < 2:
            continue
        if tried == CANDIDATES or deadline.passed():
            break
        tried += 1
        children = [
            (child, overlap_load_bound(problem, child, times)) for child in ({**pins, kernel: d} for d in devices)
        ]
        if best is None or min(v for _, v in children) > min(v for _, v in best):
            best = children
    return best
