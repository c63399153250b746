"""The model-coverage suite (tvm_diviml/app/coverage.py): models from torchvision and Hugging Face, exported as
a user exports them, must import, extract, plan, build across two devices, run and match torch.

The default suite checks one CNN and one transformer through both routes; every model of the
catalogue runs with ``-m slow`` (about 20 minutes here). Without torch, torchvision, transformers or
onnxscript these tests are skipped, naming what is missing.
"""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from tvm_diviml.app import coverage
from tvm_diviml.passes.extract import extract
from tvm_diviml.profiling.fallback_time import FALLBACK_SHARE, WorkShare, on_fallback, work_shares
from tvm_diviml.schedules import apply, rules

MISSING = coverage.missing_packages()
needs_models = pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (pip install 'tvm-diviml[torch]')")


def test_relative_difference_over_every_output():
    want = [np.array([1.0, -4.0]), np.array([[2.0]])]
    assert coverage.relative_difference([np.array([1.0, -4.0]), np.array([[2.0]])], want) == 0
    assert coverage.relative_difference([np.array([1.0, -3.0]), np.array([[2.0]])], want) == pytest.approx(0.25)
    assert coverage.relative_difference([np.array([1.0, -4.0])], want) == float("inf")  # an output lost
    assert coverage.relative_difference([np.array([1.0, -4.0]), np.array([2.0])], want) == float("inf")


def test_halves_plan_splits_the_topological_order():
    from tvm_diviml.synthetic import random_dag

    class Extraction:
        graph = random_dag(kernels=7, seed=1)

    plan = coverage.halves_plan(Extraction)
    order = Extraction.graph.topo_order
    assert [plan.assignment[k] for k in order] == ["cpu0"] * 3 + ["cpu1"] * 4


def test_unknown_route_is_refused():
    model = coverage.EcosystemModel("nothing", "none", lambda: None)
    with pytest.raises(ValueError, match="unknown route 'tflite'"):
        coverage.check_model(model, "tflite")


def data_dependent_branch(torch):
    class Branch(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1  # torch.export refuses data-dependent control flow

    return Branch()


def tensor_from_a_scalar(torch):
    class FromScalar(torch.nn.Module):
        def forward(self, x):
            return torch.tensor(x.sum().item())  # exported; TVM's importer refuses it

    return FromScalar()


@needs_models
@pytest.mark.parametrize("make, stage", [(data_dependent_branch, "export"), (tensor_from_a_scalar, "import")])
def test_a_model_that_fails_is_a_row_naming_the_stage(make, stage):
    import torch

    row = coverage.check_model(coverage.EcosystemModel("failing", "test", lambda: (make(torch), (torch.ones(2),))))
    assert row["outcome"] == f"{stage} failed" and row["error"] and "\n" not in row["error"]
    assert row["kernels"] is None and row["rel_diff"] is None


@needs_models
def test_a_model_whose_outputs_ignore_the_input_proves_nothing():
    import torch

    class Constant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.head(torch.zeros_like(x))

    row = coverage.check_model(
        coverage.EcosystemModel("constant", "test", lambda: (Constant().eval(), (torch.ones(1, 4),)))
    )
    assert row["outcome"] == "reference failed" and row["sensitivity"] == 0
    assert "outputs move by 0 (relative) when the input changes" in row["error"]


@needs_models
def test_a_model_whose_float32_outputs_are_rounding_proves_nothing():
    """The logistic map at r = 3.99 doubles rounding errors each step: after 60 steps torch's own
    float32 outputs are as far from its float64 ones as from any other, so no build can be held to them."""
    import torch

    class Chaotic(torch.nn.Module):
        def forward(self, x):
            for _ in range(60):
                x = 3.99 * x * (1 - x)
            return x

    row = coverage.check_model(
        coverage.EcosystemModel("chaotic", "test", lambda: (Chaotic().eval(), (torch.linspace(0.1, 0.9, 8),)))
    )
    assert row["outcome"] == "reference failed" and row["reference_error"] > coverage.TOLERANCE
    assert "float32 outputs differ from its float64 ones" in row["error"] and row["kernels"] is None


def assert_equals_torch(name: str, make, routes=("torch",)) -> None:
    """``make``'s model through each route, placed on cpu2, built and run: torch's outputs within the
    tolerance. These models test operators, a few elements each: a kernel left to the fallback schedule
    there (an ``amin`` over a middle axis) is no performance question, so that outcome passes too."""
    for route in routes:
        row = coverage.check_model(coverage.EcosystemModel(name, "test", make), route, platforms=("cpu2",))
        outcome_ok = row["outcome"] in ("ok", "fallback")
        assert outcome_ok and row["rel_diff"] <= coverage.TOLERANCE, (route, row["rel_diff"], row["error"])


@needs_models
def test_a_linear_layer_of_one_input_equals_torch():
    """Linear(1, 32) with its bias and ReLU: a matmul reducing over one element, which the CPU
    schedules once folded the bias into both its init and its update (outputs 19% off torch's)."""
    import torch

    def make():
        torch.manual_seed(0)
        layers = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        return layers.eval(), (torch.randn(8, 1),)

    assert_equals_torch("linear1", make)


@needs_models
def test_a_recurrent_model_read_at_its_last_step_equals_torch():
    """A GRU whose head reads ``y[:, -1]``: TVM's importer took -1 as an index before the row."""
    import torch

    class LastStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = torch.nn.GRU(8, 16, batch_first=True), torch.nn.Linear(16, 3)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])

    def make():
        torch.manual_seed(0)
        return LastStep().eval(), (torch.randn(2, 4, 8),)

    assert_equals_torch("gru", make)


