"""Batch norm folded for inference: into the convolution before it where nothing else reads that
convolution, a per-channel multiply and add elsewhere; equal to TVM's own decomposition."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_diviml.passes.layout import BatchNormFolded

CHANNELS = 4


def model(kind: str, training: bool = False) -> tvm.IRModule:
    """conv2d (NCHW) then batch norm then ReLU; ``kind`` "shared": the convolution's output is also added
    to the result (read twice), "no conv": the batch norm reads the input itself."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, CHANNELS, 6, 6), "float32"))
    weight = relax.Var("weight", relax.TensorType((CHANNELS, CHANNELS, 3, 3), "float32"))
    stats = [relax.Var(name, relax.TensorType((CHANNELS,), "float32")) for name in ("gamma", "beta", "mean", "var")]
    with bb.function("main", [x, weight, *stats]):
        with bb.dataflow():
            data = x if kind == "no conv" else bb.emit(relax.op.nn.conv2d(x, weight, padding=1))
            normed = bb.emit(relax.op.nn.batch_norm(data, *stats, axis=1, epsilon=1e-5, training=training))
            out = bb.emit(relax.op.nn.relu(bb.emit(relax.TupleGetItem(normed, 0))))
            if kind == "shared":
                out = bb.emit(relax.op.add(out, data))
            result = bb.emit_output(out)
        bb.emit_func_output(result)
    return bb.get()


def run(mod: tvm.IRModule, arrays: list[np.ndarray]) -> np.ndarray:
    mod = relax.transform.DecomposeOpsForInference()(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def calls(mod: tvm.IRModule) -> list[relax.Call]:
    found = []
    relax.analysis.post_order_visit(mod["main"], found.append)
    return [node for node in found if isinstance(node, relax.Call) and isinstance(node.op, tvm.ir.Op)]


def operators(mod: tvm.IRModule) -> list[str]:
    return [call.op.name for call in calls(mod)]


def arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, CHANNELS, 6, 6)).astype("float32")
    weight = rng.standard_normal((CHANNELS, CHANNELS, 3, 3)).astype("float32")
    gamma, beta, mean = (rng.uniform(-1.5, 1.5, CHANNELS).astype("float32") for _ in range(3))
    var = rng.uniform(0.5, 2.0, CHANNELS).astype("float32")
    return [x, weight, gamma, beta, mean, var]


@pytest.mark.parametrize("kind", ["alone", "shared", "no conv"])
def test_a_folded_batch_norm_computes_what_tvms_decomposition_does(kind):
    mod = model(kind)
    folded = BatchNormFolded()(mod)
    assert "relax.nn.batch_norm" not in operators(folded)
    np.testing.assert_allclose(run(folded, arrays()), run(mod, arrays()), rtol=1e-5, atol=1e-5)


def convolution_weight_is_the_parameter(mod: tvm.IRModule) -> bool:
    (convolution,) = [call for call in calls(mod) if call.op.name == "relax.nn.conv2d"]
    return convolution.args[1].same_as(mod["main"].params[1])


def test_the_scale_goes_into_the_weights_of_a_convolution_nothing_else_reads():
    """Folded, the convolution reads its weights times the scale (weight-only work, lifted out of the
    inference later); where its output is read twice, it keeps its weights and the activations are scaled."""
    assert not convolution_weight_is_the_parameter(BatchNormFolded()(model("alone")))
    assert convolution_weight_is_the_parameter(BatchNormFolded()(model("shared")))
    assert convolution_weight_is_the_parameter(model("alone"))


def test_a_training_batch_norm_is_left_alone():
    mod = model("alone", training=True)
    assert "relax.nn.batch_norm" in operators(BatchNormFolded()(mod))
