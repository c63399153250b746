"""Transformer entries of the zoo: BERT-base, GPT-2 small and ViT-B/16.

All three are stacks of one block (self-attention and a GELU MLP, each wrapped in a residual add
and a layer norm); they differ in where the norms sit (BERT normalises after each add, GPT-2 and
ViT before), in the causal mask and in the GELU formula. Weight shapes follow the published
models, so the parameter counts match theirs exactly.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, te
from tvm.relax.frontend import nn

from .registry import register


class SelfAttention(nn.Module):
    """Multi-head self-attention written as matmul, softmax, matmul, so that the score and
    context products are kernels of their own in the extracted graph."""

    def __init__(self, hidden: int, heads: int, causal: bool):
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not a multiple of heads={heads}")
        self.heads = heads
        self.causal = causal
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        batch, seq, hidden = x.shape
        head_dim = hidden // self.heads

        def split_heads(t: nn.Tensor, axes: list[int]) -> nn.Tensor:
            return nn.op.permute_dims(nn.op.reshape(t, [batch, seq, self.heads, head_dim]), axes)

        query = split_heads(self.query(x), [0, 2, 1, 3])  # (batch, heads, seq, head_dim)
        key = split_heads(self.key(x), [0, 2, 3, 1])  # (batch, heads, head_dim, seq)
        value = split_heads(self.value(x), [0, 2, 1, 3])
        scores = nn.op.matmul(query, key) * (1.0 / math.sqrt(head_dim))
        if self.causal:
            scores = mask_future(scores)
        context = nn.op.matmul(nn.op.softmax(scores, axis=-1), value)
        context = nn.op.reshape(nn.op.permute_dims(context, [0, 2, 1, 3]), [batch, seq, hidden])
        return self.output(context)


class FeedForward(nn.Module):
    """The position-wise MLP; GPT-2 uses the tanh approximation of GELU, BERT and ViT the erf form."""

    def __init__(self, hidden: int, inner: int, gelu_approximation: str | None):
        self.up = nn.Linear(hidden, inner)
        self.down = nn.Linear(inner, hidden)
        self.gelu_approximation = gelu_approximation

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.down(nn.op.gelu(self.up(x), approximate=self.gelu_approximation))


class TransformerBlock(nn.Module):
    """One layer; ``norm_first`` picks pre-LN (GPT-2, ViT) or post-LN (BERT)."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        inner: int,
        *,
        norm_first: bool,
        eps: float,
        causal: bool = False,
        gelu_approximation: str | None = None,
    ):
        self.norm_first = norm_first
        self.attention = SelfAttention(hidden, heads, causal)
        self.attention_norm = nn.LayerNorm(hidden, eps)
        self.mlp = FeedForward(hidden, inner, gelu_approximation)
        self.mlp_norm = nn.LayerNorm(hidden, eps)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        if self.norm_first:
            x = x + self.attention(self.attention_norm(x))
            return x + self.mlp(self.mlp_norm(x))
        x = self.attention_norm(x + self.attention(x))
        return self.mlp_norm(x + self.mlp(x))


def mask_future(scores: nn.Tensor) -> nn.Tensor:
    """Scores (batch, heads, query, key) with every later key set to the dtype's lowest value, so
    softmax gives it exactly zero weight. One elementwise TE kernel: no mask constant, which the
    VM would pin to the first device."""

    def compute(s: te.Tensor) -> te.Tensor:
        lowest = tvm.tirx.min_value(s.dtype)
        return te.compute(
            s.shape, lambda b, h, i, j: tvm.tirx.if_then_else(j <= i, s[b, h, i, j], lowest), name="causal_mask"
        )

    return nn.op.tensor_expr_op(compute, "causal_mask", [scores])


def slice_along(x: nn.Tensor, axis: int, begin: int, end: int, name: str) -> nn.Tensor:
    """``x[begin:end]`` along ``axis`` as one strided_slice kernel (nn has no slicing). Position
    embeddings are read this way rather than looked up with ``arange``: no kernel without inputs."""
    sliced = relax.op.strided_slice(x._expr, axes=[axis], begin=[begin], end=[end])
    return nn.op.wrap_nested(sliced, name=name)


def first_token(x: nn.Tensor) -> nn.Tensor:
    """``x[:, 0, :]``: the [CLS] position that BERT's pooler and ViT's head read."""
    batch, _, hidden = x.shape
    return nn.op.reshape(slice_along(x, 1, 0, 1, "first_token"), [batch, hidden])


def tied_lm_head(x: nn.Tensor, embedding: nn.Parameter) -> nn.Tensor:
    """Logits ``x @ embedding^T`` as an einsum, as an ONNX export may write it. The legalization reads
    the embedding through a transposed copy (``passes/legalize._einsum``), which LiftTransformParams
    makes once, at upload: read as stored, the head ran at 1.7 GFLOP/s."""
    return nn.op.wrap_nested(relax.op.einsum([x._expr, embedding._expr], "bsh,vh->bsv"), name="lm_head")


