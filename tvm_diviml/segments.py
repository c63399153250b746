"""Cut a placed model's kernels into per-device segments that can run as separate functions.

A *segment* is a run of kernels on one device, called as one function. Every device runs its
segments one after another, and a segment starts only when the segments it reads from are done,
so the segments must form an acyclic graph *together with* each device's own succession
(segment k of a device before its segment k + 1); otherwise two devices would wait on each other.
A segment's function takes everything it reads when it is called, so a tensor from another device
that only a late kernel of the segment reads would hold back the kernels before it (one branch of a
fork-join would wait for the other branch before starting). Fewer segments mean fewer calls and
fewer synchronisations, so the split is greedy: a kernel joins its device's open segment unless that
would close a cycle, or would make the segment wait for another segment it did not wait for yet.
TVM-free on purpose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import networkx as nx

from .errors import DivimlInputError
from .graph import OpGraph
from .plan import Plan


@dataclass(frozen=True)
class Segment:
    """Kernels run back to back on one device, in run order; ``name`` is a valid identifier."""

    name: str
    device: str
    kernels: tuple[str, ...]


@dataclass(frozen=True)
class Boundary:
    """What a segment exchanges with the rest of the model.

    ``inputs``: model inputs it reads; ``reads``: kernels of other segments whose outputs it
    reads; ``writes``: its kernels whose outputs leave it (read by another segment, or a model
    output), in run order. These are the parameters and results of the segment's function.
    """

    inputs: tuple[str, ...]
    reads: tuple[str, ...]
    writes: tuple[str, ...]


def split_segments(graph: OpGraph, assignment: dict[str, str], run_order: list[str]) -> list[Segment]:
    """The segments of ``graph`` placed by ``assignment``, in a topological order of the segment graph.

    ``run_order`` is a topological order of all kernels (the order a latency plan starts them, or
    ``graph.topo_order``); each device's segments take its kernels in that order. Walking it, a
    kernel joins its device's open segment unless that segment already reaches the segment of
    one of the kernel's producers, which would make a cycle, or the kernel reads a segment of
    another device that the open segment does not read yet; then the device's open segment is
    closed and a new one opened. A fresh segment has no successors yet, so the graph stays
    acyclic throughout. A device's segments are ordered by the run order, and the executor runs
    whichever is ready, so a device never waits on its own later segment.
    """
    Plan(assignment).check(graph)
    _check_run_order(graph, run_order)
    members: list[list[str]] = []  # kernels of each segment, by creation index
    devices: list[str] = []
    segment_of: dict[str, int] = {}
    open_segment: dict[str, int] = {}
    dependencies = nx.DiGraph()  # segment creation indices, S -> T when T reads S
    for kernel in run_order:
        device = assignment[kernel]
        producers = {segment_of[edge.src] for edge in graph.pred[kernel]}
        current = open_segment.get(device)
        if (
            current is None
            or _would_cycle(dependencies, current, producers)
            or _would_wait_longer(dependencies, current, producers)
        ):
            segment = len(members)
            members.append([])
            devices.append(device)
            dependencies.add_node(segment)
            open_segment[device] = current = segment
        members[current].append(kernel)
        segment_of[kernel] = current
        dependencies.add_edges_from((producer, current) for producer in producers if producer != current)
    order = nx.lexicographical_topological_sort(dependencies)
    return [
        Segment(f"seg{position}_{_identifier(devices[index])}", devices[index], tuple(members[index]))
        for position, index in enumerate(order)
    ]


def segment_graph(graph: OpGraph, segments: list[Segment]) -> nx.DiGraph:
    """Segment names as nodes (attributes ``device``, ``kernels``); an edge S -> T when T reads S."""
    segment_of = {kernel: seg.name for seg in segments for kernel in seg.kernels}
    result = nx.DiGraph()
    for seg in segments:
        result.add_node(seg.name, device=seg.device, kernels=seg.kernels)
    result.add_edges_from(
        (segment_of[e.src], segment_of[e.dst]) for e in graph.edges if segment_of[e.src] != segment_of[e.dst]
    )
    return result


def segment_boundaries(graph: OpGraph, segments: list[Segment]) -> dict[str, Boundary]:
    """Per segment name, the model inputs and foreign kernels it reads and the kernels it hands on."""
    segment_of = {kernel: seg.name for seg in segments for kernel in seg.kernels}
    inputs_of: dict[str, list[str]] = {}
    for graph_input in graph.inputs:
        for consumer in graph_input.consumers:
            inputs_of.setdefault(consumer, []).append(graph_input.name)
    result = {}
    for seg in segments:
        inside = set(seg.kernels)
        inputs = [name for kernel in seg.kernels for name in inputs_of.get(kernel, ())]
        reads = [e.src for kernel in seg.kernels for e in graph.pred[kernel] if e.src not in inside]
        writes = [
            kernel
            for kernel in seg.kernels
            if kernel in graph.output_set or any(segment_of[e.dst] != seg.name for e in graph.succ[kernel])
        ]
        result[seg.name] = Boundary(tuple(dict.fromkeys(inputs)), tuple(dict.fromkeys(reads)), tuple(writes))
    return result


def _would_cycle(dependencies: nx.DiGraph, segment: int, producers: set[int]) -> bool:
    """Whether adding producer -> segment edges closes a cycle: the segment reaches a producer."""
    foreign = producers - {segment}
    return bool(foreign) and not foreign.isdisjoint(nx.descendants(dependencies, segment))


def _would_wait_longer(dependencies: nx.DiGraph, segment: int, producers: set[int]) -> bool:
    """Whether the kernel reads a segment that the open segment does not read yet (its function would
    then wait for that segment before running any of its kernels)."""
    return bool(producers - {segment} - set(dependencies.predecessors(segment)))


def _identifier(device: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]", "_", device)


def _check_run_order(graph: OpGraph, run_order: list[str]) -> None:
    position: dict[str, int] = {}
    for index, kernel in enumerate(run_order):
        if kernel not in graph.kernels:
            raise DivimlInputError(
                f"'{kernel}' is not a kernel of graph '{graph.name}'",
                field="run_order",
                hint="list the graph's kernels only",
            )
        if kernel in position:
            raise DivimlInputError(
                f"kernel '{kernel}' appears twice", field="run_order", hint="list every kernel exactly once"
            )
        position[kernel] = index
    if len(position) != len(graph):
        missing = next(k for k in graph.kernels if k not in position)
        raise DivimlInputError(
            f"kernel '{missing}' is missing ({len(graph) - len(position)} in all)",
            field="run_order",
            hint="list every kernel exactly once",
        )
    for edge in graph.edges:
        if position[edge.src] > position[edge.dst]:
            raise DivimlInputError(
                f"'{edge.dst}' comes before '{edge.src}', which it reads",
                field="run_order",
                hint="give a topological order, e.g. graph.topo_order",
            )
