"""Layouts the CPU schedules run fast on, chosen before lowering (``extract.lowering_passes``).

* Batch norm in inference is a per-channel scale and shift: after a convolution whose output nothing
  else reads, the scale is folded into the convolution's weights (weight-only work, lifted out of the
  inference) and the shift is its bias; elsewhere it is one multiply and one add. TVM's own
  ``DecomposeOpsForInference`` leaves ``(x - mean) / sqrt(var + eps) * gamma + beta``: four operations
  per element, one a division, in the epilogue of every convolution (ResNet-50's 1x1 convolutions over
  64 channels ran at 99-113 GFLOP/s with it).
* ``clip`` (ReLU6) becomes ``maximum`` then ``minimum``: the same values, and operators whose layout
  TVM can change (``clip`` has no layout rule, so every ReLU6 would be wrapped in two transposes).
* Convolutions run in NHWC with HWIO weights, 1-D ones in NWC with WIO (TVM's ``ConvertLayout``): the
  output channels are the innermost axis of both the activations and the weights, so one vector of
  weights feeds several output pixels (``schedules/tiling.py``); in NCHW a small late-layer image
  (2x2) leaves the vector lanes empty, and a strided convolution reads its input with gaps, which
  only the fallback schedule takes (80x slower). The weights' transposes are weight-only work, lifted
  out of the inference; the activations' layout changes once at the model's input and wherever an
  operator keeps NCHW; a change that only moves axes of length one (the pooled features) is a
  reshape, no kernel.
* ``ConvertLayout`` converts a whole module or nothing: a ``squeeze`` or ``stack`` with a negative axis
  (torch's attention squeezes one) made it fail, so their axes are counted from the front first;
  where it fails all the same, each convolution is converted on its own, between two transposes.
"""

from __future__ import annotations

import functools
import logging

import tvm
from tvm import relax

from ..errors import raise_if_interrupted

log = logging.getLogger(__name__)

# Convolutions with their channels last (the weights' output channels too); transposed convolutions stay
# in NCHW: TOPI lowers them in no other layout (moved to NHWC along with the convolutions around them,
# they were left outside any kernel and the model refused)
CONV_LAYOUTS = {
    "relax.nn.conv1d": ["NWC", "WIO"],
    "relax.nn.conv2d": ["NHWC", "HWIO"],
    "relax.nn.conv2d_transpose": ["NCHW", "IOHW"],
}
# The layouts frontends give them, from which ``CONV_LAYOUTS`` moves them
CHANNELS_FIRST = {"relax.nn.conv1d": ("NCW", "OIW"), "relax.nn.conv2d": ("NCHW", "OIHW")}


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


@relax.expr_functor.mutator
class _BatchNormFolded(relax.PyExprMutator):
    def __init__(self, mod, foldable: set):
        super().__init__(mod)
        self.foldable = foldable  # the batch norms (original calls) whose convolution takes the scale

    def visit_call_(self, call):
        original, call = call, super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.batch_norm") or call.attrs.training:
            return call
        data, gamma, beta, mean, var = call.args
        attrs, ndim, dtype, emit = call.attrs, data.ty.ndim, data.ty.dtype, self.builder_.emit
        axis = int(attrs.axis) % ndim
        root = emit(relax.op.sqrt(emit(relax.op.add(var, relax.const(float(attrs.epsilon), dtype)))))
        scale = emit(relax.op.divide(gamma if attrs.scale else relax.const(1.0, dtype), root))
        shift = emit(relax.op.negative(emit(relax.op.multiply(mean, scale))))
        shift = emit(relax.op.add(beta, shift)) if attrs.center else shift
        along = [-1 if i == axis else 1 for i in range(ndim)]
        if original in self.foldable:
            convolution = self.lookup_binding(data)
            weight = convolution.args[1]
            per_output = [-1 if i == 0 else 1 for i in range(weight.ty.ndim)]  # OIHW, OIW: O first
            scaled = emit(relax.op.multiply(weight, emit(relax.op.reshape(scale, per_output))))
            data = emit(relax.Call(convolution.op, [convolution.args[0], scaled], convolution.attrs))
            out = relax.op.add(data, emit(relax.op.reshape(shift, along)))
        else:
            scaled = emit(relax.op.multiply(data, emit(relax.op.reshape(scale, along))))
            out = relax.op.add(scaled, emit(relax.op.reshape(shift, along)))
        return relax.Tuple([self.builder_.emit(out), mean, var])


