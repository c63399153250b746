"""twin_branch extracts into equal, independent kernel chains joined by one sum kernel, and computes
what its weights say: the properties the concurrent executor's two-device demonstration rests on."""

import numpy as np
import pytest

from tvm_diviml.cost import RooflineCostModel
from tvm_diviml.passes.extract import extract
from tvm_diviml.plan import Plan
from tvm_diviml.presets import get_platform
from tvm_diviml.problem import Problem
from tvm_diviml.simulator import simulate
from tvm_diviml.zoo import build_model
from tvm_diviml.zoo.reference import run_reference

SHAPES = [{"branches": 2, "depth": 3, "hidden": 16, "batch": 4}, {"branches": 3, "depth": 2, "hidden": 8, "batch": 2}]


def chains_into_sum(graph):
    """Walk back from the single output kernel along single-predecessor links: one chain per
    predecessor of the sum, listed from the input side."""
    (total,) = graph.outputs
    chains = []
    for edge in graph.pred[total]:
        chain = [edge.src]
        while graph.pred[chain[0]]:
            (into,) = graph.pred[chain[0]]  # a chain kernel reads one kernel at most
            chain.insert(0, into.src)
        chains.append(chain)
    return total, chains


@pytest.fixture(scope="module", params=SHAPES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def twin(request):
    model = build_model("twin_branch", request.param)
    return request.param, model, extract(model.mod, model.entry).graph


def test_one_kernel_per_layer_plus_the_sum(twin):
    options, _, graph = twin
    assert len(graph) == options["branches"] * options["depth"] + 1


def test_branches_are_disjoint_chains_from_the_input_to_the_sum(twin):
    options, _, graph = twin
    total, chains = chains_into_sum(graph)
    assert len(chains) == options["branches"]
    assert all(len(chain) == options["depth"] for chain in chains)
    in_chains = [k for chain in chains for k in chain]
    assert len(set(in_chains)) == len(in_chains)  # no kernel in two branches
    assert set(in_chains) | {total} == set(graph.kernels)
    for chain in chains:  # each step feeds only the next
        assert [[e.dst for e in graph.succ[k]] for k in chain] == [[k] for k in chain[1:] + [total]]
    (x,) = graph.inputs
    assert sorted(x.consumers) == sorted(chain[0] for chain in chains)


def test_every_branch_has_the_hand_counted_flops(twin):
    options, _, graph = twin
    batch, hidden, depth = options["batch"], options["hidden"], options["depth"]
    per_layer = 2 * batch * hidden * hidden + 2 * batch * hidden  # multiply-adds, then bias and ReLU
    _, chains = chains_into_sum(graph)
    assert [sum(graph.kernels[k].flops for k in chain) for chain in chains] == [depth * per_layer] * len(chains)


def test_one_device_per_branch_halves_the_estimated_latency():
    """On cpu2's roofline, the branches overlap: the latency falls to one branch plus the join."""
    model = build_model("twin_branch")
    graph = extract(model.mod, model.entry).graph
    platform = get_platform("cpu2")
    costs = RooflineCostModel(graph, platform)
    total, chains = chains_into_sum(graph)
    split = {k: f"cpu{i}" for i, chain in enumerate(chains) for k in chain} | {total: "cpu0"}
    alone = simulate(Problem(graph, platform, costs), Plan({k: "cpu0" for k in graph.kernels})).value_s
    together = simulate(Problem(graph, platform, costs), Plan(split)).value_s
    branch_s = sum(costs.compute_s(k, "cpu0") for k in chains[0])
    assert together < 0.6 * alone
    assert together >= branch_s


def test_output_is_the_sum_of_the_numpy_branches(twin):
    options, model, _ = twin
    weights = dict(model.params)
    (x,) = model.sample_inputs(seed=3)
    expected = np.zeros_like(x)
    for b in range(options["branches"]):
        h = x
        for d in range(options["depth"]):
            layer = f"branches.{b}.layers.{d}"
            h = np.maximum(h @ weights[f"{layer}.weight"].T + weights[f"{layer}.bias"], 0)
        expected += h
    (out,) = run_reference(model, [x])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert np.abs(expected).max() > 0.1  # not all ReLUs dead


def test_bad_options_are_refused():
    from tvm_diviml.errors import DivimlInputError

    with pytest.raises(DivimlInputError, match="depth"):
        build_model("twin_branch", {"depth": 0})
