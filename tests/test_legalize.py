"""Operator legalization (tvm_diviml/passes/legalize.py): every float32 transcendental the models use
becomes a polynomial that vectorizes (no libm call left in the kernel) and stays within the stated
accuracy of float64; other dtypes keep TVM's own kernels."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_diviml.passes.legalize import legalize_ops

LIBM_CALLS = ("T.exp(", "T.tanh(", "T.erf(", "T.sigmoid(")


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# operator -> its float64 reference
OPERATORS = {
    "exp": (relax.op.exp, np.exp),
    "sigmoid": (relax.op.sigmoid, _sigmoid),
    "tanh": (relax.op.tanh, np.tanh),
    "erf": (relax.op.erf, _erf),
    "silu": (relax.op.nn.silu, lambda x: x * _sigmoid(x)),
    "gelu": (relax.op.nn.gelu, lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))),
    "gelu_tanh": (
        relax.op.nn.gelu_tanh,
        lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    ),
    "softmax": (relax.op.nn.softmax, _softmax),
}


def legalized(op, shape: tuple[int, ...], dtype: str) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(shape), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(op(x)))
        bb.emit_func_output(out)
    return legalize_ops()(bb.get())


def kernel_scripts(mod: tvm.IRModule) -> str:
    return "\n".join(f.script() for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


@pytest.mark.parametrize("name", OPERATORS)
def test_float32_transcendentals_become_polynomials_within_their_accuracy(name):
    op, reference = OPERATORS[name]
    rng = np.random.default_rng(0)
    # the range models see (|x| <= 10: where the stated 1e-6 accuracy holds), as a 16 x 64 row block
    x = np.clip(rng.standard_normal((16, 64)) * 3, -10, 10).astype("float32")
    mod = legalized(op, x.shape, "float32")
    scripts = kernel_scripts(mod)
    assert not [call for call in LIBM_CALLS if call in scripts], scripts
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, reference(x.astype(np.float64)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["exp", "sigmoid", "tanh"])
def test_other_dtypes_keep_tvms_own_kernels(name):
    op, _ = OPERATORS[name]
    assert [call for call in LIBM_CALLS if call in kernel_scripts(legalized(op, (8,), "float64"))]
