"""A LLaMA-style decoder: RMSNorm, rotary position embeddings, grouped-query attention, SwiGLU MLP.

Every block is the same computation on its own weights, so the extracted graph repeats one
PrimFunc sequence per block (what the symmetric solver looks for). Two entry points, chosen with
the ``step`` option, both named ``forward``:

- ``prefill``: a prompt of ``seq`` tokens -> logits for every position (causal attention);
- ``decode``: one new token at position ``cache`` attending to a KV cache of ``cache`` earlier
  positions -> its logits and its post-rotary keys and values ((batch, 1, kv_heads, head_dim) per
  layer, key 0, value 0, key 1, ...: what the caller appends). The cache is *parameters after the
  input* (``caches.<layer>.key``/``.value``), like the weights: placed once on the device that reads
  it, never copied per inference, and counted in that device's memory by the simulator.

Query head ``h`` reads key/value head ``h // (heads // kv_heads)``: a broadcast, never a copy.
"""

from __future__ import annotations

import math

import tvm
from tvm import te
from tvm.relax.frontend import nn

from .registry import register
from .transformers import mask_future

STEPS = ("prefill", "decode")
ROTARY_BASE = 10000.0
NORM_EPS = 1e-5


def rotary(x: nn.Tensor, offset: int) -> nn.Tensor:
    """Rotate ``x`` (batch, seq, heads, head_dim) by the angles of positions ``offset + s``, in the
    half-split layout of the Hugging Face LLaMA: dimension ``d`` pairs with ``d ± head_dim/2`` and
    turns by ``position * ROTARY_BASE ** (-2 (d mod head_dim/2) / head_dim)``. One TE kernel that
    computes the angles itself: no cos/sin table, which as a constant the VM would pin to the
    first device, and which as a weight every device would have to hold."""

    def compute(t: te.Tensor) -> te.Tensor:
        head_dim = int(t.shape[3])
        half = head_dim // 2

        def rotate(b, s, h, d):
            pair = d % half
            angle = tvm.tirx.Cast(t.dtype, s + offset) * tvm.tirx.exp(
                tvm.tirx.Cast(t.dtype, pair) * (-2.0 * math.log(ROTARY_BASE) / head_dim)
            )
            partner = tvm.tirx.if_then_else(d < half, -t[b, s, h, d + half], t[b, s, h, d - half])
            return t[b, s, h, d] * tvm.tirx.cos(angle) + partner * tvm.tirx.sin(angle)

        return te.compute(t.shape, rotate, name="rotary")

    return nn.op.tensor_expr_op(compute, "rotary", [x])


class Attention(nn.Module):
    """Grouped-query attention: ``heads`` query heads in ``kv_heads`` groups, one key/value head
    per group. Scores are a 5-D matmul (batch, kv_heads, group, query, key) whose key side
    broadcasts over the group axis."""

    def __init__(self, hidden: int, heads: int, kv_heads: int):
        self.heads, self.kv_heads = heads, kv_heads
        self.head_dim = hidden // heads
        self.query = nn.Linear(hidden, hidden, bias=False)
        self.key = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.value = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.output = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: nn.Tensor, past: KVCache | None) -> tuple[nn.Tensor, nn.Tensor, nn.Tensor]:
        """Attention output, and this step's keys (rotated) and values (batch, seq, kv_heads, head_dim)."""
        batch, seq, hidden = x.shape
        group, head_dim = self.heads // self.kv_heads, self.head_dim
        offset = 0 if past is None else past.key.shape[1]
        query = rotary(nn.op.reshape(self.query(x), [batch, seq, self.heads, head_dim]), offset)
        key = rotary(nn.op.reshape(self.key(x), [batch, seq, self.kv_heads, head_dim]), offset)
        value = nn.op.reshape(self.value(x), [batch, seq, self.kv_heads, head_dim])
        keys, values = (
            (key, value)
            if past is None
            else (nn.op.concat([past.key, key], dim=1), nn.op.concat([past.value, value], dim=1))
        )
        known = keys.shape[1]
        query = nn.op.permute_dims(
            nn.op.reshape(query, [batch, seq, self.kv_heads, group, head_dim]), [0, 2, 3, 1, 4]
        )  # (batch, kv, group, seq, dim)
        keys = nn.op.reshape(nn.op.permute_dims(keys, [0, 2, 3, 1]), [batch, self.kv_heads, 1, head_dim, known])
        values = nn.op.reshape(nn.op.permute_dims(values, [0, 2, 1, 3]), [batch, self.kv_heads, 1, known, head_dim])
        scores = nn.op.matmul(query, keys) * (1.0 / math.sqrt(head_dim))  # (batch, kv, group, seq, known)
        if past is None:  # prefill: query i sees keys 0..i; a decode token sees the whole cache
            flat = mask_future(nn.op.reshape(scores, [batch, self.heads, seq, known]))
            scores = nn.op.reshape(flat, [batch, self.kv_heads, group, seq, known])
        context = nn.op.matmul(nn.op.softmax(scores, axis=-1), values)  # (batch, kv, group, seq, dim)
        context = nn.op.reshape(nn.op.permute_dims(context, [0, 3, 1, 2, 4]), [batch, seq, hidden])
        return self.output(context), key, value


