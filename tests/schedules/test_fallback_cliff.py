"""No kernel of a CNN falls off the fallback cliff, whatever surrounds its convolutions, and a kernel
that does is named in a warning.

A residual CNN whose strided convolution (with a bias) feeds LayerNorm and MultiheadAttention kept
every convolution in NCHW: torch's attention squeezes a negative axis, on which TVM 0.27's
``ConvertLayout`` fails for the whole module, and in NCHW the strided convolution reads its input
with gaps, which only the ``Fallback`` rule takes (33 ms where NHWC under ``Conv2d`` takes 0.4 ms).
Which rule takes each kernel is checked by structure, weighted by the kernel's share of the model's
work (``work_shares``: FLOPs, or bytes for a kernel without FLOPs), not by timing: a 2-core machine
shared with other jobs cannot time a 5% share reliably. The
warning is checked on measured costs with a rule taken away, so that the convolution is left to the
fallback on purpose.
"""

from __future__ import annotations

import importlib.util

import pytest
from tvm import relax

from tvm_diviml.app import coverage
from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.passes.extract import extract
from tvm_diviml.presets import get_platform
from tvm_diviml.profiling.cache import ProfileCache
from tvm_diviml.profiling.fallback_time import FALLBACK_SHARE, fallback_hotspots, on_fallback, work_shares
from tvm_diviml.profiling.measured import MeasureOptions, measure
from tvm_diviml.schedules import apply
from tvm_diviml.schedules.rules import Conv2d

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="needs torch (pip install 'tvm-diviml[torch]')"
)
needs_onnx_export = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("torch", "onnx", "onnxscript")),
    reason="needs torch, onnx and onnxscript (pip install 'tvm-diviml[torch]')",
)
FAST = MeasureOptions(repeats=3, min_repeat_ms=1, progress=False)


def attention_cnn():
    """The model and its input: a stem, a residual block, a strided convolution with a bias, its
    pixels as tokens through LayerNorm and 4-head attention with a residual, a mean and a head. At
    32x32 the strided convolution holds a tenth of the FLOPs."""
    import torch
    from torch import nn

    class Residual(nn.Module):
        def __init__(self, channels: int):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
            self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)

        def forward(self, x):
            return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))

    class AttentionCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
            self.block = Residual(32)
            self.down = nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=True)
            self.norm = nn.LayerNorm(64)
            self.attention = nn.MultiheadAttention(64, 4, batch_first=True)
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            tokens = self.down(self.block(self.stem(x))).flatten(2).transpose(1, 2)
            normed = self.norm(tokens)
            attended, _ = self.attention(normed, normed, normed, need_weights=False)
            return self.head((tokens + attended).mean(1))

    torch.manual_seed(0)
    return coverage.lively(AttentionCNN()).eval(), (torch.randn(1, 3, 32, 32),)


