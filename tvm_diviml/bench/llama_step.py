"""A LLaMA-style decode step in torch, for the frameworks suite: one new token attends to a KV cache.

RMS norm, rotary position embedding, grouped-query attention and a SwiGLU feed-forward per layer, a
tied-free LM head; the cache of ``cache`` past positions is an input, the step returns the logits
and the new token's keys and values. Plain torch, so that torch eager, ONNX Runtime (through
``torch.onnx``) and diviml (through ``torch.export``) all run the same model.
"""

from __future__ import annotations

import torch
from torch import nn


class _RmsNorm(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


class _Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, intermediate: int):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.attention_norm, self.ffn_norm = _RmsNorm(hidden), _RmsNorm(hidden)
        self.q = nn.Linear(hidden, heads * self.dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.o = nn.Linear(heads * self.dim, hidden, bias=False)
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x, cos, sin, past_k, past_v):
        h = self.attention_norm(x)
        q = _rotate(self.q(h).view(1, self.heads, self.dim), cos, sin)
        k = _rotate(self.k(h).view(1, self.kv_heads, self.dim), cos, sin)
        v = self.v(h).view(1, self.kv_heads, self.dim)
        keys = torch.cat([past_k, k.unsqueeze(2)], dim=2)  # (1, kv_heads, cache + 1, dim)
        values = torch.cat([past_v, v.unsqueeze(2)], dim=2)
        group = self.heads // self.kv_heads
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = torch.matmul(q.unsqueeze(2), keys.transpose(-1, -2)) / self.dim**0.5  # (1, heads, 1, cache+1)
        attended = torch.matmul(torch.softmax(scores, dim=-1), values).reshape(1, self.heads * self.dim)
        x = x + self.o(attended)
        h = self.ffn_norm(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h)), k, v


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class LlamaDecodeStep(nn.Module):
    """One decode step of a LLaMA-style model (defaults: 6 layers of 768, 12 heads over 4 KV heads,
    a 32,000-token vocabulary, 256 cached positions: 86 M parameters, 344 MB)."""

    def __init__(self, layers=6, hidden=768, heads=12, kv_heads=4, intermediate=2048, vocab=32000, cache=256):
        super().__init__()
        self.cache, self.kv_heads, self.dim = cache, kv_heads, hidden // heads
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(_Layer(hidden, heads, kv_heads, intermediate) for _ in range(layers))
        self.norm = _RmsNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        angles = cache / 10000 ** (torch.arange(0, self.dim, 2).float() / self.dim)  # the new token's position
        self.register_buffer("cos", torch.cat([angles.cos(), angles.cos()]))
        self.register_buffer("sin", torch.cat([angles.sin(), angles.sin()]))

    def forward(self, token, past_keys, past_values):
        """token (1, 1) int64; past_keys and past_values (layers, 1, kv_heads, cache, dim)."""
        x = self.embed(token).view(1, -1)
        new_keys, new_values = [], []
        for index, layer in enumerate(self.layers):
            x, k, v = layer(x, self.cos, self.sin, past_keys[index], past_values[index])
            new_keys.append(k)
            new_values.append(v)
        return self.head(self.norm(x)), torch.stack(new_keys), torch.stack(new_values)

    def example_inputs(self) -> tuple:
        shape = (len(self.layers), 1, self.kv_heads, self.cache, self.dim)
        generator = torch.Generator().manual_seed(0)
        return (
            torch.randint(0, self.embed.num_embeddings, (1, 1), generator=generator),
            torch.randn(shape, generator=generator),
            torch.randn(shape, generator=generator),
        )
