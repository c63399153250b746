"""Graph extraction from Relax: structure, sizes, FLOPs, weights, shapes, importers, faithfulness."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.frontends.importers import from_relax, load_onnx
from tvm_diviml.passes.extract import extract
from tvm_diviml.passes.interpret import run_kernels
from tvm_diviml.zoo import BuiltModel, init_weights

from ..helpers import assert_faithful, tiny_onnx, torch_model_with_buffers


class Branches(nn.Module):
    """conv -> (split into two halves multiplied) and (conv + residual -> pool -> fc); the fc reuses
    the first conv's bias nowhere, but ``shared`` is read by two kernels."""

    def __init__(self):
        self.conv1 = nn.Conv2D(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2D(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)
        self.shared = nn.Parameter((1, 4, 8, 8))

    def forward(self, x):
        y = nn.relu(self.conv1(x))
        a, b = nn.op.split(y, 2, axis=1)
        z = self.conv2(y) + y
        pooled = nn.op.wrap_nested(relax.op.nn.avg_pool2d(z._expr, pool_size=(8, 8), strides=(8, 8)), name="pool")
        logits = self.fc(nn.op.reshape(pooled, (1, 8)))
        return logits, a * b + self.shared, nn.op.exp(a) * self.shared


def built_branches(seed=0):
    mod, params = Branches().export_tvm({"forward": {"x": nn.spec.Tensor((1, 3, 8, 8), "float32")}})
    shapes = [(n, tuple(int(s) for s in p.shape), str(p.dtype)) for n, p in params]
    return BuiltModel("branches", mod, "forward", [("x", (1, 3, 8, 8), "float32")], init_weights(shapes, seed))


def test_extracts_fused_kernels_with_sizes_flops_and_weights():
    built = built_branches()
    extraction = extract(built.mod, built.entry)
    graph = extraction.graph
    conv1 = graph.kernels["fused_conv2d_add_relu"]
    # 8 x 8 x 8 outputs, each 3 x 3 x 3 multiply-adds (2 FLOPs), plus the bias add and the ReLU
    assert conv1.flops == 8 * 8 * 8 * (27 * 2 + 2)
    assert conv1.output_bytes == 8 * 8 * 8 * 4
    assert conv1.bytes_moved == 3 * 8 * 8 * 4 + 8 * 3 * 3 * 3 * 4 + 8 * 4 + conv1.output_bytes
    assert "conv1.weight" in conv1.weights
    readers = [k.name for k in graph.kernels.values() if "shared" in k.weights]
    assert len(readers) == 2  # one weight id, read by two kernels
    assert graph.weight_bytes(readers) == 4 * 8 * 8 * 4
    assert graph.inputs[0].name == "x" and graph.inputs[0].consumers == ("transpose",)  # to NHWC (passes/layout.py)
    assert len(graph.outputs) == 3 and len(extraction.outputs) == 3
    assert extraction.transform_params == "forward_transform_params"  # bias reshapes run once, at load
    for kernel in graph.kernels.values():  # weight-only kernels were lifted out of the graph
        assert graph.pred[kernel.name] or any(kernel.name in i.consumers for i in graph.inputs)


def test_node_names_and_bindings_are_unique_and_hashes_are_per_primfunc():
    graph = extract(built_branches().mod, "forward").graph
    positions = [tuple(k.attrs["binding"]) for k in graph.kernels.values()]
    assert len(set(positions)) == len(positions)
    by_func = {}
    for kernel in graph.kernels.values():
        by_func.setdefault(kernel.attrs["primfunc"], set()).add(kernel.attrs["primfunc_hash"])
    assert all(len(h) == 1 for h in by_func.values())
    again = extract(built_branches().mod, "forward").graph
    assert again.to_json() == graph.to_json()  # stable across runs


def test_running_the_kernels_in_topological_order_reproduces_the_module():
    built = built_branches()
    assert_faithful(built, extract(built.mod, built.entry))


def test_operator_granularity_has_more_nodes_and_the_same_flops():
    built = built_branches()
    fused = extract(built.mod, built.entry).graph
    operators = extract(built.mod, built.entry, fused=False)
    assert len(operators.graph) > len(fused)
    total = lambda g: sum(k.flops for k in g.kernels.values())  # noqa: E731
    assert total(operators.graph) == pytest.approx(total(fused), rel=1e-9)
    assert_faithful(built, operators)


def symbolic_module():
    class Linear(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)

    mod, _ = Linear().export_tvm({"forward": {"x": nn.spec.Tensor(("batch", 4), "float32")}})
    return mod


def test_symbolic_shapes_name_the_dimension_and_can_be_bound():
    mod = symbolic_module()
    with pytest.raises(DivimlInputError, match="symbolic dimension 'batch'.*--shape batch=VALUE"):
        extract(mod, "forward")
    with pytest.raises(DivimlInputError, match="no symbolic dimension 'seq'"):
        extract(mod, "forward", shapes={"seq": 3})
    graph = extract(mod, "forward", shapes={"batch": 3}).graph
    assert graph.inputs[0].bytes == 3 * 4 * 4


def test_a_users_own_relax_module():
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")) -> R.Tensor((2, 4), "float32"):
            R.func_attr({"num_input": 1})
            with R.dataflow():
                y = R.matmul(x, w)
                z = R.nn.relu(y)
                out = R.add(z, y)
                R.output(out)
            return out

    weight = np.eye(4, dtype="float32") * 2
    built = from_relax(Module, "main", [weight])
    assert built.inputs == [("x", (2, 4), "float32")]
    extraction = extract(built.mod, built.entry)
    assert sum(k.flops for k in extraction.graph.kernels.values()) >= 2 * 2 * 4 * 4
    assert_faithful(built, extraction)
    with pytest.raises(DivimlInputError, match="no function 'forward'"):
        from_relax(Module, "forward", [weight])
    with pytest.raises(DivimlInputError, match="takes 2 parameters"):
        from_relax(Module, "main", [weight, weight])


def test_onnx_import_extracts_and_matches_onnx_reference(tmp_path):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    from onnx.reference import ReferenceEvaluator

    with pytest.raises(DivimlInputError, match="symbolic dimension 'N'"):
        load_onnx(str(tmp_path / "tiny.onnx"))
    built = load_onnx(str(tmp_path / "tiny.onnx"), {"N": 2})
    assert built.inputs == [("x", (2, 3, 8, 8), "float32")] and [n for n, _ in built.params] == ["W1", "W2"]
    assert "relax.frontend.onnx" in built.origin and "opset ai.onnx 17, IR version" in built.origin
    extraction = extract(built.mod, built.entry)
    inputs = built.sample_inputs()
    expected = ReferenceEvaluator(model).run(None, {"x": inputs[0]})[0]
    got = run_kernels(extraction, inputs, [w for _, w in built.params])[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_onnx_integer_initializers_fold_as_constants(tmp_path):
    """An Expand whose shape is an initializer (as torch.onnx.export writes LLaMA's attention): kept as
    a weight parameter, the shape would be known only at run time and nothing could be extracted."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    weight = np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Unsqueeze", ["h", "axis"], ["u"]),
        helper.make_node("Expand", ["u", "shape"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "expand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 4])],
        initializer=[
            numpy_helper.from_array(weight, "W"),
            numpy_helper.from_array(np.array([1], dtype="int64"), "axis"),
            numpy_helper.from_array(np.array([2, 5, 4], dtype="int64"), "shape"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "expand.onnx"))
    built = load_onnx(str(tmp_path / "expand.onnx"))
    assert [n for n, _ in built.params] == ["W"]  # the float weight stays a parameter
    extraction = extract(built.mod, built.entry)
    x = built.sample_inputs()[0]
    got = run_kernels(extraction, [x], [w for _, w in built.params])[0]
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-6)


def test_bad_onnx_files_are_named(tmp_path):
    pytest.importorskip("onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x00\x01not onnx")
    with pytest.raises(DivimlInputError, match="junk.onnx"):
        load_onnx(str(tmp_path / "junk.onnx"))
    with pytest.raises(DivimlInputError, match="no such file"):
        load_onnx(str(tmp_path / "missing.onnx"))


def test_onnx_operators_tvm_cannot_import_are_named_in_one_line(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    (tmp_path / "empty.onnx").write_bytes(b"")
    unknown = helper.make_model(
        helper.make_graph(
            [helper.make_node("NoSuchOperator", ["x"], ["y"], domain="example.custom")],
            "custom",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)],
    )
    onnx.save(unknown, str(tmp_path / "custom.onnx"))
    for name in ("empty.onnx", "custom.onnx"):
        with pytest.raises(DivimlInputError) as caught:
            load_onnx(str(tmp_path / name))
        assert name in str(caught.value) and "\n" not in str(caught.value)
    assert "NoSuchOperator" in str(caught.value)


def test_torch_export_import_matches_torch():
    model, example, built = torch_model_with_buffers()
    extraction = extract(built.mod, built.entry)
    got = run_kernels(extraction, [example.numpy()], [w for _, w in built.params])[0]
    np.testing.assert_allclose(got, model(example).detach().numpy(), rtol=1e-4, atol=1e-5)
