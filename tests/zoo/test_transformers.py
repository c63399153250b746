"""The transformer zoo entries: they export, run and have the published models' sizes."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.zoo import BuiltModel, build_model, init_weights
from tvm_diviml.zoo.reference import run_reference

SMALL_BERT = {"layers": 2, "seq": 16, "hidden": 64, "heads": 4, "intermediate": 128, "vocab": 1000}
SMALL_GPT2 = {"layers": 2, "seq": 16, "hidden": 64, "heads": 4, "vocab": 1000}
SMALL_VIT = {"resolution": 32, "patch": 16, "layers": 2, "hidden": 64, "heads": 4, "mlp": 128, "classes": 10}


def test_small_bert_runs():
    built = build_model("bert_base", SMALL_BERT)
    hidden, pooled = run_reference(built)
    assert hidden.shape == (1, 16, 64) and pooled.shape == (1, 64)
    assert np.isfinite(hidden).all() and np.isfinite(pooled).all()


def test_small_vit_runs_on_a_batch():
    built = build_model("vit_b16", {**SMALL_VIT, "batch": 2})
    (logits,) = run_reference(built)
    assert logits.shape == (2, 10) and np.isfinite(logits).all()
    assert not np.allclose(logits[0], logits[1])  # the images differ, so must the classes


@pytest.mark.parametrize("causal", [True, False])
def test_only_causal_attention_ignores_later_positions(causal):
    """With the mask, earlier outputs ignore a change at the last position; without it they do not.
    One layer compiles in a second, where all of GPT-2 takes 12 s (LLVM spends 8 s on its fused
    tanh-GELU kernel alone), so the fast suite checks the mask here."""
    from tvm.relax.frontend import nn

    from tvm_diviml.zoo.transformers import SelfAttention

    shape = (2, 8, 16)
    mod, named = SelfAttention(16, 2, causal).export_tvm({"forward": {"x": nn.spec.Tensor(list(shape), "float32")}})
    weights = init_weights([(name, tuple(int(d) for d in p.shape), str(p.dtype)) for name, p in named], seed=0)
    built = BuiltModel("attention", mod, "forward", [("x", shape, "float32")], weights)
    (x,) = built.sample_inputs()
    x[1] = x[0]
    x[1, -1] += 1.0
    (out,) = run_reference(built, [x])
    assert np.allclose(out[0, :-1], out[1, :-1], rtol=1e-5, atol=1e-6) == causal
    assert np.abs(out[0, -1] - out[1, -1]).max() > 1e-3


@pytest.fixture(scope="module")
def gpt2_prompts_differing_in_last_token():
    """One run of a batch of two prompts that differ only in their last token."""
    built = build_model("gpt2", {**SMALL_GPT2, "batch": 2})
    (ids,) = built.sample_inputs()
    ids[1] = ids[0]
    ids[1, -1] = (ids[0, -1] + 1) % 100
    (logits,) = run_reference(built, [ids])
    return logits


@pytest.mark.slow  # about 12 s, most of it LLVM compiling the fused tanh-GELU kernel
def test_small_gpt2_runs(gpt2_prompts_differing_in_last_token):
    logits = gpt2_prompts_differing_in_last_token
    assert logits.shape == (2, 16, 1000) and np.isfinite(logits).all()


@pytest.mark.slow
def test_gpt2_logits_are_causal(gpt2_prompts_differing_in_last_token):
    logits = gpt2_prompts_differing_in_last_token
    np.testing.assert_allclose(logits[0, :-1], logits[1, :-1], rtol=1e-5, atol=1e-6)
    assert np.abs(logits[0, -1] - logits[1, -1]).max() > 1e-3


def test_gpt2_embedding_stays_one_weight_after_lifting():
    """The LM head reads the token embedding itself, so lifting weight transforms out of the graph
    does not add a transposed copy of it."""
    from tvm import relax

    built = build_model("gpt2", SMALL_GPT2)
    lifted = relax.transform.LiftTransformParams()(relax.transform.LegalizeOps()(built.mod))
    forward = lifted["forward"]
    weights = forward.params[int(forward.attrs["num_input"]) :]
    shapes = [tuple(int(d) for d in w.ty.shape) for w in weights]
    assert sum(shape in ((1000, 64), (64, 1000)) for shape in shapes) == 1


@pytest.mark.parametrize(
    "name, count",
    [
        ("bert_base", 109_482_240),  # embeddings (512 positions, 2 token types), 12 layers, pooler
        ("gpt2", 124_439_808),  # token embedding counted once (tied LM head), 1024 positions
        ("vit_b16", 86_567_656),  # patch conv, class token, 197 positions, 12 layers, 1000-class head
    ],
)
def test_parameter_counts_match_the_published_models(name, count):
    built = build_model(name)
    assert sum(weights.size for _, weights in built.params) == count


@pytest.mark.parametrize(
    "name, options",
    [
        ("bert_base", {"hidden": 64, "heads": 5}),
        ("vit_b16", {"resolution": 40, "patch": 16}),
    ],
)
def test_inconsistent_options_are_input_errors(name, options):
    with pytest.raises(DivimlInputError):
        build_model(name, options)
