"""Random-wired stage graphs: determinism, DAG shape, and each generator's degree statistics."""

import statistics
import subprocess
import sys

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.zoo.randwire_graph import GENERATORS, random_undirected_graph, stage_graph

from ..helpers import examples

generators = st.sampled_from(GENERATORS)
node_counts = st.integers(5, 40)  # WS needs nodes > k = 4
seeds = st.integers(0, 2**31 - 1)


def as_digraph(graph):
    digraph = nx.DiGraph()
    digraph.add_nodes_from(graph.nodes)
    digraph.add_edges_from(graph.edges)
    return digraph


@settings(max_examples=examples(60), deadline=None)
@given(generator=generators, nodes=node_counts, seed=seeds)
def test_same_seed_gives_the_same_graph(generator, nodes, seed):
    assert stage_graph(generator, nodes, seed) == stage_graph(generator, nodes, seed)


@pytest.mark.parametrize("generator", GENERATORS)
def test_different_seeds_give_different_graphs(generator):
    graphs = {stage_graph(generator, 32, seed) for seed in range(10)}
    assert len(graphs) == 10


@settings(max_examples=examples(100), deadline=None)
@given(generator=generators, nodes=node_counts, seed=seeds)
def test_stage_graph_is_a_dag_with_one_source_and_one_sink_that_all_nodes_connect(generator, nodes, seed):
    graph = stage_graph(generator, nodes, seed)
    digraph = as_digraph(graph)
    assert list(graph.nodes) == list(range(nodes + 2))
    assert all(u < v for u, v in graph.edges), "node numbers must be a topological order"
    assert nx.is_directed_acyclic_graph(digraph)
    assert [v for v in graph.nodes if digraph.in_degree(v) == 0] == [graph.input_node]
    assert [v for v in graph.nodes if digraph.out_degree(v) == 0] == [graph.output_node]
    assert nx.descendants(digraph, graph.input_node) == set(graph.nodes) - {graph.input_node}
    assert nx.ancestors(digraph, graph.output_node) == set(graph.nodes) - {graph.output_node}
    assert all(list(preds) == sorted(set(preds)) for preds in graph.predecessors)


@settings(max_examples=examples(60), deadline=None)
@given(generator=generators, nodes=node_counts, seed=seeds)
def test_orientation_keeps_every_generated_edge_once(generator, nodes, seed):
    undirected = random_undirected_graph(generator, nodes, seed)
    expected = sorted(tuple(sorted((u + 1, v + 1))) for u, v in undirected.edges())
    assert sorted(stage_graph(generator, nodes, seed).random_edges) == expected


@settings(max_examples=examples(60), deadline=None)
@given(nodes=node_counts, seed=seeds)
def test_watts_strogatz_keeps_mean_degree_k(nodes, seed):
    edges = stage_graph("ws", nodes, seed).random_edges
    assert 2 * len(edges) / nodes == 4


@settings(max_examples=examples(60), deadline=None)
@given(nodes=st.integers(2, 40), seed=seeds)
def test_barabasi_albert_has_m_times_n_minus_m_edges(nodes, seed):
    m = min(5, nodes - 1)
    assert len(stage_graph("ba", nodes, seed).random_edges) == m * (nodes - m)


def test_erdos_renyi_edge_count_matches_its_expectation():
    nodes, p, samples = 32, 0.2, 200
    pairs = nodes * (nodes - 1) // 2
    counts = [len(stage_graph("er", nodes, seed).random_edges) for seed in range(samples)]
    standard_error = (pairs * p * (1 - p) / samples) ** 0.5
    assert abs(statistics.mean(counts) - p * pairs) < 4 * standard_error


@pytest.mark.parametrize(
    "generator, nodes, options, message",
    [
        ("ws", 4, {}, "nodes > k"),
        ("ws", 10, {"k": 3}, "even k"),
        ("ws", 10, {"p": 1.5}, r"\[0, 1\]"),
        ("er", 10, {"p": -0.1}, r"\[0, 1\]"),
        ("ba", 1, {}, "at least 2 nodes"),
        ("er", 0, {}, "at least 1 node"),
        ("xx", 10, {}, "unknown random graph generator"),
    ],
)
def test_bad_arguments_raise_clear_errors(generator, nodes, options, message):
    with pytest.raises(ValueError, match=message):
        stage_graph(generator, nodes, 0, **options)


def test_module_does_not_import_tvm():
    code = "import sys, tvm_diviml.zoo.randwire_graph; assert 'tvm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
