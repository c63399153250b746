"""split_segments: per-device runs of kernels whose graph (with each device's succession) is acyclic."""

import random
from itertools import pairwise

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.segments import segment_boundaries, segment_graph, split_segments

from ..helpers import examples, graph_of
from ..strategies import assignments, dag_problems


def random_topological_order(graph, rng):
    """Kahn's algorithm taking a random ready kernel each time."""
    indegree = {k: len(graph.pred[k]) for k in graph.kernels}
    ready = sorted(k for k, d in indegree.items() if d == 0)
    order = []
    while ready:
        kernel = ready.pop(rng.randrange(len(ready)))
        order.append(kernel)
        for edge in graph.succ[kernel]:
            indegree[edge.dst] -= 1
            if indegree[edge.dst] == 0:
                ready.append(edge.dst)
    return order


@st.composite
def placed_graphs(draw):
    graph, _, _ = draw(dag_problems(max_kernels=10))
    assignment = draw(assignments(graph))
    order = random_topological_order(graph, random.Random(draw(st.integers(0, 10**6))))
    return graph, assignment, order


def with_succession(graph, segments):
    """The segment graph plus an edge from each device's segment to its next one."""
    result = segment_graph(graph, segments)
    last = {}
    for seg in segments:
        if seg.device in last:
            result.add_edge(last[seg.device], seg.name)
        last[seg.device] = seg.name
    return result


@settings(max_examples=examples(100), deadline=None)
@given(placed_graphs())
def test_segments_partition_the_kernels_in_a_runnable_order(problem):
    graph, assignment, order = problem
    segments = split_segments(graph, assignment, order)
    listed = [k for seg in segments for k in seg.kernels]
    assert sorted(listed) == sorted(graph.kernels)
    for seg in segments:
        assert seg.name.isidentifier() and seg.kernels
        assert {assignment[k] for k in seg.kernels} == {seg.device}
    dependencies = with_succession(graph, segments)
    assert nx.is_directed_acyclic_graph(dependencies)
    position = {seg.name: i for i, seg in enumerate(segments)}
    assert all(position[s] < position[t] for s, t in dependencies.edges)
    for device in set(assignment.values()):
        concatenated = [k for seg in segments if seg.device == device for k in seg.kernels]
        assert concatenated == [k for k in order if assignment[k] == device]


@settings(max_examples=examples(100), deadline=None)
@given(placed_graphs())
def test_no_two_consecutive_segments_of_a_device_could_merge(problem):
    """The greedy closes a segment only when keeping it open would have made a cycle, or would have
    made it wait for a segment of another device that it did not wait for already."""
    graph, assignment, order = problem
    segments = split_segments(graph, assignment, order)
    dependencies = with_succession(graph, segments)
    reads = segment_graph(graph, segments)
    for device in set(assignment.values()):
        names = [seg.name for seg in segments if seg.device == device]
        for first, second in pairwise(names):
            merged = nx.contracted_nodes(dependencies, first, second, self_loops=False)
            waits_longer = set(reads.predecessors(second)) - {first} - set(reads.predecessors(first))
            assert waits_longer or not nx.is_directed_acyclic_graph(merged)


@settings(max_examples=examples(100), deadline=None)
@given(placed_graphs())
def test_boundaries_are_exactly_the_tensors_that_cross(problem):
    graph, assignment, order = problem
    segments = split_segments(graph, assignment, order)
    boundaries = segment_boundaries(graph, segments)
    segment_of = {k: seg.name for seg in segments for k in seg.kernels}
    for seg in segments:
        crossing_in = {e.src for e in graph.edges if segment_of[e.dst] == seg.name and segment_of[e.src] != seg.name}
        crossing_out = {e.src for e in graph.edges if segment_of[e.src] == seg.name and segment_of[e.dst] != seg.name}
        outputs = {k for k in seg.kernels if k in graph.output_set}
        model_inputs = {i.name for i in graph.inputs if set(i.consumers) & set(seg.kernels)}
        boundary = boundaries[seg.name]
        assert set(boundary.reads) == crossing_in and len(boundary.reads) == len(crossing_in)
        assert list(boundary.writes) == [k for k in seg.kernels if k in crossing_out | outputs]
        assert set(boundary.inputs) == model_inputs and len(boundary.inputs) == len(model_inputs)


def chain(devices):
    names = [f"k{i}" for i in range(len(devices))]
    graph = graph_of([(a, b, 1) for a, b in pairwise(names)], kernels=names)
    return graph, dict(zip(names, devices))


def test_chain_a_a_b_b_a_gives_three_segments():
    graph, assignment = chain(["a", "a", "b", "b", "a"])
    segments = split_segments(graph, assignment, graph.topo_order)
    assert [(s.device, s.kernels) for s in segments] == [("a", ("k0", "k1")), ("b", ("k2", "k3")), ("a", ("k4",))]
    assert [s.name for s in segments] == ["seg0_a", "seg1_b", "seg2_a"]


def test_one_device_gives_one_segment():
    graph, assignment = chain(["cpu:0"] * 4)
    segments = split_segments(graph, assignment, graph.topo_order)
    assert [(s.name, s.kernels) for s in segments] == [("seg0_cpu_0", ("k0", "k1", "k2", "k3"))]


FORK_JOIN = [("a", "b", 1), ("a", "c", 1), ("b", "e", 1), ("c", "e", 1)]


@pytest.mark.parametrize("order", [["a", "b", "c", "e"], ["a", "c", "b", "e"]])
def test_fork_join_with_the_join_beside_the_fork(order):
    """a, b, e on d1 and c on d2: e needs c, which needs {a, b}'s segment, so e opens a new one."""
    graph = graph_of(FORK_JOIN)
    assignment = {"a": "d1", "b": "d1", "c": "d2", "e": "d1"}
    segments = split_segments(graph, assignment, order)
    assert [(s.device, s.kernels) for s in segments] == [("d1", ("a", "b")), ("d2", ("c",)), ("d1", ("e",))]


def test_fork_join_with_the_fork_on_the_other_device():
    """a on d2 feeds b (d1) and c (d2); c stays with a and e stays with b: two segments suffice."""
    graph = graph_of(FORK_JOIN)
    assignment = {"a": "d2", "b": "d1", "c": "d2", "e": "d1"}
    segments = split_segments(graph, assignment, ["a", "b", "c", "e"])
    assert [(s.device, s.kernels) for s in segments] == [("d2", ("a", "c")), ("d1", ("b", "e"))]


@pytest.mark.parametrize(
    "order, message",
    [
        (["a", "b", "c"], "'e' is missing"),
        (["a", "b", "c", "e", "a"], "appears twice"),
        (["a", "b", "c", "e", "z"], "'z' is not a kernel"),
        (["a", "e", "b", "c"], "'e' comes before"),
    ],
)
def test_bad_run_order_is_refused(order, message):
    graph = graph_of(FORK_JOIN)
    assignment = dict.fromkeys("abce", "d1")
    with pytest.raises(DivimlInputError, match=message) as info:
        split_segments(graph, assignment, order)
    assert info.value.field == "run_order"


def test_incomplete_assignment_is_refused():
    graph = graph_of(FORK_JOIN)
    with pytest.raises(DivimlInputError, match="leaves kernel '.' unassigned") as info:
        split_segments(graph, {"a": "d1"}, graph.topo_order)
    assert info.value.field == "assignment"
