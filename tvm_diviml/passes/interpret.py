"""Run an Extraction kernel by kernel, in the graph's topological order, on the CPU.

The check that an extraction is faithful: if its nodes, their arguments and the order are right,
the result equals the whole module's. It also shows that the nodes are exactly what a device runs.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .extract import Extraction, Ref


def transformed_weights(extraction: Extraction, params: list[np.ndarray], device) -> list:
    """The entry function's weight arguments: the lifted weight preparation applied to ``params``."""
    if extraction.transform_params is None:
        return [tvm.runtime.tensor(p, device) for p in params]
    name = extraction.transform_params
    mod = tvm.IRModule(
        {
            gv: extraction.mod[gv]
            for gv in extraction.mod.get_global_vars()
            if gv.name_hint == name or not isinstance(extraction.mod[gv], relax.Function)
        }
    )
    target = tvm.target.Target("llvm")
    vm = relax.VirtualMachine(
        tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target)), device
    )
    result = vm[name]([tvm.runtime.tensor(p, device) for p in params])
    return list(result)


def run_kernels(extraction: Extraction, inputs: list[np.ndarray], params: list[np.ndarray]) -> list[np.ndarray]:
    """The entry function's outputs, computed one kernel at a time in topological order."""
    device = tvm.cpu(0)
    graph = extraction.graph
    funcs = {
        name: extraction.mod[name].with_attr("global_symbol", name)
        for name in dict.fromkeys(extraction.kernel_func.values())
    }
    library = tvm.compile(tvm.IRModule(funcs), target="llvm")
    values: dict[Ref, object] = {}
    for graph_input, array in zip(graph.inputs, inputs, strict=True):
        values[Ref("input", graph_input.name)] = tvm.runtime.tensor(array, device)
    for wid, tensor in zip(extraction.weight_params, transformed_weights(extraction, params, device), strict=True):
        values[Ref("weight", wid)] = tensor
    for cid, constant in extraction.constants.items():
        values[Ref("const", cid)] = constant.value

    def value_of(ref: Ref):
        if ref.kind == "view":
            base, shape = extraction.views[ref]
            return value_of(base)._create_view(shape)
        return values[ref]

    for name in graph.topo_order:
        outputs = [
            tvm.runtime.empty(tuple(o["shape"]), o["dtype"], device) for o in graph.kernels[name].attrs["outputs"]
        ]
        library[extraction.kernel_func[name]](*[value_of(ref) for ref in extraction.kernel_args[name]], *outputs)
        if len(outputs) == 1:
            values[Ref("kernel", name)] = outputs[0]
        for index, output in enumerate(outputs):
            values[Ref("kernel", name, index)] = output
    return [value_of(ref).numpy() for ref in extraction.outputs]
