"""The splitting heuristic's pieces: Louvain communities of the kernel graph, contiguous modules of a
community-keeping topological order, and the overlapping windows of improvement sweeps.
"""

from __future__ import annotations

from collections import defaultdict

from ..problem import Problem
from .louvain import louvain

LOUVAIN_SCALE = 10**6  # edge weights in millionths of the largest: integers for exact gains


def communities(problem: Problem, seed: int) -> dict[str, int]:
    """Kernel -> community id, by Louvain modularity on edges weighted by mean transfer time (in
    integer millionths of the largest, each edge at least 1: ``louvain`` compares gains exactly)."""
    graph, costs, devices = problem.graph, problem.costs, problem.platform.device_names
    pairs = [(a, b) for a in devices for b in devices if a != b] or [(devices[0], devices[0])]
    mean_s: dict[float, float] = {}  # by tensor size: O(sizes x devices^2), not O(edges x devices^2)
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    for edge in graph.edges:
        if edge.bytes not in mean_s:
            mean_s[edge.bytes] = sum(costs.transfer_s(edge.bytes, a, b) for a, b in pairs) / len(pairs)
        seconds[min(edge.src, edge.dst), max(edge.src, edge.dst)] += mean_s[edge.bytes]
    largest = max(seconds.values(), default=0.0) or 1.0
    weights = {pair: max(1, round(s / largest * LOUVAIN_SCALE)) for pair, s in seconds.items()}
    found = louvain(graph.topo_order, weights, seed)
    return {kernel: index for index, members in enumerate(found) for kernel in members}


def modules(problem: Problem, community: dict[str, int], module_size: int) -> list[list[str]]:
    """Contiguous pieces of a community-keeping topological order, at most ``module_size`` each."""
    graph = problem.graph
    indegree = {k: len(graph.pred[k]) for k in graph.kernels}
    ready: dict[int, list[str]] = defaultdict(list)
    for kernel in graph.topo_order:
        if indegree[kernel] == 0:
            ready[community[kernel]].append(kernel)
    pieces: list[list[str]] = []
    current: list[str] = []
    here = None
    while any(ready.values()):
        if here is None or not ready[here]:
            here = min((c for c, members in ready.items() if members), key=lambda c: graph.position[ready[c][0]])
        kernel = ready[here].pop(0)
        if current and (community[current[-1]] != here or len(current) >= module_size):
            pieces.append(current)
            current = []
        current.append(kernel)
        for edge in graph.succ[kernel]:
            indegree[edge.dst] -= 1
            if indegree[edge.dst] == 0:
                bucket = ready[community[edge.dst]]
                bucket.append(edge.dst)
                bucket.sort(key=graph.position.__getitem__)
    if current:
        pieces.append(current)
    return merge_small(pieces, module_size)


def merge_small(pieces: list[list[str]], module_size: int) -> list[list[str]]:
    """Neighbouring pieces merge while they fit: fewer, fuller windows see more of the trade-offs."""
    merged: list[list[str]] = []
    for piece in pieces:
        if merged and len(merged[-1]) + len(piece) <= module_size:
            merged[-1].extend(piece)
        else:
            merged.append(list(piece))
    return merged


def improvement_windows(kernels: int, size: int) -> list[tuple[int, int]]:
    """[first, last) spans of ``size`` along an order of ``kernels``, each overlapping the next by half."""
    step = max(size // 2, 1)
    firsts = list(range(0, max(kernels - size, 0) + 1, step))
    if firsts[-1] + size < kernels:
        firsts.append(kernels - size)
    return [(first, min(first + size, kernels)) for first in firsts]
