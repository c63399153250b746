"""Every zoo model extracts; FLOPs match hand-derived figures; running the extracted kernels one by
one reproduces the whole model (small sizes: CPU kernels are unscheduled, see docs/design.md#tvm-027-traps)."""

import pytest

from tvm_diviml.app.load import load_model
from tvm_diviml.zoo import SMALL_OPTIONS, zoo_names

from ..helpers import assert_faithful

SMALL = SMALL_OPTIONS
FAST = {"resnet18", "randwire_ws", "bert_base"}
# Real networks; twin_branch is a toy for the concurrent executor (tests/zoo/test_branches.py checks it).
NETWORKS = sorted(set(SMALL) - {"twin_branch"})


def gflops(graph):
    return sum(k.flops for k in graph.kernels.values()) / 1e9


def test_every_zoo_model_has_a_small_size_here():
    assert set(zoo_names()) == set(SMALL)


@pytest.mark.parametrize("name, expected", [("resnet50", 8.2), ("bert_base", 22.3), ("resnet18", 3.6)])
def test_total_flops_match_hand_derived_figures(name, expected):
    graph = load_model(name, {}).extraction.graph
    assert gflops(graph) == pytest.approx(expected, rel=0.05)


@pytest.mark.parametrize("name", NETWORKS)
def test_every_zoo_model_extracts_at_default_size(name):
    loaded = load_model(name, {})
    graph = loaded.extraction.graph
    assert len(graph) > 10 and gflops(graph) > 0.1
    assert graph.inputs and graph.outputs and graph.weights
    assert all(k.output_bytes > 0 for k in graph.kernels.values())


def test_kernel_counts_are_stable_across_runs():
    first = load_model("randwire_ws", {"nodes": 16}).extraction.graph
    second = load_model("randwire_ws", {"nodes": 16}).extraction.graph
    assert first.to_json() == second.to_json()


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in sorted(SMALL)])
def test_running_the_extracted_kernels_reproduces_the_model(name):
    loaded = load_model(name, SMALL[name])
    assert_faithful(loaded.built, loaded.extraction, rtol=1e-4, atol=1e-4)
