"""The convolutional and random-wired zoo models: they export, run, and have the architecture's size."""

import numpy as np
import pytest

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.zoo import ZOO, build_model, zoo_names
from tvm_diviml.zoo.randwire_graph import stage_graph
from tvm_diviml.zoo.reference import run_reference

RANDWIRE_SMALL = {"nodes": 8, "channels": 8, "stages": 2, "resolution": 32}
MODELS = ("resnet18", "resnet50", "mobilenet_v2", "inception_v3", "randwire_ws", "randwire_er", "randwire_ba")

# Compiling even a small model takes the llvm pipeline 5-15 s on this machine; the slow ones are marked.
SMALL_BUILDS = [
    pytest.param("resnet18", {"resolution": 32}),
    pytest.param("resnet50", {"resolution": 32}, marks=pytest.mark.slow),
    pytest.param("mobilenet_v2", {"resolution": 32}, marks=pytest.mark.slow),
    pytest.param("inception_v3", {"resolution": 75}, marks=pytest.mark.slow),
    pytest.param("randwire_ws", RANDWIRE_SMALL),
    pytest.param("randwire_er", RANDWIRE_SMALL, marks=pytest.mark.slow),
    pytest.param("randwire_ba", RANDWIRE_SMALL, marks=pytest.mark.slow),
]

# torchvision's parameter counts (BN running statistics are buffers, not parameters, so BN's scale and
# shift replace its weight and bias one for one); Inception-v3 without its auxiliary head.
TORCHVISION_PARAMETERS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "mobilenet_v2": 3_504_872,
    "inception_v3": 23_834_568,
}


def parameter_count(built):
    return sum(value.size for _, value in built.params)


def test_every_model_is_registered_with_the_common_options():
    assert set(MODELS) <= set(zoo_names())
    for name in MODELS:
        defaults = ZOO[name].defaults()
        assert defaults["batch"] == 1 and defaults["classes"] == 1000
        assert defaults["resolution"] == (299 if name == "inception_v3" else 224)


@pytest.mark.parametrize("name, options", SMALL_BUILDS)
def test_small_model_runs_to_finite_logits(name, options):
    built = build_model(name, {**options, "batch": 2, "classes": 10})
    (logits,) = run_reference(built)
    assert logits.shape == (2, 10)
    assert np.isfinite(logits).all()


def test_resnet50_has_torchvisions_parameter_count_at_full_size():
    built = build_model("resnet50")
    assert parameter_count(built) == TORCHVISION_PARAMETERS["resnet50"]
    assert built.inputs == [("data", (1, 3, 224, 224), "float32")]


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "inception_v3"])
def test_other_cnns_have_torchvisions_parameter_count(name):
    assert parameter_count(build_model(name)) == TORCHVISION_PARAMETERS[name]


def test_every_convolution_is_followed_by_a_batch_norm_scale_and_shift():
    names = [name for name, _ in build_model("resnet18", {"resolution": 32}).params]
    convs = [n for n in names if n.endswith("conv.weight")]
    assert len(convs) == 20  # stem + 16 in blocks + 3 shortcut projections
    assert {n.removesuffix("conv.weight") for n in convs} == {
        n.removesuffix("bn.scale") for n in names if n.endswith("bn.scale")
    }
    assert sum(n.endswith("bn.shift") for n in names) == len(convs)


@pytest.mark.parametrize("name, generator", [("randwire_ws", "ws"), ("randwire_er", "er"), ("randwire_ba", "ba")])
def test_randwire_has_a_node_per_graph_node_and_a_weight_per_aggregated_edge(name, generator):
    options = {**RANDWIRE_SMALL, "seed": 3}
    params = dict(build_model(name, options).params)
    graphs = [stage_graph(generator, options["nodes"], options["seed"] + stage) for stage in range(options["stages"])]
    depthwise = [n for n in params if n.endswith("depthwise.weight")]
    assert len(depthwise) == sum(len(graph.nodes) - 1 for graph in graphs)  # every node but the output
    edge_weights = sum(params[n].size for n in params if n.endswith("edge_logits"))
    assert edge_weights == sum(len(preds) for graph in graphs for preds in graph.predecessors[1:-1] if len(preds) > 1)


def test_randwire_seed_changes_the_wiring_not_just_the_weights():
    first = build_model("randwire_ws", {**RANDWIRE_SMALL, "seed": 0})
    second = build_model("randwire_ws", {**RANDWIRE_SMALL, "seed": 1})
    assert [(n, v.shape) for n, v in first.params] != [(n, v.shape) for n, v in second.params]


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("inception_v3", {"resolution": 74}, "resolution >= 75"),
        ("resnet18", {"resolution": 0}, "'resolution' of 'resnet18' must be a positive integer"),
        ("randwire_ws", {"nodes": 4}, "nodes > k"),
        ("randwire_ba", {"channels": 1}, "channels must be at least 2"),
    ],
)
def test_bad_options_are_input_errors(name, options, message):
    with pytest.raises(DivimlInputError, match=message):
        build_model(name, options)
