"""The values each integer input of a Relax function may take: inside every table it indexes.

Token ids, token types and positions index their embedding tables through ``take`` in fast mode,
which reads out of bounds unchecked: ids drawn from [0, 100) gave a BERT's two-row token-type table
NaN outputs and made an ``Embedding(2, 65536)`` segfault. An integer input whose values reach an
indexing operator unchanged (through reshapes, casts, slices, broadcasts and the like) takes values
in [0, the smallest extent it indexes); so does one that an assertion checks against a constant
(torch's ``one_hot`` imports as comparisons and an ``assert_op``). Any other integer input takes
``FLAG_RANGE``.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax
from tvm.ir import GenericConst, Op

# The values of an integer input that indexes no table (an attention mask; a mask whose running sum
# makes positions): those of a flag, which keep any index computed from them small.
FLAG_RANGE = (0, 2)

# operators whose outputs hold values of these arguments only (rearranged, sliced, repeated, cast)
KEEPS_VALUES = {
    **dict.fromkeys(
        [
            "relax.reshape",
            "relax.astype",
            "relax.expand_dims",
            "relax.squeeze",
            "relax.broadcast_to",
            "relax.strided_slice",
            "relax.dynamic_strided_slice",
            "relax.permute_dims",
            "relax.flatten",
            "relax.layout_transform",
            "relax.concat",
            "relax.stack",
            "relax.split",
            "relax.tile",
            "relax.repeat",
            "relax.flip",
            "relax.sort",
            "relax.max",
            "relax.min",
            "relax.take",
            "relax.gather_elements",
            "relax.gather_nd",
            "relax.index_tensor",
        ],
        (0,),
    ),
    "relax.where": (1, 2),  # ONNX's Gather indexes with where(idx < 0, idx + extent, idx)
}


def integer_input_ranges(mod, entry: str, inputs: list[tuple[str, tuple[int, ...], str]]) -> dict[str, tuple[int, int]]:
    """[low, high) for each integer input among ``inputs`` (the leading parameters of ``mod[entry]``,
    as (name, shape, dtype)): below the smallest static extent its values index, else ``FLAG_RANGE``;
    never beyond what the input's dtype holds."""
    func = mod[entry]
    flow = _IndexFlow(func.params[: len(inputs)])
    for block in func.body.blocks:
        for binding in block.bindings:
            flow.bind(binding.var, binding.value)
    ranges = {}
    for position, (name, _, dtype) in enumerate(inputs):
        if np.issubdtype(np.dtype(dtype), np.integer):
            high = flow.bounds.get(position, FLAG_RANGE[1])
            ranges[name] = (FLAG_RANGE[0], min(high, int(np.iinfo(np.dtype(dtype)).max) + 1))
    return ranges


class _IndexFlow:
    """Which inputs' values each variable holds, and the smallest extent each input indexes."""

    def __init__(self, params):
        self.holds: dict[relax.Var, frozenset[int]] = {param: frozenset([i]) for i, param in enumerate(params)}
        self.values: dict[relax.Var, relax.Expr] = {}
        self.bounds: dict[int, int] = {}

    def bind(self, var: relax.Var, value: relax.Expr) -> None:
        self.values[var] = value
        if isinstance(value, relax.Call) and isinstance(value.op, Op):
            if value.op.name == "relax.assert_op":
                self._checked_bounds(value.args[0])
            for index, extent in _indexed_extents(value, self._fields):
                self._bound(index, extent)
        held = self.inputs_in(value)
        if held:
            self.holds[var] = held

    def inputs_in(self, expr: relax.Expr) -> frozenset[int]:
        """The inputs whose values ``expr`` holds unchanged."""
        if isinstance(expr, relax.Var):
            return self.holds.get(expr, frozenset())
        if isinstance(expr, relax.Tuple):
            return frozenset().union(*(self.inputs_in(field) for field in expr.fields))
        if isinstance(expr, relax.TupleGetItem):
            fields = self._fields(expr.tuple_value)
            return self.inputs_in(fields[expr.index] if fields else expr.tuple_value)
        if isinstance(expr, relax.Call) and isinstance(expr.op, Op):
            if expr.op.name == "relax.astype" and str(expr.attrs.dtype) == "bool":
                return frozenset()  # every nonzero value becomes 1
            kept = KEEPS_VALUES.get(expr.op.name, ())
            return frozenset().union(*(self.inputs_in(expr.args[i]) for i in kept))
        return frozenset()

    def _bound(self, index: relax.Expr, extent: int) -> None:
        for position in self.inputs_in(index):
            self.bounds[position] = min(self.bounds.get(position, extent), extent)

    def _checked_bounds(self, condition: relax.Expr) -> None:
        """``x < c`` and ``x <= c`` with a constant ``c`` among the integer and boolean operations an
        assertion's condition is made of."""
        pending, seen = [condition], set()
        while pending:
            expr = pending.pop()
            if isinstance(expr, relax.Var):
                if expr in seen or expr not in self.values:
                    continue
                seen.add(expr)
                expr = self.values[expr]
            if not isinstance(expr, relax.Call) or not isinstance(expr.op, Op):
                continue
            limit = _scalar(expr.args[1]) if expr.op.name in ("relax.less", "relax.less_equal") else None
            if limit is not None:
                self._bound(expr.args[0], limit + (expr.op.name == "relax.less_equal"))
            pending += [arg for arg in expr.args if _integral(arg)]

    def _fields(self, expr: relax.Expr) -> list | None:
        if isinstance(expr, relax.Var):
            expr = self.values.get(expr)
        return list(expr.fields) if isinstance(expr, relax.Tuple) else None


def _indexed_extents(call: relax.Call, fields_of) -> list[tuple[relax.Expr, int]]:
    """(index argument, the static extent it indexes) for each index argument of ``call``."""
    name, args, attrs = call.op.name, call.args, call.attrs
    if name in ("relax.take", "relax.gather_elements", "relax.scatter_elements"):
        shape = _static_shape(args[0])
        if shape is None:
            return []
        axis = getattr(attrs, "axis", None)
        return [(args[1], math.prod(shape) if axis is None else shape[int(axis) % len(shape)])]
    if name in ("relax.gather_nd", "relax.scatter_nd"):
        shape, index_shape = _static_shape(args[0]), _static_shape(args[1])
        if shape is None or not index_shape or not index_shape[-1]:
            return []
        first = int(getattr(attrs, "batch_dims", 0) or 0)
        return [(args[1], min(shape[first : first + index_shape[-1]]))]
    if name == "relax.one_hot":
        return [(args[0], int(attrs.depth))]
    if name in ("relax.index_tensor", "relax.index_put"):
        shape, indices = _static_shape(args[0]), fields_of(args[1])
        if shape is None or indices is None:
            return []
        return list(zip(indices, shape))
    return []


def _static_shape(expr: relax.Expr) -> list[int] | None:
    ty = expr.ty
    values = getattr(ty.shape, "values", None) if isinstance(ty, relax.TensorType) else None
    if values is None or not all(hasattr(v, "value") for v in values):
        return None
    return [int(v.value) for v in values]


def _scalar(expr: relax.Expr) -> int | None:
    """The value of an integer constant of one element."""
    if isinstance(expr, GenericConst) and _integral(expr) and expr.value.numpy().size == 1:
        return int(expr.value.numpy().item())
    return None


def _integral(expr: relax.Expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype).startswith(("int", "uint", "bool"))
