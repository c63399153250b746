"""A model of equal parallel branches: the smallest workload on which two devices can run at once.

``twin_branch`` feeds one input to ``branches`` identical multilayer perceptrons (``depth`` layers
of Linear + ReLU each) and adds their results. Every branch extracts to its own chain of ``depth``
kernels with the same FLOPs, and the final sum is a kernel of its own, so a plan that gives each
branch its own device lets the concurrent executor overlap them completely; the sequential one
cannot, which is what the comparison between the two executors needs.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend import nn

from .registry import register


class Branch(nn.Module):
    """``depth`` x (Linear(hidden, hidden) + ReLU)."""

    def __init__(self, hidden: int, depth: int):
        self.layers = nn.ModuleList([nn.Linear(hidden, hidden) for _ in range(depth)])

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        for layer in self.layers:
            x = nn.op.relu(layer(x))
        return x


class TwinBranch(nn.Module):
    def __init__(self, branches: int, depth: int, hidden: int):
        self.branches = nn.ModuleList([Branch(hidden, depth) for _ in range(branches)])

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return sum_of([branch(x) for branch in self.branches])


def sum_of(tensors: list[nn.Tensor]) -> nn.Tensor:
    """The elementwise sum written as a reduction over the stacked tensors. A plain ``a + b`` would
    be fused into the last kernel of one branch, leaving that branch heavier and the sum inside it;
    a reduction is never fused into a matmul, so the sum stays a kernel of its own."""
    stacked = relax.op.stack([t._expr for t in tensors], axis=0)
    return nn.op.wrap_nested(relax.op.sum(stacked, axis=0), name="branch_sum")


@register("twin_branch", "equal parallel MLP branches summed: the smallest model two devices can overlap")
def twin_branch(branches: int = 2, depth: int = 4, hidden: int = 256, batch: int = 16):
    for name, value in {"branches": branches, "depth": depth, "hidden": hidden, "batch": batch}.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return TwinBranch(branches, depth, hidden), {"x": ((batch, hidden), "float32")}
