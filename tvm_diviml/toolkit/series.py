"""Series decomposition of a kernel graph: the cut kernels that every path from the model's inputs to
its outputs passes through, in order, and the blocks of kernels between them.

A cut kernel separates the latency problem exactly: everything before it is its ancestor and must
finish (its tensors sent) before it starts, everything after it is its descendant and starts after it
ends. So one inference's makespan is a sum of segment times, each depending only on the devices of
the cut kernels at its two ends (docs/solvers.md#series-decomposition).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from ..graph import OpGraph

SOURCE, SINK = ("series", "source"), ("series", "sink")  # virtual ends: tuples never clash with kernel names


@dataclass(frozen=True)
class Series:
    cuts: list[str]  # the cut kernels, first to last
    blocks: list[list[str]]  # len(cuts) + 1 blocks (before the first cut, between cuts, after the last)

    def segment(self, index: int) -> list[str]:
        """Segment ``index`` in topological order: block ``index`` and the cut that ends it (the last
        segment has no cut at its end)."""
        return self.blocks[index] + ([self.cuts[index]] if index < len(self.cuts) else [])


def series_decomposition(graph: OpGraph) -> Series:
    """The cut kernels (the dominators of the outputs, seen from the inputs) and the blocks between."""
    flow = nx.DiGraph()
    flow.add_nodes_from([SOURCE, SINK, *graph.kernels])
    flow.add_edges_from((e.src, e.dst) for e in graph.edges)
    readers = {k for graph_input in graph.inputs for k in graph_input.consumers}
    for kernel in graph.kernels:
        if kernel in readers or not graph.pred[kernel]:
            flow.add_edge(SOURCE, kernel)
        if kernel in graph.output_set or not graph.succ[kernel]:
            flow.add_edge(kernel, SINK)
    dominators = nx.immediate_dominators(flow, SOURCE)
    chain, node = [], dominators[SINK]
    while node != SOURCE:
        chain.append(node)
        node = dominators[node]
    cuts = list(reversed(chain))
    is_cut = set(cuts)
    blocks: list[list[str]] = [[] for _ in range(len(cuts) + 1)]
    passed = 0
    for kernel in graph.topo_order:  # an ancestor of a cut comes before it in any topological order
        if kernel in is_cut:
            passed += 1
        else:
            blocks[passed].append(kernel)
    return Series(cuts, blocks)
