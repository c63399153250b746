"""Programs whose import would change what they compute, refused in one line before TVM imports them.

TVM's importers build inference programs. A training-mode BatchNorm (``.eval()`` forgotten before
export) would come out normalised by its running statistics instead of each batch's, a training-mode
Dropout would be dropped, and a random draw would not be made anew on each call.
A build keeps no state between calls either, so a program that updates its buffers (or its inputs)
in place would compute differently from the second call on. None of these meanings can be kept, so
each is refused, naming the operator (and the module it belongs to) or the buffers, and the fix.
"""

from __future__ import annotations

from tvm_diviml.errors import DivimlInputError

EVAL_HINT = "call model.eval() before torch.export.export"

# aten operator -> (its argument that says it trains, what it does then that a build would not)
TRAINING_OPS = {
    "aten._native_batch_norm_legit_functional.default": (
        "training",
        "normalises by each batch's statistics and updates its running ones, where a build would use the running ones",
    ),
    "aten.native_dropout.default": ("train", "zeroes random elements, which a build would not"),
    "aten.rrelu_with_noise_functional.default": (
        "training",
        "draws a random slope per element, which a build would not",
    ),
}


def inference_program(program):
    """``program`` decomposed as TVM's importer decomposes it (core ATen, with its buffer updates made
    explicit in its signature); refused where importing it would change what it computes."""
    import torch

    decomposed = program.run_decompositions()
    for node in decomposed.graph.nodes:
        if node.op != "call_function":
            continue
        op = str(node.target)
        if op in TRAINING_OPS:
            flag, consequence = TRAINING_OPS[op]
            if _argument(node, flag):
                raise DivimlInputError(
                    f"{_module_of(node)} runs in training mode ({op}): it {consequence}", field="MODEL", hint=EVAL_HINT
                )
            continue  # in inference mode its meaning is kept
        if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            raise DivimlInputError(
                f"{_module_of(node)} draws random numbers ({op}); a build would not draw them anew on each call",
                field="MODEL",
                hint=f"{EVAL_HINT} if it samples only in training; otherwise pass the random values as an input",
            )
    signature = decomposed.graph_signature
    updated = [f"buffer '{name}'" for name in signature.buffers_to_mutate.values()]
    updated += [f"input '{name}'" for name in signature.user_inputs_to_mutate.values()]
    if updated:
        raise DivimlInputError(
            f"the program updates {', '.join(dict.fromkeys(updated))} in place; a build returns only its outputs and "
            "keeps no state between calls, so the update would be lost and a second call would differ from torch's",
            field="MODEL",
            hint="return the new value as an output instead of updating it in place",
        )
    return decomposed


def _argument(node, name: str):
    """The value of ``node``'s argument ``name``, given by position, by keyword or by default."""
    for position, argument in enumerate(node.target._schema.arguments):
        if argument.name == name:
            if position < len(node.args):
                return node.args[position]
            return node.kwargs.get(name, argument.default_value)
    raise KeyError(name)


def _module_of(node) -> str:
    """``BatchNorm1d 'features.norm'``: the innermost torch module ``node`` comes from, else the node."""
    stack = node.meta.get("nn_module_stack") or {}
    path, kind = list(stack.values())[-1] if stack else ("", "")
    if not path:
        return f"operator '{node.name}'"
    return f"{str(getattr(kind, '__name__', kind)).rpartition('.')[2]} '{path}'"


def refuse_onnx_training_nodes(model, source: str) -> None:
    """Refuse an ONNX model that trains: a BatchNormalization with ``training_mode=1``, or a Dropout whose
    ``training_mode`` input is true or not a constant (TVM's importer makes every Dropout an identity)."""
    import onnx
    from onnx import numpy_helper

    # the Dropouts' training_mode inputs only: converting every weight would copy the whole model
    flags = {node.input[2] for node in _nodes(model.graph) if node.op_type == "Dropout" and len(node.input) > 2}
    constants = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer if init.name in flags}
    for node in _nodes(model.graph):
        if (
            node.op_type == "Constant"
            and node.output[0] in flags
            and node.attribute[:1]
            and node.attribute[0].name == "value"
        ):
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    for node in _nodes(model.graph):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "BatchNormalization" and attributes.get("training_mode"):
            mode = "training_mode=1"
        elif node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
            value = constants.get(node.input[2])
            if value is not None and not value.any():
                continue
            mode = "its training_mode is true" if value is not None else "its training_mode is known only at run time"
        else:
            continue
        raise DivimlInputError(
            f"{node.op_type} '{node.name or node.output[0]}' runs in training mode ({mode}), which TVM's import "
            "would replace by inference",
            source=source,
            hint="export the model in inference mode (model.eval() before torch.onnx.export)",
        )


def _nodes(graph):
    """Every node of ``graph`` and of the subgraphs its nodes hold (If, Loop, Scan bodies)."""
    import onnx

    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attribute.g)
            for subgraph in attribute.graphs:
                yield from _nodes(subgraph)