@needs_models
def test_a_decoder_with_a_transposed_convolution_equals_torch():
    """ConvTranspose2d, as U-Nets and GAN decoders upsample: in NHWC TOPI cannot lower it, so it keeps
    NCHW (the layout pass moved it along with the convolutions, and extraction refused the model)."""
    import torch

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.down = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.up = torch.nn.ConvTranspose2d(8, 4, 2, stride=2)

        def forward(self, x):
            return self.up(torch.relu(self.down(x))) + x[:, :1]

    def make():
        torch.manual_seed(0)
        return coverage.lively(Decoder()).eval(), (torch.randn(1, 3, 8, 8),)

    assert_equals_torch("decoder", make, coverage.ROUTES)


@needs_models
def test_amax_amin_and_unfold_import_from_torch():
    """TVM 0.27's torch importer lacks them; the front end maps amax and amin to Relax's max and min,
    and unfold to a take of the windows' indices."""
    import torch

    class Extremes(torch.nn.Module):
        def forward(self, x):
            extremes = x.amax(1, keepdim=True) + x.amin((0, 2), keepdim=True) - x.amax() + x.amin(-1).unsqueeze(-1)
            return extremes, x.unfold(2, 2, 1), x.unfold(-2, 2, 2).sum(-1), x.unfold(0, 1, 1)

    def make():
        return Extremes().eval(), (torch.randn(2, 3, 4),)

    assert_equals_torch("extremes", make)


@needs_models
def test_selu_celu_elu_and_rounded_divisions_import_as_torch_computes_them():
    """torch passes SELU and CELU as ``elu`` with a scale and an input scale, which TVM's importer
    dropped; a float tensor divided by a whole number with a rounding mode was refused."""
    import torch
    import torch.nn.functional as F

    class Units(torch.nn.Module):
        def forward(self, x):
            floor, trunc = torch.div(x * 5, 2, rounding_mode="floor"), torch.div(x * 5, 2, rounding_mode="trunc")
            return (
                F.selu(x),
                F.celu(x, alpha=2.0),
                F.elu(x, alpha=0.5),
                floor + trunc + torch.div(x, 2.5, rounding_mode="floor"),
            )

    def make():
        return Units().eval(), (torch.linspace(-6.0, 3.0, 24).reshape(2, 12),)

    assert_equals_torch("units", make)


