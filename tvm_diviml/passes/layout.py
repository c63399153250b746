"""Layouts the CPU schedules run fast on, chosen before lowering (``extract.lowering_passes``).

* Batch norm in inference is a per-channel scale and shift (TVM's ``DecomposeOpsForInference``): it
  fuses into the convolution before it instead of running as a kernel of its own.
* ``clip`` (ReLU6) becomes ``maximum`` then ``minimum``: the same values, and operators whose layout
  TVM can change (``clip`` has no layout rule, so every ReLU6 would be wrapped in two transposes).
* Convolutions run in NHWC with HWIO weights (TVM's ``ConvertLayout``): the output channels are the
  innermost axis of both the activations and the weights, so one vector of weights feeds several
  output pixels (``schedules/tiling.py``); in NCHW a small late-layer image (2x2) leaves the vector
  lanes empty. The weights' transposes are weight-only work, lifted out of the inference; the
  activations' layout changes once at the model's input and wherever an operator keeps NCHW; a
  change that only moves axes of length one (the pooled features) is a reshape, no kernel.
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax

from ..errors import raise_if_interrupted

log = logging.getLogger(__name__)

# Transposed convolutions stay in NCHW: TOPI lowers them in no other layout (moved to NHWC along with the
# convolutions around them, they were left outside any kernel and the model refused)
CONV_LAYOUTS = {"relax.nn.conv2d": ["NHWC", "HWIO"], "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}


@relax.expr_functor.mutator
class _ClipAsMinMax(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.clip"):
            return call
        data, low, high = call.args
        if not all(isinstance(getattr(b, "value", None), int | float) for b in (low, high)):
            return call  # bounds computed at run time
        dtype = str(data.ty.dtype)
        low, high = (relax.const(b.value, dtype) for b in (low, high))
        return relax.op.minimum(relax.op.maximum(data, low), high)


@tvm.transform.module_pass(opt_level=0, name="diviml.ClipAsMinMax")
class ClipAsMinMax:
    """Every ``clip`` with constant bounds as ``minimum(maximum(x, low), high)``."""

    def transform_module(self, mod, ctx):
        out = mod.clone()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                out[gvar] = _ClipAsMinMax(mod).visit_expr(func)
        return out


@tvm.transform.module_pass(opt_level=0, name="diviml.ConvolutionsInNHWC")
class ConvolutionsInNHWC:
    """TVM's ``ConvertLayout`` to NHWC where the module has convolutions. Where TVM cannot infer a
    layout change (0.27 fails on some operators of 3-D tensors), the module keeps its layouts: slower
    on a CPU, never wrong."""

    def transform_module(self, mod, ctx):
        if not any(_calls(func, "relax.nn.conv2d") for func in mod.functions.values()):
            return mod
        try:
            return relax.transform.ConvertLayout(CONV_LAYOUTS)(mod)
        except Exception as error:  # noqa: BLE001 (TVM 0.27 raises InternalError, ValueError and others here)
            raise_if_interrupted()
            log.info("convolutions stay in their layout: %s", str(error).splitlines()[-1])
            return mod


@relax.expr_functor.mutator
class _UnitTransposeAsReshape(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.permute_dims"):
            return call
        shape = [int(d) for d in call.args[0].ty.shape.values] if call.args[0].ty.shape is not None else None
        axes = call.attrs.axes
        if shape is None or any(not isinstance(d, int) for d in shape):
            return call
        order = [int(a) for a in axes] if axes is not None else list(reversed(range(len(shape))))
        moved = [axis for axis in order if shape[axis] != 1]
        if moved != sorted(moved):
            return call
        return relax.op.reshape(call.args[0], [shape[axis] for axis in order])


@tvm.transform.module_pass(opt_level=0, name="diviml.UnitTransposeAsReshape")
class UnitTransposeAsReshape:
    """A transpose that moves only axes of length one (NHWC's pooled [N, 1, 1, C] back to NCHW before
    the classifier) as a reshape: the same bytes in the same order, a view instead of a kernel."""

    def transform_module(self, mod, ctx):
        out = mod.clone()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                out[gvar] = _UnitTransposeAsReshape(mod).visit_expr(func)
        return out


def _calls(func, op_name: str) -> bool:
    if not isinstance(func, relax.Function):
        return False
    found = []
    relax.analysis.post_order_visit(
        func,
        lambda node: found.append(node) if isinstance(node, relax.Call) and node.op == tvm.ir.Op.get(op_name) else None,
    )
    return bool(found)


def layout_passes() -> list:
    """The passes of this module's docstring, in order."""
    return [
        relax.transform.DecomposeOpsForInference(),
        ClipAsMinMax(),
        ConvolutionsInNHWC(),
        UnitTransposeAsReshape(),
        relax.transform.RemoveRedundantReshape(),  # that reshape and the model's own flatten: one view
        relax.transform.EliminateCommonSubexpr(),  # one layout change of a weight two operators read
    ]
