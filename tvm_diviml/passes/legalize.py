"""TVM's operator legalization, with the transcendental functions of float32 kernels as TVM's own
polynomials (``topi.fast_exp``, ``fast_tanh``, ``fast_erf``, ``nn.fast_softmax``): LLVM lowers
``exp``, ``tanh`` and ``erf`` to a libm call per element, which no schedule vectorizes. Timed here
on 1.2 M float32 elements in a vectorized loop (a multiply: 0.15 ms): exp 2.5 ms against 0.25,
sigmoid 3.6 against 0.33, tanh 7.9 against 0.30, erf 22 against 0.34. BERT-base's feed-forward
kernel (a matmul with a GELU epilogue) took 9.9 ms with ``erf`` calls and 3.3 ms without them.
``x ** n`` for a constant whole n becomes multiplies: LLVM folds ``pow(x, 2)`` itself but calls libm
for ``pow(x, 3)`` (Hugging Face GPT-2's GELU): 5.9 ms against 0.11 on the same 1.2 M elements.
Accuracy against float64 (``tests/passes/test_legalize.py``): within 1e-6 (absolute, or relative) for
|x| <= 10 (exp's range reduction runs in float32: 2.2e-6 relative at |x| = 60).
"""

from __future__ import annotations

import functools
import math
import operator

import tvm
from tvm import relax, te, tirx, topi

WHOLE_POWERS = (1.0, 2.0, 3.0, 4.0)  # exponents written as multiplies


def _float32(x: te.Tensor) -> bool:
    return x.dtype == "float32"


def _polynomial_in_float32(fast, exact):
    """``fast`` (TOPI's polynomial) on float32 tensors, ``exact`` (TVM's libm call) on others."""
    return lambda x: fast(x) if _float32(x) else exact(x)


_erf = _polynomial_in_float32(topi.fast_erf, topi.erf)
_exp = _polynomial_in_float32(topi.fast_exp, topi.exp)
_tanh = _polynomial_in_float32(topi.fast_tanh, topi.tanh)


def _sigmoid(x: te.Tensor) -> te.Tensor:
    if not _float32(x):
        return topi.sigmoid(x)
    one = tirx.const(1.0, x.dtype)
    exp_minus_x = topi.fast_exp(topi.negative(x))
    return te.compute(x.shape, lambda *i: one / (one + exp_minus_x(*i)), name="sigmoid")


def _gelu(bb, call):
    def te_gelu(x: te.Tensor):
        dtype = x.dtype
        return x * (tirx.const(0.5, dtype) + _erf(x * tirx.const(0.5**0.5, dtype)) * tirx.const(0.5, dtype))

    return bb.call_te(te_gelu, call.args[0], primfunc_name_hint="gelu")


def _gelu_tanh(bb, call):
    def te_gelu_tanh(x: te.Tensor):
        dtype = x.dtype
        inner = tirx.const((2.0 / math.pi) ** 0.5, dtype) * x * (1 + tirx.const(0.044715, dtype) * x * x)
        return tirx.const(0.5, dtype) * x * (tirx.const(1.0, dtype) + _tanh(inner))

    return bb.call_te(te_gelu_tanh, call.args[0], primfunc_name_hint="gelu_tanh")


def _silu(bb, call):
    return bb.call_te(lambda x: topi.multiply(x, _sigmoid(x)), call.args[0], primfunc_name_hint="silu")


def _elementwise(te_function, name: str):
    """A legalization of a one-input elementwise operator by ``te_function``."""
    return lambda bb, call: bb.call_te(te_function, call.args[0], primfunc_name_hint=name)


def _softmax(bb, call):
    data, axis = call.args[0], int(call.attrs.axis)
    if str(data.ty.dtype) != "float32":
        return bb.call_te(topi.nn.softmax, data, axis)
    return bb.call_te(topi.nn.fast_softmax, data, axis, primfunc_name_hint="softmax")


def _power(bb, call):
    """``x ** n`` for a constant whole n in 1..4 as n - 1 multiplies (GPT-2's GELU has ``x ** 3``),
    where ``pow`` is a libm call per element; any other exponent keeps TVM's own legalization."""
    base, exponent = call.args
    value = exponent.value.numpy() if isinstance(exponent, tvm.ir.expr.Constant) else None
    if value is not None and value.ndim == 0 and str(exponent.ty.dtype) == str(base.ty.dtype):
        n = float(value)
        if n in WHOLE_POWERS:

            def te_power(x: te.Tensor):
                return te.compute(x.shape, lambda *i: functools.reduce(operator.mul, [x(*i)] * int(n)), name="power")

            return bb.call_te(te_power, base, primfunc_name_hint="power")
    return tvm.ir.Op.get("relax.power").get_attr("FLegalize")(bb, call)


def _einsum(bb, call):
    """An einsum whose operand holds the output's innermost index on another axis (a tied language-model
    head, ``"bsh,vh->bsv"``) reads that operand with a stride along the output's vector axis, which no
    rule tiles: GPT-2's head then ran at 1.7 GFLOP/s, 5.8 s an inference. Such an operand is given
    that index last by a ``permute_dims`` first (of a weight, lifted: done once, at upload); any other
    einsum keeps TVM's own legalization."""
    subscripts = str(call.attrs.subscripts).replace(" ", "")
    inputs, arrow, output = subscripts.partition("->")
    operands, tensors = inputs.split(","), list(call.args[0].fields)
    if arrow and output and "." not in subscripts and len(operands) == len(tensors):
        innermost, changed = output[-1], False
        for i, operand in enumerate(operands):
            if operand.count(innermost) == 1 and operand[-1] != innermost:
                order = [j for j, c in enumerate(operand) if c != innermost] + [operand.index(innermost)]
                tensors[i] = relax.op.permute_dims(tensors[i], order)
                operands[i], changed = "".join(operand[j] for j in order), True
        if changed:
            return relax.op.einsum(tensors, ",".join(operands) + "->" + output)
    return tvm.ir.Op.get("relax.einsum").get_attr("FLegalize")(bb, call)


def legalize_ops() -> relax.transform.LegalizeOps:
    return relax.transform.LegalizeOps(
        {
            "relax.nn.gelu": _gelu,
            "relax.nn.gelu_tanh": _gelu_tanh,
            "relax.nn.silu": _silu,
            "relax.nn.softmax": _softmax,
            "relax.power": _power,
            "relax.einsum": _einsum,
            "relax.erf": _elementwise(_erf, "erf"),
            "relax.exp": _elementwise(_exp, "tir_exp"),
            "relax.sigmoid": _elementwise(_sigmoid, "tir_sigmoid"),
            "relax.tanh": _elementwise(_tanh, "tir_tanh"),
        }
    )
