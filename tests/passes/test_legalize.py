"""Operator legalization (tvm_diviml/passes/legalize.py): every float32 transcendental the models use
becomes a polynomial that vectorizes (no libm call left in the kernel) and stays within the stated
accuracy of float64; other dtypes keep TVM's own kernels; an einsum reads each operand along the
output's innermost axis."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_diviml.passes.extract import lowering_passes
from tvm_diviml.passes.legalize import WHOLE_POWERS, legalize_ops
from tvm_diviml.presets import get_platform
from tvm_diviml.schedules.apply import apply_rules, rules_for
from tvm_diviml.schedules.target import device_target
from tvm_diviml.zoo import SMALL_OPTIONS, build_model, zoo_names

# a libm function called per element in a kernel's TIR
LIBM_CALL = re.compile(r"T\.(exp|exp2|log|log2|log10|log1p|pow|tanh|erf|sigmoid|sin|cos|tan|atan|sinh|cosh|expm1)\(")


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
    assert not LIBM_CALL.search(scripts), scripts
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, reference(x.astype(np.float64)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["exp", "sigmoid", "tanh"])
def test_other_dtypes_keep_tvms_own_kernels(name):
    op, _ = OPERATORS[name]
    assert LIBM_CALL.search(kernel_scripts(legalized(op, (8,), "float64")))


def power_by(exponent):
    return lambda x: relax.op.power(x, relax.const(exponent, "float32"))


@pytest.mark.parametrize("n", WHOLE_POWERS)
def test_whole_powers_become_multiplies(n):
    x = np.random.default_rng(1).standard_normal((4, 32)).astype("float32") * 4
    mod = legalized(power_by(n), x.shape, "float32")
    assert not LIBM_CALL.search(kernel_scripts(mod))
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, x.astype(np.float64) ** n, rtol=1e-6)


@pytest.mark.parametrize("exponent", [2.5, -1.0, 0.0])
def test_other_powers_keep_tvms_kernel(exponent):
    x = np.abs(np.random.default_rng(2).standard_normal((4, 32))).astype("float32") + 0.5
    mod = legalized(power_by(exponent), x.shape, "float32")
    assert "T.pow(" in kernel_scripts(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), x.astype(np.float64) ** exponent, rtol=1e-6)


# Per-element libm calls a zoo kernel may still make, and why: the llama rotary kernel computes its
# angles' exp, cos and sin itself (no table to pin on a device); about 1% of a prefill's time.
KNOWN_LIBM_KERNELS = {"llama": {"rotary"}}


@pytest.mark.parametrize("name", zoo_names())
def test_no_zoo_kernel_calls_libm_per_element(name):
    """A new operator lowered to a scalar libm call would run ~10x slower on the CPU than a
    polynomial (EfficientNet-B0's SiLU did, until legalized); this names the kernel and the call."""
    built = build_model(name, SMALL_OPTIONS[name])
    with tvm.transform.PassContext(opt_level=3):
        lowered = tvm.transform.Sequential(lowering_passes())(built.mod)
    allowed = KNOWN_LIBM_KERNELS.get(name, set())
    calls = {
        (gvar.name_hint, call)
        for gvar, func in lowered.functions_items()
        if isinstance(func, tvm.tirx.PrimFunc) and not any(part in gvar.name_hint for part in allowed)
        for call in LIBM_CALL.findall(func.script())
    }
    assert not calls, f"{name}: kernels calling libm per element: {sorted(calls)}"


def einsum_module(subscripts: str, shapes: list[tuple[int, ...]]) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    operands = [relax.Var(f"x{i}", relax.TensorType(list(shape), "float32")) for i, shape in enumerate(shapes)]
    with bb.function("main", operands):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.einsum(operands, subscripts)))
        bb.emit_func_output(out)
    return legalize_ops()(bb.get())


@pytest.mark.parametrize(
    "subscripts, shapes, kernels",
    [
        ("bsh,vh->bsv", [(2, 3, 8), (12, 8)], {"transpose", "einsum"}),  # a tied language-model head
        ("bhqd,bhkd->bhqk", [(1, 2, 4, 8), (1, 2, 5, 8)], {"transpose", "einsum"}),  # attention scores
        ("bsh,hv->bsv", [(2, 3, 8), (8, 12)], {"einsum"}),  # already read along the output's last axis
        ("ij,kj", [(3, 4), (5, 4)], {"einsum"}),  # an implicit output: TVM's own
    ],
)
def test_an_einsum_operand_is_read_along_the_outputs_innermost_axis(subscripts, shapes, kernels):
    mod = einsum_module(subscripts, shapes)
    names = {gvar.name_hint for gvar, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert names == kernels
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(shape).astype("float32") for shape in shapes]
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    np.testing.assert_allclose(got, np.einsum(subscripts, *arrays), rtol=1e-5, atol=1e-5)


def test_the_zoo_gpt2s_tied_head_is_tiled_as_a_matrix_product():
    """Read transposed, the head went to the row-reduction rule at 1.7 GFLOP/s (5.8 s an inference)."""
    built = build_model("gpt2", SMALL_OPTIONS["gpt2"])
    with tvm.transform.PassContext(opt_level=3):
        lowered = tvm.transform.Sequential(lowering_passes())(built.mod)
    head = next(f for gvar, f in lowered.functions_items() if gvar.name_hint == "einsum")
    target = device_target(get_platform("cpu1").devices[0])
    assert apply_rules(head, target, rules_for(target))[1] == "Matmul"
