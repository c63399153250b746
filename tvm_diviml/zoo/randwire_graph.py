"""Random stage graphs after Xie et al. 2019, "Exploring Randomly Wired Neural Networks".

Kept free of TVM so that graph properties can be tested (and the graphs inspected) without a compiler.
A generator draws an undirected graph with networkx; orienting every edge from the lower to the higher
node index makes it a DAG; one extra input node feeding every source and one extra output node fed by
every sink give each stage a single entry and a single exit.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

GENERATORS = ("ws", "er", "ba")


@dataclass(frozen=True)
class StageGraph:
    """A stage DAG. Nodes are numbered in topological order: the input node is 0, the random graph's
    nodes are 1..n (its node i is i + 1) and the output node is n + 1."""

    predecessors: tuple[tuple[int, ...], ...]  # predecessors[v], each sorted ascending

    @property
    def nodes(self) -> range:
        return range(len(self.predecessors))

    @property
    def input_node(self) -> int:
        return 0

    @property
    def output_node(self) -> int:
        return len(self.predecessors) - 1

    @property
    def edges(self) -> list[tuple[int, int]]:
        return [(u, v) for v, preds in enumerate(self.predecessors) for u in preds]

    @property
    def random_edges(self) -> list[tuple[int, int]]:
        """The generator's own edges, without those added to or from the input and output nodes."""
        return [(u, v) for u, v in self.edges if u != self.input_node and v != self.output_node]


def random_undirected_graph(
    generator: str, nodes: int, seed: int, *, k: int = 4, p: float | None = None, m: int = 5
) -> nx.Graph:
    """The paper's generators with its parameters: WS(k=4, p=0.75), ER(p=0.2), BA(m=5). ``p`` defaults
    per generator; ``m`` is capped at nodes - 1 so that small graphs stay valid."""
    if nodes < 1:
        raise ValueError(f"a random graph needs at least 1 node, got nodes={nodes}")
    if generator == "ws":
        p = 0.75 if p is None else p
        if k < 2 or k % 2:
            raise ValueError(f"Watts-Strogatz needs an even k >= 2 (k/2 neighbours on each side), got k={k}")
        if nodes <= k:
            raise ValueError(f"Watts-Strogatz needs nodes > k, got nodes={nodes}, k={k}")
        _check_probability(p)
        return nx.watts_strogatz_graph(nodes, k, p, seed=seed)
    if generator == "er":
        p = 0.2 if p is None else p
        _check_probability(p)
        return nx.erdos_renyi_graph(nodes, p, seed=seed)
    if generator == "ba":
        if nodes < 2:
            raise ValueError(f"Barabasi-Albert needs at least 2 nodes, got nodes={nodes}")
        m = min(m, nodes - 1)
        if m < 1:
            raise ValueError(f"Barabasi-Albert needs m >= 1, got m={m}")
        return nx.barabasi_albert_graph(nodes, m, seed=seed)
    raise ValueError(f"unknown random graph generator '{generator}' (choose from {', '.join(GENERATORS)})")


def stage_graph(generator: str, nodes: int, seed: int, **generator_options) -> StageGraph:
    """A random DAG with one input and one output node; the same arguments always give the same graph."""
    graph = random_undirected_graph(generator, nodes, seed, **generator_options)
    predecessors: list[list[int]] = [[] for _ in range(nodes + 2)]
    for u, v in graph.edges():
        low, high = sorted((u, v))
        predecessors[high + 1].append(low + 1)
    sources = [node for node in range(1, nodes + 1) if not predecessors[node]]
    for node in sources:
        predecessors[node].append(0)
    has_successor = {min(u, v) + 1 for u, v in graph.edges()}
    predecessors[nodes + 1] = [node for node in range(1, nodes + 1) if node not in has_successor]
    return StageGraph(tuple(tuple(sorted(preds)) for preds in predecessors))


def _check_probability(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"edge probability must lie in [0, 1], got p={p}")