class Bert(nn.Module):
    """BERT encoder: word + position + token-type embeddings, post-LN blocks, tanh pooler on [CLS]."""

    def __init__(self, layers: int, seq: int, hidden: int, heads: int, intermediate: int, vocab: int):
        eps = 1e-12
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max(512, seq), hidden)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps)
        self.layers = nn.ModuleList(
            [TransformerBlock(hidden, heads, intermediate, norm_first=False, eps=eps) for _ in range(layers)]
        )
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, input_ids: nn.Tensor) -> tuple[nn.Tensor, nn.Tensor]:
        positions = slice_along(self.position_embeddings.weight, 0, 0, input_ids.shape[1], "positions")
        segment = slice_along(self.token_type_embeddings.weight, 0, 0, 1, "token_type")  # all in segment 0
        x = self.word_embeddings(input_ids) + positions + segment
        x = self.layers(self.embedding_norm(x))
        return x, nn.op.tanh(self.pooler(first_token(x)))


class Gpt2(nn.Module):
    """GPT-2 over a prompt: pre-LN causal blocks and an LM head tied to the token embedding."""

    def __init__(self, layers: int, hidden: int, heads: int, seq: int, vocab: int):
        eps = 1e-5
        self.token_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max(1024, seq), hidden)
        self.layers = nn.ModuleList(
            [
                TransformerBlock(
                    hidden, heads, 4 * hidden, norm_first=True, eps=eps, causal=True, gelu_approximation="tanh"
                )
                for _ in range(layers)
            ]
        )
        self.final_norm = nn.LayerNorm(hidden, eps)

    def forward(self, input_ids: nn.Tensor) -> nn.Tensor:
        positions = slice_along(self.position_embeddings.weight, 0, 0, input_ids.shape[1], "positions")
        x = self.token_embeddings(input_ids) + positions
        x = self.final_norm(self.layers(x))
        return tied_lm_head(x, self.token_embeddings.weight)


class VisionTransformer(nn.Module):
    """ViT: a strided convolution cuts patches, a class token and learned positions are added,
    pre-LN blocks follow and a linear head classifies the class token."""

    def __init__(self, resolution: int, patch: int, layers: int, hidden: int, heads: int, mlp: int, classes: int):
        if resolution % patch:
            raise ValueError(f"resolution={resolution} is not a multiple of patch={patch}")
        eps = 1e-6
        self.patch_embedding = nn.Conv2D(3, hidden, patch, stride=patch)
        self.class_token = nn.Parameter((1, 1, hidden))
        self.position_embeddings = nn.Parameter((1, (resolution // patch) ** 2 + 1, hidden))
        self.layers = nn.ModuleList(
            [TransformerBlock(hidden, heads, mlp, norm_first=True, eps=eps) for _ in range(layers)]
        )
        self.final_norm = nn.LayerNorm(hidden, eps)
        self.head = nn.Linear(hidden, classes)

    def forward(self, pixel_values: nn.Tensor) -> nn.Tensor:
        patches = self.patch_embedding(pixel_values)  # (batch, hidden, rows, columns)
        batch, hidden, rows, columns = patches.shape
        tokens = nn.op.permute_dims(nn.op.reshape(patches, [batch, hidden, rows * columns]), [0, 2, 1])
        class_tokens = nn.op.broadcast_to(self.class_token, [batch, 1, hidden])
        x = nn.op.concat([class_tokens, tokens], dim=1) + self.position_embeddings
        x = self.final_norm(self.layers(x))
        return self.head(first_token(x))


@register("bert_base", "BERT-base encoder (post-LN, GELU); token ids -> last hidden state and pooled [CLS]")
def bert_base(layers=12, seq=128, hidden=768, heads=12, intermediate=3072, vocab=30522, batch=1):
    return Bert(layers, seq, hidden, heads, intermediate, vocab), {"input_ids": ((batch, seq), "int32")}


@register("gpt2", "GPT-2 small over a prompt (pre-LN, causal, tied LM head); token ids -> logits")
def gpt2(layers=12, hidden=768, heads=12, seq=128, vocab=50257, batch=1):
    return Gpt2(layers, hidden, heads, seq, vocab), {"input_ids": ((batch, seq), "int32")}


@register("vit_b16", "ViT-B/16 image classifier (patch conv, class token, pre-LN blocks)")
def vit_b16(resolution=224, patch=16, layers=12, hidden=768, heads=12, mlp=3072, classes=1000, batch=1):
    model = VisionTransformer(resolution, patch, layers, hidden, heads, mlp, classes)
    return model, {"pixel_values": ((batch, 3, resolution, resolution), "float32")}
