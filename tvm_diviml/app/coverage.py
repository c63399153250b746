"""Model coverage: models from the ecosystem, exported as a user exports them, through the whole tool.

Each model of the catalogue (torchvision's classification families, Hugging Face encoders and
decoders from small configs; weights drawn from a fixed seed, nothing downloaded) is exported with
``torch.export`` (route ``torch``) or ``torch.onnx.export`` (route ``onnx``), imported, extracted,
planned on each platform with the default solver and roofline costs, built with its kernels split
in two halves of the topological order (cpu0, then cpu1 of cpu2: every model crosses devices), run
once and compared with torch's own outputs. A comparison counts only where torch's outputs follow the
input (``sensitivity``: how far they move when it changes), so weights are drawn to keep them lively,
and only where torch's float32 outputs agree with its float64 ones to the tolerance
(``reference_error``): otherwise rounding alone moves them past it, and so would any float32 build's.
Before the build, every kernel is scheduled for cpu2's CPU as diviml builds it: a kernel that no class
rule takes (``Fallback`` or unscheduled) holding more than 5% of the model's work (its FLOPs, or bytes
moved for a kernel without FLOPs) makes the row's outcome "fallback", naming it, and a schedule rule
that raises fails the build stage, naming the rule: neither is a silent fallback.
``check_model`` returns one row per model and route; a stage that fails ends the row with that
stage's one-line error, never the whole suite.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tvm_diviml.cost.roofline import RooflineCostModel
from tvm_diviml.errors import DivimlInputError, first_line
from tvm_diviml.plan import Plan
from tvm_diviml.planning import plan_model
from tvm_diviml.presets import load_platform
from tvm_diviml.problem import Problem
from tvm_diviml.runtime.vm import SingleVMRunner
from tvm_diviml.tolerances import compare_outputs

from ..frontends.importers import from_torch_export, load_onnx
from ..passes.apply_plan import apply_plan
from ..passes.build import build
from ..passes.extract import extract
from ..profiling.fallback_time import FALLBACK_SHARE, WorkShare, on_fallback, work_shares

log = logging.getLogger(__name__)

ROUTES = ("torch", "onnx")
PLAN_PLATFORMS = ("cpu2", "paper-node")
TOLERANCE = 1e-4  # largest relative difference from torch that counts as a match
MIN_SENSITIVITY = 1e-2  # how far torch's outputs must move when the input changes
REQUIRED = ("torch", "torchvision", "transformers", "onnx", "onnxscript")  # onnxscript: torch.onnx.export


@dataclass(frozen=True)
class EcosystemModel:
    name: str
    family: str  # "torchvision" or "transformers"
    make: Callable[[], tuple[Any, tuple]]  # () -> (torch module in eval mode, example args)
    quick: bool = False  # in the quick subset (tests, --quick)


def missing_packages() -> list[str]:
    """The packages the coverage suite needs that are not installed."""
    import importlib.util

    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def catalogue() -> dict[str, EcosystemModel]:
    """The models of the suite, by name (needs torch, torchvision and transformers)."""
    import torch
    import torchvision
    import transformers as hf

    models = torchvision_models(torch, torchvision) + transformers_models(torch, hf)
    return {m.name: m for m in models}


def torchvision_models(torch, torchvision) -> list[EcosystemModel]:
    """torchvision's classification families, untrained (``lively`` weights) at small resolutions:
    the suite checks what the tool does with their operators, not what they predict."""

    def vision(name: str, resolution: int = 64, **options) -> Callable[[], tuple[Any, tuple]]:
        def make():
            torch.manual_seed(0)
            model = lively(getattr(torchvision.models, name)(weights=None, **options))
            return model.eval(), (torch.randn(1, 3, resolution, resolution),)

        return make

    def small_vit():
        torch.manual_seed(0)
        model = lively(
            torchvision.models.VisionTransformer(
                image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128, num_classes=10
            )
        )
        return model.eval(), (torch.randn(1, 3, 32, 32),)

    return [
        EcosystemModel("resnet18", "torchvision", vision("resnet18"), quick=True),
        EcosystemModel("mobilenet_v2", "torchvision", vision("mobilenet_v2")),
        EcosystemModel("mobilenet_v3_small", "torchvision", vision("mobilenet_v3_small")),
        EcosystemModel("efficientnet_b0", "torchvision", vision("efficientnet_b0")),
        EcosystemModel("densenet121", "torchvision", vision("densenet121")),
        EcosystemModel("regnet_y_400mf", "torchvision", vision("regnet_y_400mf")),
        EcosystemModel("googlenet", "torchvision", vision("googlenet", aux_logits=False, init_weights=True)),
        EcosystemModel("inception_v3", "torchvision", vision("inception_v3", 75, aux_logits=False, init_weights=True)),
        EcosystemModel("shufflenet_v2_x0_5", "torchvision", vision("shufflenet_v2_x0_5")),
        EcosystemModel("squeezenet1_1", "torchvision", vision("squeezenet1_1")),
        EcosystemModel("convnext_tiny", "torchvision", vision("convnext_tiny", 32)),
        EcosystemModel("vit_small", "torchvision", small_vit),
        EcosystemModel("swin_t", "torchvision", vision("swin_t", 64)),
    ]


def transformers_models(torch, hf) -> list[EcosystemModel]:
    """Hugging Face encoders and decoders from small configs (two layers, a 128-token vocabulary),
    built from the config rather than downloaded, fed 16 token ids."""

    def text(model_class, config) -> Callable[[], tuple[Any, tuple]]:
        def make():
            torch.manual_seed(0)
            return model_class(config).eval(), (torch.randint(0, config.vocab_size, (1, 16)),)

        return make

    encoder = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=80,
    )
    return [
        EcosystemModel("bert", "transformers", text(hf.BertModel, hf.BertConfig(**encoder)), quick=True),
        EcosystemModel(
            "distilbert",
            "transformers",
            text(
                hf.DistilBertModel,
                hf.DistilBertConfig(
                    dim=64, n_layers=2, n_heads=2, hidden_dim=128, vocab_size=128, max_position_embeddings=80
                ),
            ),
        ),
        EcosystemModel("roberta", "transformers", text(hf.RobertaModel, hf.RobertaConfig(**encoder))),
        EcosystemModel(
            "gpt2",
            "transformers",
            text(
                hf.GPT2LMHeadModel,
                hf.GPT2Config(
                    n_embd=64,
                    n_layer=2,
                    n_head=2,
                    vocab_size=128,
                    n_positions=80,
                    use_cache=False,
                    bos_token_id=0,
                    eos_token_id=0,
                ),
            ),
        ),
        EcosystemModel(
            "llama",
            "transformers",
            text(
                hf.LlamaForCausalLM,
                hf.LlamaConfig(
                    hidden_size=64,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    intermediate_size=128,
                    vocab_size=128,
                    max_position_embeddings=80,
                    use_cache=False,
                    bos_token_id=0,
                    eos_token_id=0,
                ),
            ),
        ),
        EcosystemModel(
            "t5_encoder",
            "transformers",
            text(
                hf.T5EncoderModel, hf.T5Config(d_model=64, d_kv=16, num_layers=2, num_heads=4, d_ff=128, vocab_size=128)
            ),
        ),
    ]


def lively(model):
    """Weights under which the outputs follow the input: some torchvision initialisations leave them
    nearly constant (ViT's zero head; GoogLeNet's and ShuffleNet's activations fade), and then a
    comparison with torch proves nothing. Matrices and kernels fan-in scaled, biases and batch-norm
    statistics (buffers the build must carry) drawn away from their neutral values."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.running_mean.normal_(0.0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.normal_(1.0, 0.1)
                module.bias.normal_(0.0, 0.1)
            elif isinstance(weight, torch.Tensor) and weight.dim() >= 2:
                weight.normal_(0.0, (2.0 / (weight[0].numel() or 1)) ** 0.5)
                if getattr(module, "bias", None) is not None:
                    module.bias.normal_(0.0, 0.1)
    return model


def torch_outputs(output) -> list[np.ndarray]:
    """A torch model's outputs (a tensor, tuples, dicts or Hugging Face ModelOutputs) as a flat list."""
    if hasattr(output, "detach"):
        return [output.detach().numpy()]
    if isinstance(output, dict):  # ModelOutput is an OrderedDict of its non-None fields
        output = list(output.values())
    return [array for item in output for array in torch_outputs(item)]


def relative_difference(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """max |got - want| / max |want| over all outputs; infinite when the outputs do not correspond."""
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
        return float("inf")
    return compare_outputs(got, want).max_rel_diff


def _other_input(tensor):
    """An input unlike ``tensor``: floats rescaled and shifted, integers (token ids) rolled."""
    import torch

    if tensor.is_floating_point():
        return tensor * 0.5 + 1.0
    return torch.roll(tensor, 1, dims=-1)


def export_onnx(module, args, path: str) -> str:
    """Export with torch.onnx's dynamo exporter, else (its decompositions fail on some models, T5's
    among them) with the TorchScript one, as a user would next; returns the exporter that wrote it."""
    import torch

    try:
        torch.onnx.export(module, args, path, dynamo=True, external_data=False, verbose=False)
        return "torch.onnx (dynamo)"
    except Exception as error:  # torch.onnx raises its own ConversionError and whatever it met
        log.info(
            "the dynamo ONNX exporter failed (%s: %s); trying the TorchScript one",
            type(error).__name__,
            first_line(error),
        )
    torch.onnx.export(module, args, path, dynamo=False)
    return "torch.onnx (TorchScript)"


def halves_plan(extraction) -> Plan:
    """The first half of the kernels (topological order) on cpu0, the rest on cpu1."""
    order = extraction.graph.topo_order
    return Plan({k: "cpu0" if i < len(order) // 2 else "cpu1" for i, k in enumerate(order)})


def check_model(
    model: EcosystemModel,
    route: str = "torch",
    *,
    platforms: tuple[str, ...] = PLAN_PLATFORMS,
    time_limit_s: float = 10.0,
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """One row: export, import, extract, plan on each platform, build, run, compare with torch."""
    if route not in ROUTES:
        raise DivimlInputError(f"unknown route '{route}'", field="route", hint=f"use one of {', '.join(ROUTES)}")
    row = _empty_row(model, route, platforms)
    stage = "reference"
    try:
        import torch

        module, args, want = _reference_outputs(model, row, tolerance)
        stage = "export"
        with tempfile.TemporaryDirectory() as folder:
            began = time.perf_counter()
            if route == "torch":
                program = torch.export.export(module, args)
                stage = "import"
                built = from_torch_export(program, name=model.name)
            else:
                path = os.path.join(folder, f"{model.name}.onnx")
                row["exporter"] = export_onnx(module, args, path)
                stage = "import"
                built = load_onnx(path)
            row["import_s"] = time.perf_counter() - began
        stage, began = "extract", time.perf_counter()
        extraction = extract(built.mod, built.entry, name=model.name)
        row["extract_s"], row["kernels"] = time.perf_counter() - began, len(extraction.graph)
        stage = "plan"
        for name in platforms:
            platform = load_platform(name)
            problem = Problem(extraction.graph, platform, RooflineCostModel(extraction.graph, platform))
            began = time.perf_counter()
            solved = plan_model(problem, time_limit_s=time_limit_s)
            row[f"plan_{name}_s"] = time.perf_counter() - began
            if not solved.simulation.feasible:
                raise DivimlInputError(f"the plan on {name} is infeasible", field="plan")
        stage, began = "build", time.perf_counter()
        fallback = _record_fallback(row, extraction)
        executable = build(apply_plan(built.mod, halves_plan(extraction), load_platform("cpu2"), extraction=extraction))
        row["build_s"] = time.perf_counter() - began
        stage = "run"
        runner = SingleVMRunner(executable, [w for _, w in built.params])
        got = runner([a.numpy() for a in args])
        row["rel_diff"] = relative_difference(got, want)
        if not row["rel_diff"] <= tolerance:
            row["outcome"] = "mismatch"
        elif row["fallback_share"] > FALLBACK_SHARE:
            row["outcome"] = "fallback"
            row["error"] = f"kernels on a fallback schedule above {FALLBACK_SHARE:.0%} of the work: " + describe(
                {name: share for name, share in fallback.items() if share.share > FALLBACK_SHARE}
            )
    except DivimlInputError as error:
        row["outcome"], row["error"] = f"{stage} failed", str(error)
    except Exception as error:  # a model the tool cannot handle is a row, not the end of the suite
        log.warning("%s (%s) failed at %s", model.name, route, stage, exc_info=True)
        notes = "".join(f" ({note})" for note in getattr(error, "__notes__", ()))  # which schedule rule raised
        row["outcome"], row["error"] = f"{stage} failed", f"{type(error).__name__}: {first_line(error)}{notes}"
    return row


def _record_fallback(row: dict[str, Any], extraction) -> dict[str, WorkShare]:
    """The kernels that no class rule schedules for cpu2's CPU, into the row: the largest one's share of
    the model's work and each one's rule and share. A schedule rule that raises propagates."""
    fallback = on_fallback(work_shares(extraction))
    row["fallback_share"] = max((share.share for share in fallback.values()), default=0.0)
    row["fallback_kernels"] = describe(fallback)
    return fallback


def describe(kernels: dict[str, WorkShare]) -> str:
    """Kernels with their rule and share of the model's work, on one line: "name (Fallback, 6.1% of FLOPs)"."""
    return "; ".join(f"{name} ({share.rule}, {share.share:.1%} of {share.measure})" for name, share in kernels.items())


def _empty_row(model: EcosystemModel, route: str, platforms: tuple[str, ...]) -> dict[str, Any]:
    """The row before any stage has run: every column present (a failed stage leaves its own and the
    later ones empty), the outcome ok until a stage says otherwise."""
    return {
        "suite": "models",
        "model": model.name,
        "family": model.family,
        "route": route,
        "exporter": "torch.export" if route == "torch" else None,
        "kernels": None,
        "import_s": None,
        "extract_s": None,
        **{f"plan_{name}_s": None for name in platforms},
        "build_s": None,
        "fallback_share": None,
        "fallback_kernels": None,
        "sensitivity": None,
        "reference_error": None,
        "rel_diff": None,
        "outcome": "ok",
        "error": "",
    }


def _reference_outputs(model: EcosystemModel, row: dict[str, Any], tolerance: float) -> tuple[Any, tuple, list]:
    """The model, its example args and torch's outputs for them, with the row's sensitivity: an error
    when the outputs barely follow the input, since matching them would then prove little."""
    import torch

    module, args = model.make()
    with torch.no_grad():
        want = torch_outputs(module(*args))
        row["sensitivity"] = relative_difference(torch_outputs(module(*map(_other_input, args))), want)
    if row["sensitivity"] < MIN_SENSITIVITY:
        raise DivimlInputError(
            f"torch's outputs move by {row['sensitivity']:.2g} (relative) when the input "
            f"changes; a comparison at {tolerance:g} would prove little",
            field="model",
            hint="initialise the weights so that the outputs follow the input (lively)",
        )
    row["reference_error"] = _float64_error(module, args, want)
    if row["reference_error"] > tolerance:
        raise DivimlInputError(
            f"torch's float32 outputs differ from its float64 ones by {row['reference_error']:.2g} "
            f"(relative): rounding alone moves them past {tolerance:g}, so a float32 build cannot be held to it",
            field="model",
            hint="initialise the weights so that rounding does not grow through the layers",
        )
    return module, args, want


def _float64_error(module, args: tuple, want: list[np.ndarray]) -> float:
    """How far torch's float32 outputs ``want`` lie from those of ``module`` run in float64 (relative):
    the reference's own rounding error (efficientnet_v2_s under lively weights: 0.67)."""
    import copy

    import torch

    wide = copy.deepcopy(module).double()
    with torch.no_grad():
        exact = torch_outputs(wide(*(a.double() if a.is_floating_point() else a for a in args)))
    return relative_difference(want, exact)