@needs_models
def test_a_stable_model_records_its_reference_error():
    import torch

    torch.manual_seed(0)
    row = coverage.check_model(
        coverage.EcosystemModel("mlp", "test", lambda: (torch.nn.Linear(8, 4).eval(), (torch.randn(2, 8),))),
        platforms=("cpu2",),
    )
    assert row["outcome"] == "ok" and 0 <= row["reference_error"] < 1e-6


@needs_models
def test_lively_weights_make_outputs_follow_the_input():
    import torch
    import torchvision

    torch.manual_seed(0)
    vit = torchvision.models.VisionTransformer(
        image_size=16, patch_size=8, num_layers=1, num_heads=1, hidden_dim=8, mlp_dim=8, num_classes=3
    ).eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(vit(x), vit(2 * x))  # torchvision's zero head: constant outputs
        coverage.lively(vit)
        assert coverage.relative_difference([vit(2 * x).numpy()], [vit(x).numpy()]) > coverage.MIN_SENSITIVITY


@needs_models
def test_a_vit_patch_embedding_runs_in_nhwc():
    """TVM 0.27's ConvertLayout failed on torch's ViT (std::bad_alloc, not a TVMError: its attention
    squeezes a negative axis), which left the strided patch embedding in NCHW, to the fallback
    schedule; the layout pass counts such axes from the front, and the input changes to NHWC first."""
    import torch

    from tvm_diviml.frontends.importers import from_torch_export
    from tvm_diviml.passes.extract import extract

    module, args = coverage.catalogue()["vit_small"].make()
    built = from_torch_export(torch.export.export(module, args))
    graph = extract(built.mod, built.entry).graph
    assert [k for k in graph.kernels if "conv2d" in k] and graph.inputs[0].consumers == ("transpose",)


