"""Louvain modularity communities (Blondel et al. 2008) on integer weights, every gain compared exactly.

networkx 3.6.1's ``louvain_communities`` compares float gains, and round-off between two equal gains
can move one node back and forth forever: split's communities hung on a four-edge graph of weights
near 1e-3 (networkx PR #8757 fixes it, in no release available to pin). Here weights are integers and
a gain is compared as 2m x (weight to the community) - (the community's degree) x (the node's degree),
the modularity gain times 2m², so every comparison is exact, each move strictly raises modularity,
and the search ends.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Hashable, Iterable


def louvain(nodes: Iterable[Hashable], edges: dict[tuple[Hashable, Hashable], int], seed: int) -> list[set]:
    """Communities of an undirected graph with positive integer ``edges`` weights {(u, v): w}, each
    pair once. Nodes are visited in a seeded random order; a node moves only to a strictly better
    community, then communities become the nodes of the next level, until a level moves nothing."""
    rng = random.Random(seed)
    adjacency: dict[Hashable, dict[Hashable, int]] = {u: {} for u in nodes}
    for (u, v), weight in edges.items():
        adjacency[u][v] = adjacency[u].get(v, 0) + weight
        if u != v:
            adjacency[v][u] = adjacency[v].get(u, 0) + weight
    members = {u: {u} for u in adjacency}
    twice_m = sum(_degree(adjacency, u) for u in adjacency)
    if twice_m == 0:
        return [set(m) for m in members.values()]
    while True:
        community = _one_level(adjacency, twice_m, rng)
        if all(community[u] == u for u in adjacency):
            return [set(m) for m in members.values()]
        merged: dict[Hashable, dict[Hashable, int]] = defaultdict(dict)
        grouped: dict[Hashable, set] = defaultdict(set)
        for u, neighbours in adjacency.items():
            grouped[community[u]] |= members[u]
            for v, weight in neighbours.items():
                a, b = community[u], community[v]
                # each pair of distinct nodes appears twice in an adjacency; a self-loop once
                merged[a][b] = merged[a].get(b, 0) + (weight if u != v else 2 * weight)
        adjacency = {c: {d: (w if c != d else w // 2) for d, w in merged[c].items()} for c in grouped}
        members = dict(grouped)


def _degree(adjacency: dict, u: Hashable) -> int:
    """The weighted degree, a self-loop counted twice (as networkx does)."""
    return sum(w if v != u else 2 * w for v, w in adjacency[u].items())


def _one_level(adjacency: dict[Hashable, dict[Hashable, int]], twice_m: int, rng: random.Random) -> dict:
    """Node -> its community (named by one of its nodes) after moving nodes while any move helps."""
    degree = {u: _degree(adjacency, u) for u in adjacency}
    community = {u: u for u in adjacency}
    total = dict(degree)  # a community's summed degree
    order = list(adjacency)
    rng.shuffle(order)
    moved = True
    while moved:
        moved = False
        for u in order:
            home = community[u]
            to_community: dict[Hashable, int] = {}
            for v, weight in adjacency[u].items():
                if v != u:
                    to_community[community[v]] = to_community.get(community[v], 0) + weight
            total[home] -= degree[u]
            best, best_gain = home, twice_m * to_community.get(home, 0) - total[home] * degree[u]
            for target, weight in to_community.items():
                gain = twice_m * weight - total[target] * degree[u]
                if gain > best_gain:
                    best, best_gain = target, gain
            total[best] += degree[u]
            if best != home:
                community[u], moved = best, True
    return community