class SwiGlu(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.down(nn.op.silu(self.gate(x)) * self.up(x))


class DecoderBlock(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, intermediate: int):
        self.attention_norm = nn.RMSNorm(hidden, -1, NORM_EPS, bias=False)
        self.attention = Attention(hidden, heads, kv_heads)
        self.mlp_norm = nn.RMSNorm(hidden, -1, NORM_EPS, bias=False)
        self.mlp = SwiGlu(hidden, intermediate)

    def forward(self, x: nn.Tensor, past: KVCache | None) -> tuple[nn.Tensor, nn.Tensor, nn.Tensor]:
        attended, key, value = self.attention(self.attention_norm(x), past)
        x = x + attended
        return x + self.mlp(self.mlp_norm(x)), key, value


class KVCache(nn.Module):
    """One layer's keys (rotated) and values of the ``length`` earlier positions. Parameters, not
    inputs: the build places each once on the device of the layer that reads it and the simulator
    counts it in that device's memory, like a weight."""

    def __init__(self, batch: int, length: int, kv_heads: int, head_dim: int):
        self.key = nn.Parameter((batch, length, kv_heads, head_dim))
        self.value = nn.Parameter((batch, length, kv_heads, head_dim))


class Llama(nn.Module):
    def __init__(
        self,
        layers: int,
        hidden: int,
        heads: int,
        kv_heads: int,
        intermediate: int,
        vocab: int,
        batch: int,
        cache: int | None,
    ):
        self.token_embeddings = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList([DecoderBlock(hidden, heads, kv_heads, intermediate) for _ in range(layers)])
        self.final_norm = nn.RMSNorm(hidden, -1, NORM_EPS, bias=False)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        # Declared last, so the caches are the last parameters and the weights before them are drawn
        # exactly as in prefill: the two steps of one seed share their weights.
        self.caches = (
            None
            if cache is None
            else nn.ModuleList([KVCache(batch, cache, kv_heads, hidden // heads) for _ in range(layers)])
        )

    def forward(self, input_ids: nn.Tensor):
        x = self.token_embeddings(input_ids)
        fresh = []
        for index, layer in enumerate(self.layers):
            x, key, value = layer(x, None if self.caches is None else self.caches[index])
            fresh += [key, value]
        logits = self.lm_head(self.final_norm(x))
        return logits if self.caches is None else (logits, *fresh)


@register(
    "llama",
    "LLaMA-style decoder (RMSNorm, rotary, GQA, SwiGLU); step=prefill: token ids -> logits; "
    "step=decode: one token + KV cache -> logits, new keys/values",
)
def llama(
    layers=8,
    hidden=512,
    heads=8,
    kv_heads=2,
    intermediate=1376,
    vocab=32000,
    seq=128,
    batch=1,
    step="prefill",
    cache=128,
):
    """``seq`` is the prompt length of prefill; decode reads one token and a cache of ``cache`` positions
    per layer, given as parameters after the input (``caches.<layer>.key``/``.value``)."""
    if step not in STEPS:
        raise ValueError(f"step={step} is not one of {', '.join(STEPS)}")
    if hidden % heads:
        raise ValueError(f"hidden={hidden} is not a multiple of heads={heads}")
    if heads % kv_heads:
        raise ValueError(f"heads={heads} is not a multiple of kv_heads={kv_heads}")
    if (hidden // heads) % 2:
        raise ValueError(f"head dimension hidden/heads={hidden // heads} is odd; rotary embeddings need it even")
    if step == "decode" and cache < 1:
        raise ValueError(f"cache={cache}: decode needs at least one cached position")
    decode = step == "decode"
    model = Llama(layers, hidden, heads, kv_heads, intermediate, vocab, batch, cache if decode else None)
    return model, {"input_ids": ((batch, 1 if decode else seq), "int32")}
