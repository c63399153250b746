"""Sound rewrites of an imported module where TVM 0.27 imports an operator but cannot compile it.

Each rewrite gives the operator the meaning its framework gives it, so outputs stay the model's:

* ``cumsum`` of a boolean tensor with no output dtype: torch sums booleans as int64 (Hugging Face's
  GPT-2 and LLaMA do it to find packed sequences), TVM's importer keeps bool and its LLVM code
  generation then fails (``MatchesCode(kDLFloat)``). Rewritten as a cast to int64, then an int64 sum.
"""

from __future__ import annotations

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


@tvm.transform.module_pass(opt_level=0, name="diviml.ImportRewrites")
class ImportRewrites:
    """Apply every rewrite of this module (see its docstring) to each Relax function."""

    def transform_module(self, mod, ctx):
        out = mod.clone()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                out[gvar] = _BoolCumsumAsInt64(mod).visit_expr(func)
        return out