def _foldable_batch_norms(func) -> set:
    """The batch norms (calls) over the channels of a channels-first convolution that nothing else reads."""
    found = set()
    for block in func.body.blocks if isinstance(func.body, relax.SeqExpr) else []:
        if not isinstance(block, relax.DataflowBlock):
            continue
        users = relax.analysis.udchain(block)
        bound = {binding.var: binding.value for binding in block.bindings if isinstance(binding, relax.VarBinding)}
        for value in bound.values():
            if not (isinstance(value, relax.Call) and value.op == tvm.ir.Op.get("relax.nn.batch_norm")):
                continue
            data = value.args[0]
            convolution = bound.get(data)
            if not (isinstance(convolution, relax.Call) and isinstance(convolution.op, tvm.ir.Op)):
                continue
            layouts = CHANNELS_FIRST.get(convolution.op.name)
            attrs = convolution.attrs
            if layouts is None or (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != (*layouts, layouts[0]):
                continue
            if int(value.attrs.axis) % data.ty.ndim == 1 and len(users.get(data, [])) == 1 and not value.attrs.training:
                found.add(value)
    return found


@tvm.transform.module_pass(opt_level=0, name="diviml.BatchNormFolded")
class BatchNormFolded:
    """Every inference batch norm as a per-channel scale and shift, the scale folded into the convolution
    before it where nothing else reads that convolution (this module's docstring)."""

    def transform_module(self, mod, ctx):
        out = mod.clone()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function) and _calls(func, "relax.nn.batch_norm"):
                folded = _BatchNormFolded(mod, _foldable_batch_norms(func)).visit_expr(func)
                out[gvar] = relax.analysis.remove_all_unused(folded)
        return out


@relax.expr_functor.mutator
class _AxesFromTheFront(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        name = call.op.name if isinstance(call.op, tvm.ir.Op) else None
        if name not in ("relax.squeeze", "relax.stack") or call.attrs.axis is None:
            return call
        if name == "relax.squeeze" and any(int(axis) < 0 for axis in call.attrs.axis):
            ndim = call.args[0].ty.ndim
            return relax.op.squeeze(call.args[0], [int(axis) % ndim for axis in call.attrs.axis])
        if name == "relax.stack" and int(call.attrs.axis) < 0:
            return relax.op.stack(call.args[0], int(call.attrs.axis) % call.ty.ndim)
        return call


@tvm.transform.module_pass(opt_level=0, name="diviml.AxesFromTheFront")
class AxesFromTheFront:
    """Every ``squeeze`` and ``stack`` axis counted from the front: TVM 0.27's layout inference indexes
    a string by their axis as written, and a negative one fails the whole ``ConvertLayout``
    (std::bad_alloc; torch's ``MultiheadAttention`` squeezes axis -2)."""

    def transform_module(self, mod, ctx):
        out = mod.clone()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                out[gvar] = _AxesFromTheFront(mod).visit_expr(func)
        return out


@relax.expr_functor.mutator
class _EachConvolutionChannelsLast(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        name = call.op.name if isinstance(call.op, tvm.ir.Op) else None
        if name not in CHANNELS_FIRST:
            return call
        attrs = call.attrs
        data_layout, kernel_layout = CHANNELS_FIRST[name]
        if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != (data_layout, kernel_layout, data_layout):
            return call
        to_data, to_kernel = CONV_LAYOUTS[name]
        data = self.builder_.emit(relax.op.permute_dims(call.args[0], _moved(data_layout, to_data)))
        weight = self.builder_.emit(relax.op.permute_dims(call.args[1], _moved(kernel_layout, to_kernel)))
        convolution = getattr(relax.op.nn, name.removeprefix("relax.nn."))(
            data,
            weight,
            strides=attrs.strides,
            padding=attrs.padding,
            dilation=attrs.dilation,
            groups=attrs.groups,
            data_layout=to_data,
            kernel_layout=to_kernel,
            out_dtype=attrs.out_dtype,
        )
        return relax.op.permute_dims(self.builder_.emit(convolution), _moved(to_data, data_layout))


def _moved(layout: str, to: str) -> list[int]:
    """The axes of ``layout`` in the order of ``to``: what ``permute_dims`` takes."""
    return [layout.index(axis) for axis in to]


@tvm.transform.module_pass(opt_level=0, name="diviml.ConvolutionsChannelsLast")
class ConvolutionsChannelsLast:
    """TVM's ``ConvertLayout`` to ``CONV_LAYOUTS`` where the module has convolutions. Where TVM cannot
    infer a layout change (0.27 has failed on operators of 3-D tensors), each convolution runs with its
    channels last between two transposes: two copies of its activations, where channels first would
    leave a strided convolution to the fallback schedule."""

    def transform_module(self, mod, ctx):
        if not any(_calls(func, name) for func in mod.functions.values() for name in CHANNELS_FIRST):
            return mod
        try:
            return relax.transform.ConvertLayout(CONV_LAYOUTS)(mod)
        except Exception as error:  # noqa: BLE001 (TVM 0.27 raises InternalError, ValueError and others here)
            raise_if_interrupted()
            _warn_once(
                f"TVM's layout conversion failed ({str(error).splitlines()[-1]}): each convolution has its "
                "channels last on its own, between two transposes"
            )
        out = mod.clone()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                out[gvar] = _EachConvolutionChannelsLast(mod).visit_expr(func)
        return out


@functools.cache
def _warn_once(message: str) -> None:
    """Once per process: every build lowers the model again."""
    log.warning(message)


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
        BatchNormFolded(),
        relax.transform.DecomposeOpsForInference(),
        ClipAsMinMax(),
        AxesFromTheFront(),
        ConvolutionsChannelsLast(),
        UnitTransposeAsReshape(),
        relax.transform.RemoveRedundantReshape(),  # that reshape and the model's own flatten: one view
        relax.transform.EliminateCommonSubexpr(),  # one layout change of a weight two operators read
    ]