def strided_1d_cnn():
    """A 1-D CNN with a strided convolution (as audio front ends have), its channels then as tokens."""
    import torch
    from torch import nn

    class Strided1d(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv1d(8, 32, 5, padding=2)
            self.down = nn.Conv1d(32, 64, 3, stride=2, padding=1)
            self.head = nn.Linear(64, 4)

        def forward(self, x):
            return self.head(self.down(torch.relu(self.stem(x))).transpose(1, 2).mean(1))

    torch.manual_seed(0)
    return coverage.lively(Strided1d()).eval(), (torch.randn(1, 8, 256),)


MODELS = {"attention_cnn": attention_cnn, "strided_1d_cnn": strided_1d_cnn}


def imported(make, route: str, folder):
    """The model as a user brings it: exported by torch.export or to ONNX, and imported."""
    import torch

    from tvm_diviml.frontends.importers import from_torch_export, load_onnx

    module, args = make()
    if route == "torch":
        return from_torch_export(torch.export.export(module, args))
    path = str(folder / "model.onnx")
    coverage.export_onnx(module, args, path)
    return load_onnx(path)


def rules_and_work_shares(built):
    """Each kernel's schedule on this machine's CPU and its share of the model's work."""
    return work_shares(extract(built.mod, built.entry))


def assert_no_fallback_cliff(shares) -> None:
    left = on_fallback(shares)
    assert all(share.share <= FALLBACK_SHARE for share in left.values()), left
    convolutions = {name: share.rule for name, share in shares.items() if "conv" in name}
    assert convolutions and set(convolutions.values()) == {"Conv2d"}, convolutions


def assert_equals_torch(make) -> None:
    """Built in two halves on cpu0 and cpu1 of cpu2 and run: the outputs equal torch's."""
    row = coverage.check_model(coverage.EcosystemModel("model", "test", make), "torch", platforms=("cpu2",))
    assert row["outcome"] == "ok" and row["rel_diff"] <= coverage.TOLERANCE, row["error"]


@needs_torch
@pytest.mark.parametrize("model", list(MODELS))
def test_every_convolution_of_a_torch_export_gets_the_conv2d_rule_and_the_model_equals_torch(model, tmp_path):
    assert_no_fallback_cliff(rules_and_work_shares(imported(MODELS[model], "torch", tmp_path)))
    assert_equals_torch(MODELS[model])


@needs_onnx_export
def test_the_attention_cnn_exported_to_onnx_gets_the_conv2d_rule_too(tmp_path):
    assert_no_fallback_cliff(rules_and_work_shares(imported(attention_cnn, "onnx", tmp_path)))


@needs_torch
@pytest.mark.parametrize("model", list(MODELS))
def test_where_tvm_cannot_convert_layouts_each_convolution_is_converted_on_its_own(model, tmp_path, monkeypatch):
    def failing_layout_conversion(layouts):
        def fail(mod):
            raise RuntimeError("std::bad_alloc")

        return fail

    monkeypatch.setattr(relax.transform, "ConvertLayout", failing_layout_conversion)
    assert_no_fallback_cliff(rules_and_work_shares(imported(MODELS[model], "torch", tmp_path)))
    assert_equals_torch(MODELS[model])


def convolution_module():
    """A Relax model whose strided convolution holds nearly all of its time: a convolution with a
    ReLU, a global mean and a small matmul."""
    data = relax.Var("data", relax.TensorType([1, 16, 32, 32], "float32"))
    weight = relax.Var("weight", relax.TensorType([32, 16, 3, 3], "float32"))
    classifier = relax.Var("classifier", relax.TensorType([32, 4], "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [data, weight, classifier], {"num_input": 1}):
        with builder.dataflow():
            features = builder.emit(relax.op.nn.relu(relax.op.nn.conv2d(data, weight, strides=2, padding=1)))
            pooled = builder.emit(relax.op.mean(features, axis=[2, 3]))
            output = builder.emit_output(relax.op.matmul(pooled, classifier))
        builder.emit_func_output(output)
    return extract(builder.get(), "main")


def measured_costs(extraction, tmp_path) -> TableCostModel:
    platform = get_platform("cpu1")
    with ProfileCache(str(tmp_path / "profiles.sqlite")) as cache:  # rules taken away time kernels afresh
        provenance = measure(extraction.graph, platform, extraction, cache=cache, options=FAST)
    return TableCostModel.from_provenance(extraction.graph, platform, provenance)


def test_a_convolution_left_to_the_fallback_is_named_with_its_operator_and_layout(tmp_path, monkeypatch):
    without_conv2d = [rule for rule in apply.cpu_rules() if not isinstance(rule, Conv2d)]
    monkeypatch.setattr(apply, "cpu_rules", lambda: without_conv2d)
    extraction = convolution_module()
    (hotspot,) = fallback_hotspots(measured_costs(extraction, tmp_path), extraction)
    (convolution,) = [name for name in extraction.kernel_func.values() if "conv2d" in name]
    assert (hotspot.kernel, hotspot.operator, hotspot.layout, hotspot.schedule) == (
        convolution,
        "conv2d",
        "NHWC",
        "Fallback",
    )
    assert list(hotspot.shares) == get_platform("cpu1").device_names and max(hotspot.shares.values()) > 0.5
    assert hotspot.message().startswith(f"{convolution} (conv2d, NHWC, Fallback rule) takes ")
    assert "--tune" in hotspot.message()


def test_a_model_whose_kernels_all_get_class_rules_gets_no_warning(tmp_path):
    extraction = convolution_module()
    assert fallback_hotspots(measured_costs(extraction, tmp_path), extraction) == []


def test_costs_that_measured_nothing_warn_of_nothing(tmp_path):
    from tvm_diviml.cost.roofline import RooflineCostModel

    extraction = convolution_module()
    assert fallback_hotspots(RooflineCostModel(extraction.graph, get_platform("cpu1")), extraction) == []
    table = TableCostModel.from_json(measured_costs(extraction, tmp_path).to_json(), get_platform("cpu1"))
    assert fallback_hotspots(table, extraction) == []  # a table read from a file: no record of schedules


@needs_torch
def test_diviml_profile_and_run_print_the_warning(tmp_path, monkeypatch, capsys):
    """The command line prints what ``fallback_hotspots`` finds, on stderr."""
    import torch

    from tvm_diviml import cli

    class Convolution(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)

        def forward(self, x):
            return torch.relu(self.conv(x)).mean((2, 3))

    torch.manual_seed(0)
    path = str(tmp_path / "convolution.pt2")
    torch.export.save(torch.export.export(Convolution().eval(), (torch.randn(1, 16, 32, 32),)), path)
    monkeypatch.setenv("DIVIML_CACHE_DIR", str(tmp_path / "cache"))
    assert cli.main(["profile", path, "--platform", "cpu1"]) == 0
    assert "warning:" not in capsys.readouterr().err
    without_conv2d = [rule for rule in apply.cpu_rules() if not isinstance(rule, Conv2d)]
    monkeypatch.setattr(apply, "cpu_rules", lambda: without_conv2d)
    monkeypatch.setenv("DIVIML_CACHE_DIR", str(tmp_path / "cache without conv2d"))
    for command in (["profile"], ["run", "--repeats", "1"]):
        assert cli.main([command[0], path, "--platform", "cpu1", *command[1:]]) == 0
        warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1 and "(conv2d, NHWC, Fallback rule) takes" in warnings[0], command
