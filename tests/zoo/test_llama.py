"""The LLaMA-style decoder of the zoo: prefill and decode equal a numpy re-implementation of the same
math, grouped-query attention really shares key/value heads, a decode step continues a prefill,
the KV cache is a weight of the extracted graph, and the blocks repeat kernel for kernel."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.passes.extract import extract
from tvm_diviml.plan import Plan
from tvm_diviml.simulator import memory_per_device
from tvm_diviml.zoo import SMALL_OPTIONS, build_model
from tvm_diviml.zoo.llama import NORM_EPS, ROTARY_BASE
from tvm_diviml.zoo.reference import run_reference

TINY = {**SMALL_OPTIONS["llama"], "batch": 2}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


# ------------------------------------------------------------------ numpy re-implementation
def numpy_llama(params: dict[str, np.ndarray], ids: np.ndarray, heads: int, past=None):
    """Logits (batch, seq, vocab) and each layer's (keys, values) (batch, seq, kv_heads, head_dim) of
    tokens ``ids`` placed after the ``past`` positions (a list of per-layer (keys, values), or None).
    Float64; key/value heads repeated per query head (head h reads kv head h // group)."""
    p = {name: value.astype(np.float64) for name, value in params.items()}
    x = p["token_embeddings.weight"][ids]
    batch, seq, hidden = x.shape
    head_dim = hidden // heads
    offset = 0 if past is None else past[0][0].shape[1]
    fresh = []
    layer = 0
    while f"layers.{layer}.attention_norm.weight" in p:
        prefix = f"layers.{layer}."
        h = rms_norm(x, p[prefix + "attention_norm.weight"])
        query = rotate((h @ p[prefix + "attention.query.weight"].T).reshape(batch, seq, heads, head_dim), offset)
        key = (h @ p[prefix + "attention.key.weight"].T).reshape(batch, seq, -1, head_dim)
        key = rotate(key, offset)
        value = (h @ p[prefix + "attention.value.weight"].T).reshape(batch, seq, -1, head_dim)
        fresh.append((key, value))
        keys, values = (
            (key, value)
            if past is None
            else (np.concatenate([past[layer][0], key], axis=1), np.concatenate([past[layer][1], value], axis=1))
        )
        group = heads // key.shape[2]
        keys, values = np.repeat(keys, group, axis=2), np.repeat(values, group, axis=2)
        scores = np.einsum("bshd,bthd->bhst", query, keys) / np.sqrt(head_dim)
        if past is None:
            scores = np.where(np.tril(np.ones((seq, seq), dtype=bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        context = np.einsum("bhst,bthd->bshd", weights, values).reshape(batch, seq, hidden)
        x = x + context @ p[prefix + "attention.output.weight"].T
        h = rms_norm(x, p[prefix + "mlp_norm.weight"])
        gate = h @ p[prefix + "mlp.gate.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ p[prefix + "mlp.up.weight"].T)) @ p[prefix + "mlp.down.weight"].T
        layer += 1
    return rms_norm(x, p["final_norm.weight"]) @ p["lm_head.weight"].T, fresh


def rms_norm(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + NORM_EPS) * scale


def rotate(x: np.ndarray, offset: int) -> np.ndarray:
    """Rotary embedding of (batch, seq, heads, head_dim) at positions offset.., half-split layout."""
    seq, head_dim = x.shape[1], x.shape[3]
    half = head_dim // 2
    angles = np.arange(offset, offset + seq)[:, None] * ROTARY_BASE ** (-2 * np.arange(half) / head_dim)
    cos = np.cos(np.concatenate([angles, angles], axis=1))[None, :, None, :]
    sin = np.sin(np.concatenate([angles, angles], axis=1))[None, :, None, :]
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


def with_params(built, replaced: dict[str, np.ndarray]):
    """``built`` with some parameters replaced by name (shapes checked)."""
    for name, value in replaced.items():
        assert dict(built.params)[name].shape == value.shape, name
    built.params = [(name, replaced.get(name, value).astype(value.dtype)) for name, value in built.params]
    return built


# ------------------------------------------------------------------ numerics
@pytest.fixture(scope="module")
def prefill():
    built = build_model("llama", TINY)
    (ids,) = built.sample_inputs()
    (logits,) = run_reference(built, [ids])
    return built, ids, logits


def test_prefill_equals_the_numpy_model(prefill):
    built, ids, logits = prefill
    expected, _ = numpy_llama(dict(built.params), ids, TINY["heads"])
    assert logits.shape == (2, 16, 1000)
    np.testing.assert_allclose(logits, expected, **TOLERANCE)


def test_decode_equals_the_numpy_model_on_a_drawn_cache():
    built = build_model("llama", {**TINY, "step": "decode", "cache": 7})
    params = dict(built.params)
    (token,) = built.sample_inputs(seed=1)
    logits, *fresh = run_reference(built, [token])
    past = [(params[f"caches.{i}.key"], params[f"caches.{i}.value"]) for i in range(TINY["layers"])]
    expected, expected_fresh = numpy_llama(params, token, TINY["heads"], past)
    assert logits.shape == (2, 1, 1000) and len(fresh) == 2 * TINY["layers"]
    np.testing.assert_allclose(logits, expected, **TOLERANCE)
    np.testing.assert_allclose(np.stack(fresh), np.stack([t for kv in expected_fresh for t in kv]), **TOLERANCE)


def test_decode_of_token_t_continues_the_prefill_of_tokens_before_it(prefill):
    """The strongest end-to-end check: with the keys and values of tokens [0, t) as its cache, one
    decode step of token t gives prefill's logits at position t, and that token's keys and values."""
    built, ids, logits = prefill
    t = 9
    decode = build_model("llama", {**TINY, "step": "decode", "cache": t})
    shared = [(name, value) for name, value in decode.params if not name.startswith("caches.")]
    assert [n for n, _ in shared] == [n for n, _ in built.params]  # same seed, same weights
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(shared, built.params))
    _, cache = numpy_llama(dict(built.params), ids[:, :t], TINY["heads"])
    _, whole = numpy_llama(dict(built.params), ids[:, : t + 1], TINY["heads"])
    decode = with_params(
        decode, {f"caches.{i}.{part}": kv[j] for i, kv in enumerate(cache) for j, part in enumerate(("key", "value"))}
    )
    step_logits, *fresh = run_reference(decode, [ids[:, t : t + 1]])
    np.testing.assert_allclose(step_logits[:, 0], logits[:, t], **TOLERANCE)
    np.testing.assert_allclose(
        np.stack(fresh), np.stack([part[:, t : t + 1] for kv in whole for part in kv]), **TOLERANCE
    )


def test_grouped_query_attention_shares_one_kv_head_across_query_heads():
    """kv_heads=1 gives what full multi-head attention gives with that one key/value head repeated
    for every query head, while storing a quarter of the key/value weights."""
    options = {**TINY, "layers": 1, "batch": 1}
    grouped = build_model("llama", {**options, "kv_heads": 1})
    full = build_model("llama", {**options, "kv_heads": options["heads"]})
    weights = dict(grouped.params)
    repeated = {
        name: np.tile(value, (options["heads"], 1)) if ".key." in name or ".value." in name else value
        for name, value in weights.items()
    }
    full = with_params(full, repeated)
    head_dim = options["hidden"] // options["heads"]
    saved = 2 * (options["heads"] - 1) * head_dim * options["hidden"]  # key and value, one layer
    assert sum(w.size for _, w in full.params) - sum(w.size for _, w in grouped.params) == saved
    (ids,) = grouped.sample_inputs()
    (shared,) = run_reference(grouped, [ids])
    (repeated_heads,) = run_reference(full, [ids])
    np.testing.assert_allclose(shared, repeated_heads, **TOLERANCE)


# ------------------------------------------------------------------ options
@pytest.mark.parametrize(
    "options",
    [
        {"heads": 4, "kv_heads": 3},  # query heads not divisible into kv groups
        {"step": "sample"},  # no such entry point
        {"hidden": 60, "heads": 4},  # head dimension 15: rotary pairs need it even
        {"hidden": 64, "heads": 5, "kv_heads": 1},  # hidden not divisible by heads
        {"step": "decode", "cache": 0},  # nothing to attend to
    ],
)
def test_inconsistent_options_are_input_errors(options):
    with pytest.raises(DivimlInputError):
        build_model("llama", {**SMALL_OPTIONS["llama"], **options})


def test_a_vocabulary_smaller_than_any_default_range_is_sampled_inside_it():
    """Token ids are drawn below the embedding's rows (a vocabulary of 50 was refused when every id was
    drawn from [0, 100))."""
    (ids,) = build_model("llama", {**SMALL_OPTIONS["llama"], "vocab": 50}).sample_inputs()
    assert ids.max() < 50 and ids.max() > 2


def test_models_command_lists_llama(capsys):
    from tvm_diviml.cli import main

    main(["models"])
    assert "llama" in capsys.readouterr().out


# ------------------------------------------------------------------ the extracted graph
def test_kv_cache_is_a_weight_counted_in_memory():
    """Each layer's cache is a weight of the graph, read by that layer's attention alone, and a
    device running the step holds it: a longer cache adds exactly its bytes to the weights."""

    def decode_graph(cache: int):
        built = build_model("llama", {**TINY, "step": "decode", "cache": cache})
        return built, extract(built.mod, built.entry, name=built.name).graph

    built, graph = decode_graph(4)
    _, longer = decode_graph(12)
    head_dim = TINY["hidden"] // TINY["heads"]
    cache_ids = [f"caches.{i}.{part}" for i in range(TINY["layers"]) for part in ("key", "value")]
    for wid in cache_ids:
        assert graph.weights[wid] == TINY["batch"] * 4 * TINY["kv_heads"] * head_dim * 4
        assert len([k for k in graph.kernels.values() if wid in k.weights]) == 1
    assert sum(graph.weights.values()) == sum(value.nbytes for _, value in built.params)
    everything = list(graph.kernels)
    assert (
        longer.weight_bytes(longer.kernels) - graph.weight_bytes(everything)
        == sum(longer.weights[wid] - graph.weights[wid] for wid in cache_ids)
        > 0
    )
    plan = Plan({kernel: "cpu0" for kernel in everything}, order={"cpu0": graph.topo_order})
    assert memory_per_device(graph, plan)["cpu0"] >= sum(value.nbytes for _, value in built.params)


def blocks(graph) -> list[list[str]]:
    """Kernels in binding order, cut where each layer's first norm reads its weight; the last block
    ends where the final norm begins."""
    kernels = list(graph.kernels.values())
    starts = [i for i, k in enumerate(kernels) if any(w.endswith(".attention_norm.weight") for w in k.weights)]
    end = next(i for i, k in enumerate(kernels) if "final_norm.weight" in k.weights)
    return [[k.attrs["primfunc_hash"] for k in kernels[a:b]] for a, b in zip(starts, starts[1:] + [end])]


@pytest.mark.parametrize("step", ["prefill", "decode"])
def test_every_block_is_the_same_primfunc_sequence(step):
    built = build_model("llama", {**TINY, "layers": 3, "step": step})
    graph = extract(built.mod, built.entry, name=built.name).graph
    sequences = blocks(graph)
    assert len(sequences) == 3 and len(sequences[0]) > 5
    assert sequences[1] == sequences[0] and sequences[2] == sequences[0]