def test_a_kernel_that_computes_nothing_is_weighed_by_the_bytes_it_moves(monkeypatch):
    """A transpose has no FLOPs: left to the fallback (the Injective rule taken away), it holds its share
    of the bytes the model's kernels move, not none of the work."""
    data = relax.Var("data", relax.TensorType([1, 64, 64, 64], "float32"))
    weight = relax.Var("weight", relax.TensorType([64, 8], "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [data, weight], {"num_input": 1}):
        with builder.dataflow():
            moved = builder.emit(relax.op.permute_dims(data, [0, 2, 3, 1]))
            output = builder.emit_output(relax.op.matmul(moved, weight))
        builder.emit_func_output(output)
    extraction = extract(builder.get(), "main")
    without_injective = [rule for rule in rules.cpu_rules() if not isinstance(rule, rules.Injective)]
    monkeypatch.setattr(apply, "cpu_rules", lambda: without_injective)
    kernels = extraction.graph.kernels
    moved_bytes = kernels["transpose"].bytes_moved
    shares = work_shares(extraction)
    assert shares == {
        "transpose": WorkShare(
            "Fallback", pytest.approx(moved_bytes / (moved_bytes + kernels["matmul"].bytes_moved)), "bytes"
        ),
        "matmul": WorkShare("Matmul", 1.0, "FLOPs"),
    }
    assert list(on_fallback(shares)) == ["transpose"] and shares["transpose"].share > 0.5


def attention_cnn():
    """A held-out model: a strided convolution with a bias, its pixels as tokens through LayerNorm and
    2-head attention with a residual, a mean and a head; the convolution holds about a tenth of the FLOPs."""
    import torch
    from torch import nn

    class AttentionCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.down = nn.Conv2d(8, 16, 3, stride=2, padding=1)
            self.norm = nn.LayerNorm(16)
            self.attention = nn.MultiheadAttention(16, 2, batch_first=True)
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            tokens = torch.relu(self.down(x)).flatten(2).transpose(1, 2)
            normed = self.norm(tokens)
            attended, _ = self.attention(normed, normed, normed, need_weights=False)
            return self.head((tokens + attended).mean(1))

    torch.manual_seed(0)
    return coverage.lively(AttentionCNN()).eval(), (torch.randn(1, 8, 16, 16),)


def attention_cnn_row() -> dict:
    return coverage.check_model(coverage.EcosystemModel("attention_cnn", "test", attention_cnn), platforms=("cpu2",))


@needs_models
def test_a_held_out_attention_cnn_leaves_no_kernel_to_the_fallback():
    row = attention_cnn_row()
    assert row["outcome"] == "ok" and 0 <= row["fallback_share"] <= FALLBACK_SHARE, row
    assert isinstance(row["fallback_kernels"], str) and "conv2d" not in row["fallback_kernels"]


@needs_models
def test_a_convolution_left_to_the_fallback_makes_the_row_fail_naming_it(monkeypatch):
    without_conv2d = [rule for rule in rules.cpu_rules() if not isinstance(rule, rules.Conv2d)]
    monkeypatch.setattr(apply, "cpu_rules", lambda: without_conv2d)
    row = attention_cnn_row()
    assert row["outcome"] == "fallback" and row["rel_diff"] <= coverage.TOLERANCE, row
    assert row["fallback_share"] > FALLBACK_SHARE and "conv2d" in row["fallback_kernels"]
    (named,) = row["error"].split(": ", 1)[1].split("; ")
    assert "conv2d" in named and "(Fallback, " in named and "of FLOPs)" in named


@needs_models
def test_a_schedule_rule_that_raises_fails_the_build_naming_the_rule(monkeypatch):
    def broken(self, func, target, tunable):
        raise RuntimeError("a broken rule")

    monkeypatch.setattr(rules.Conv2d, "apply", broken)
    row = attention_cnn_row()
    assert row["outcome"] == "build failed" and row["rel_diff"] is None and row["fallback_share"] is None
    assert row["error"].startswith("RuntimeError: a broken rule (raised by the Conv2d schedule rule on ")


@needs_models
def test_torch_outputs_flattens_model_outputs():
    import torch
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    output = BaseModelOutputWithPooling(last_hidden_state=torch.ones(1, 2), pooler_output=torch.zeros(3))
    flat = coverage.torch_outputs((output, torch.full((2,), 5.0)))
    assert [a.tolist() for a in flat] == [[[1.0, 1.0]], [0.0, 0.0, 0.0], [5.0, 5.0]]


def catalogue_cases(quick: bool):
    """(model, route) parameters; one placeholder without the packages, which ``needs_models`` skips."""
    if MISSING:
        return [pytest.param(None, None)]
    return [
        pytest.param(m.name, route, marks=[] if quick else [pytest.mark.slow])
        for m in coverage.catalogue().values()
        if m.quick == quick
        for route in coverage.ROUTES
    ]


def assert_covered(name: str, route: str, record_property) -> None:
    """The model's row is ok: it matches torch, and no kernel that no class rule took holds more than
    5% of its work. The fallback columns go to the test report (``--junitxml``) whatever the outcome."""
    row = coverage.check_model(coverage.catalogue()[name], route, time_limit_s=5.0)
    record_property("fallback_share", row["fallback_share"])
    record_property("fallback_kernels", row["fallback_kernels"])
    assert row["outcome"] == "ok", row
    assert row["fallback_share"] <= FALLBACK_SHARE, row["fallback_kernels"]
    assert row["rel_diff"] <= coverage.TOLERANCE and row["kernels"] > 10
    assert all(row[f"plan_{p}_s"] is not None for p in coverage.PLAN_PLATFORMS)


@needs_models
@pytest.mark.parametrize("name, route", catalogue_cases(quick=True))
def test_quick_models_are_covered(name, route, record_property):
    assert_covered(name, route, record_property)


@needs_models
@pytest.mark.parametrize("name, route", catalogue_cases(quick=False))
def test_every_catalogue_model_is_covered(name, route, record_property):
    assert_covered(name, route, record_property)
