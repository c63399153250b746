"""Sound rewrites of an imported module where TVM 0.27 imports an operator but cannot compile it.

Each rewrite gives the operator the meaning its framework gives it, so outputs stay the model's:

* ``cumsum`` of a boolean tensor with no output dtype: torch sums booleans as int64 (Hugging Face's
  GPT-2 and LLaMA do it to find packed sequences), TVM's importer keeps bool and its LLVM code
  generation then fails (``MatchesCode(kDLFloat)``). Rewritten as a cast to int64, then an int64 sum.
* ``take`` at a constant negative index: torch's ``x[:, -1]`` (the last step of an RNN's output, a
  decoder's last token) counts from the end, but TVM's torch importer emits ``take`` at -1 unchanged
  and its ``fast`` mode reads before the tensor: outputs that change run to run (an LSTM's head came
  out 1e20 off). Rewritten with the index counted from the start, where the axis has a static length.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax


@relax.expr_functor.mutator
class _BoolCumsumAsInt64(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.cumsum"):
            return call
        data, out_dtype = call.args[0], call.attrs.dtype
        if str(data.ty.dtype) != "bool" or (out_dtype is not None and str(out_dtype) != "bool"):
            return call
        axis = call.attrs.axis
        return relax.op.cumsum(
            relax.op.astype(data, "int64"),
            None if axis is None else int(axis),
            dtype="int64",
            exclusive=bool(call.attrs.exclusive),
        )


@relax.expr_functor.mutator
class _NegativeTakeFromTheEnd(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.take"):
            return call
        data, indices = call.args
        if not isinstance(indices, tvm.ir.expr.Constant):
            return call
        values = indices.value.numpy()
        length = _static_length(data, call.attrs.axis)
        if length is None or not (values < 0).any() or (values < -length).any():
            return call
        counted = np.where(values < 0, values + length, values).astype(values.dtype)
        axis = call.attrs.axis
        return relax.op.take(
            data, relax.const(counted, str(values.dtype)), None if axis is None else int(axis), str(call.attrs.mode)
        )


def _static_length(data, axis) -> int | None:
    """The length of ``data`` along ``axis`` (all of it flattened where None), where it is static."""
    shape = getattr(data.ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        return None
    dims = [int(d) for d in shape.values]
    return int(np.prod(dims)) if axis is None else dims[int(axis)]


@tvm.transform.module_pass(opt_level=0, name="diviml.ImportRewrites")
class ImportRewrites:
    """Apply every rewrite of this module (see its docstring) to each Relax function."""

    def transform_module(self, mod, ctx):
        out = mod.clone()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                func = _BoolCumsumAsInt64(mod).visit_expr(func)
                out[gvar] = _NegativeTakeFromTheEnd(mod).visit_expr(func)
        return out
