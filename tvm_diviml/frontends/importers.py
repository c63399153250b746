"""Bring a user's model into the zoo's form (a BuiltModel): an ONNX file, a torch.export program
(in memory or saved with ``torch.export.save`` as ``.pt2``), or a Relax IRModule of their own.

Weights stay parameters of the entry function (``keep_params_in_input``), so that extraction can
see which kernels read which weight and the build can place each weight once per device.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import zipfile

import numpy as np
import tvm
from tvm import relax

from tvm_diviml.errors import DivimlInputError, first_line, raise_if_interrupted
from tvm_diviml.host_memory import available_memory_bytes
from tvm_diviml.jsonio import check_regular_file
from tvm_diviml.units import format_bytes
from tvm_diviml.zoo import BuiltModel, init_weights
from tvm_diviml.zoo.input_ranges import integer_input_ranges

from ..passes.extract import bind_shapes, tensor_bytes
from .program_checks import inference_program, refuse_onnx_training_nodes
from .rewrites import ImportRewrites


def from_relax(
    mod,
    entry: str = "main",
    params: list[np.ndarray] | None = None,
    *,
    shapes: dict[str, int] | None = None,
    name: str = "relax",
    origin: str = "a Relax IRModule",
) -> BuiltModel:
    """A user's IRModule: inputs are the first ``num_input`` parameters of ``entry`` (all of them if
    the attribute is absent); weights come from ``params`` or the function's ``params`` attribute
    (where TVM's importers leave them). Operators TVM imports but cannot compile are rewritten where
    a sound rewrite exists (``rewrites.py``)."""
    if not any(gv.name_hint == entry for gv in mod.get_global_vars()):
        names = ", ".join(gv.name_hint for gv in mod.get_global_vars() if isinstance(mod[gv], relax.Function))
        raise DivimlInputError(f"the module has no function '{entry}'", field="entry", hint=f"functions: {names}")
    func = mod[entry]
    attrs = func.attrs or {}
    if params is None and "params" in attrs:
        params = [p.numpy() for p in attrs["params"]]
        func = func.without_attr("params")
        mod = mod.clone()  # the caller's module stays as it was
        mod[entry] = func
    params = list(params or [])
    num_inputs = int(attrs["num_input"]) if "num_input" in attrs else len(func.params) - len(params)
    if num_inputs + len(params) != len(func.params):
        raise DivimlInputError(
            f"'{entry}' takes {len(func.params)} parameters, but {num_inputs} inputs and "
            f"{len(params)} weights were given",
            field="params",
        )
    mod = ImportRewrites()(bind_shapes(mod, entry, shapes))
    func = mod[entry]
    inputs = _tensor_specs(func.params[:num_inputs], "input")
    weights = _weights(func.params[num_inputs:], params)
    ranges = integer_input_ranges(mod, entry, inputs)
    return BuiltModel(name, mod, entry, inputs, weights, origin=origin, input_ranges=ranges)


def module_as_model(mod, entry: str, seed: int = 0) -> BuiltModel:
    """``mod`` as it stands, to run and time (``PartitionForDevices`` measures the module it places,
    nothing imported again, rewritten or rebound): ``entry``'s inputs are its first ``num_input``
    parameters (without the attribute: those the weights leave); its weights are the function's
    ``params`` attribute where it has them, seeded random ones (``zoo.init_weights``) for those it
    lacks. Weights bound as constants are no parameters: the module carries them."""
    func = mod[entry]
    attrs = func.attrs or {}
    own = [p.numpy() for p in attrs["params"]] if "params" in attrs else []
    num_inputs = int(attrs["num_input"]) if "num_input" in attrs else max(0, len(func.params) - len(own))
    weight_params = func.params[num_inputs:]
    lacking = _tensor_specs(weight_params[len(own) :], "weight")
    arrays = own[: len(weight_params)] + [array for _, array in init_weights(lacking, seed)]
    inputs = _tensor_specs(func.params[:num_inputs], "input")
    weights = _weights(weight_params, arrays)
    return BuiltModel("relax", mod, entry, inputs, weights, input_ranges=integer_input_ranges(mod, entry, inputs))


def _tensor_specs(params, what: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of each parameter; refused where one is not a tensor of known shape."""
    specs = []
    for param in params:
        ty = param.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            raise DivimlInputError(f"{what} '{param.name}' is not a tensor of known rank", field="MODEL")
        specs.append((param.name, tuple(int(d) for d in ty.shape.values), str(ty.dtype)))
    return specs


def _weights(params, arrays: list[np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """Each weight parameter named with its array, refused where the array's size is not the parameter's."""
    for param, array in zip(params, arrays, strict=True):
        if tensor_bytes(param.ty) != array.nbytes:
            raise DivimlInputError(
                f"weight '{param.name}' has {array.nbytes} bytes, the function expects {tensor_bytes(param.ty):.0f}",
                field="params",
            )
    return [(param.name, array) for param, array in zip(params, arrays, strict=True)]


def load_onnx(path: str, shapes: dict[str, int] | None = None) -> BuiltModel:
    """An ``.onnx`` file through ``relax.frontend.onnx`` (needs the ``onnx`` extra)."""
    try:
        import onnx
    except ImportError:
        raise DivimlInputError(
            "reading .onnx files needs the onnx package", source=path, hint="pip install 'tvm-diviml[onnx]'"
        ) from None
    from tvm.relax.frontend.onnx import from_onnx

    check_model_file(path)
    try:
        model = onnx.load(path)
    except Exception as error:  # onnx raises DecodeError and friends for files that are not ONNX
        raise DivimlInputError(
            f"not a readable ONNX model ({type(error).__name__}: {first_line(error)})", source=path
        ) from None
    model = initializers_as_weights(model)
    refuse_sizeless_inputs(model, path)
    refuse_onnx_training_nodes(model, path)
    with importer_errors(path):
        mod = from_onnx(integer_initializers_as_constants(model), keep_params_in_input=True)
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import) or "none"
    producer = f"{model.producer_name} {model.producer_version}".strip() or "unknown"
    origin = (
        f"relax.frontend.onnx (onnx {onnx.__version__}, TVM {tvm.__version__}); opset {opsets}, "
        f"IR version {model.ir_version}, produced by {producer}"
    )
    try:
        return from_relax(mod, "main", shapes=shapes, name=path, origin=origin)
    except DivimlInputError as error:
        raise error.within(path) from None


def initializers_as_weights(model):
    """The model without the graph inputs that are also initializers, which are its weights. The classic
    ONNX Model Zoo form (IR version 3) lists every weight as a graph input with a default value; TVM's
    importer then takes each both as an input and as a weight and the model cannot be called. A
    deployment feeds only the real inputs: such an input is kept at its initializer's value."""
    initialized = {init.name for init in model.graph.initializer}
    if not any(i.name in initialized for i in model.graph.input):
        return model
    import onnx

    model = onnx.ModelProto.FromString(model.SerializeToString())  # the caller's model stays as it was
    inputs = [i for i in model.graph.input if i.name not in initialized]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    return model


def refuse_sizeless_inputs(model, path: str) -> None:
    """Refuse an input dimension that is 0 or has neither a size nor a name: TVM's importer makes each such
    dimension a symbolic variable named "v", which no ``--shape`` can bind (several share the name), and
    a zero-size input leaves nothing to compute."""
    for graph_input in model.graph.input:
        dims = graph_input.type.tensor_type.shape.dim
        for axis, dim in enumerate(dims):
            if dim.dim_param or dim.dim_value > 0:
                continue
            raise DivimlInputError(
                f"input '{graph_input.name}' has axis {axis} of size 0 or without a size or name",
                source=path,
                hint="export the model with a positive size there, or name the dimension (a dim_param) and bind it "
                "with --shape NAME=VALUE",
            )


def integer_initializers_as_constants(model):
    """The model with its integer initializers (shapes, axes, indices: what ``torch.onnx.export`` gives
    Expand and Reshape) as Constant nodes. Kept as weight parameters, TVM's importer cannot fold the
    shapes they describe and emits shapes known only at run time (LLaMA's Expand), which no kernel
    graph can be extracted from; weights proper are floating point and stay parameters."""
    import onnx

    graph = model.graph
    listed = {i.name for i in graph.input}
    integer = [
        init
        for init in graph.initializer
        if init.name not in listed and onnx.helper.tensor_dtype_to_np_dtype(init.data_type).kind in "iub"
    ]
    if not integer:
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())  # the caller's model stays as it was
    names = {init.name for init in integer}
    kept = [init for init in model.graph.initializer if init.name not in names]
    constants = [onnx.helper.make_node("Constant", [], [init.name], value=init) for init in integer]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    nodes = constants + list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def _reduction(op):
    """An importer for torch's ``amax``/``amin`` (``dim`` empty: every axis) as the Relax reduction ``op``."""

    def convert(node, importer):
        args = importer.retrieve_args(node)
        dim = args[1] if len(args) > 1 else node.kwargs.get("dim", ())
        keepdim = args[2] if len(args) > 2 else node.kwargs.get("keepdim", False)
        axis = [dim] if isinstance(dim, int) else list(dim or ())
        return importer.block_builder.emit(op(args[0], axis or None, bool(keepdim)))

    return convert


def _unfold(node, importer):
    """torch's ``x.unfold(dim, size, step)``: every window of ``size`` along ``dim``, ``step`` apart, as a
    new last axis; one ``take`` of the windows' indices (static shapes), a reshape and a transpose."""
    x, dim, size, step = importer.retrieve_args(node)[:4]
    dims = importer.shape_of(x)
    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        raise NotImplementedError("unfold over a tensor of symbolic shape")
    shape, dim = [int(d) for d in dims], dim % len(dims)
    count = (shape[dim] - size) // step + 1
    windows = (np.arange(count)[:, None] * step + np.arange(size)[None, :]).reshape(-1)
    builder = importer.block_builder
    taken = builder.emit(relax.op.take(x, relax.const(windows, "int64"), axis=dim))
    split = builder.emit(relax.op.reshape(taken, [*shape[:dim], count, size, *shape[dim + 1 :]]))
    order = [*range(dim + 1), *range(dim + 2, len(shape) + 1), dim + 1]
    return builder.emit(relax.op.permute_dims(split, order))


def _elu(node, importer):
    """torch's ``elu(x, alpha, scale, input_scale)``: ``scale * x`` above 0, ``scale * alpha * (exp(input_scale
    * x) - 1)`` below. TVM's importer drops ``scale`` and ``input_scale``, and ``selu`` and ``celu`` arrive as
    ``elu`` with them (a SELU came out 0.048 off torch)."""
    args = importer.retrieve_args(node)
    x, dtype = args[0], str(args[0].ty.dtype)
    alpha, scale, input_scale = (
        float(args[i] if len(args) > i else node.kwargs.get(name, 1.0))
        for i, name in enumerate(("alpha", "scale", "input_scale"), start=1)
    )

    def const(value: float):
        return relax.const(value, dtype)

    below = relax.op.multiply(
        const(alpha), relax.op.subtract(relax.op.exp(relax.op.multiply(x, const(input_scale))), const(1.0))
    )
    chosen = relax.op.where(relax.op.greater(x, const(0.0)), x, below)
    return importer.block_builder.emit(relax.op.multiply(chosen, const(scale)))


def _divide_by_number(node, importer):
    """torch's ``div(x, number, rounding_mode)``: TVM's importer makes the number an int32 constant
    beside a float tensor and then refuses the division ("Binary operators must have the same
    datatype"); the number takes the tensor's dtype (a float tensor where the number is a float)."""
    args = importer.retrieve_args(node)
    x, y, builder = args[0], args[1], importer.block_builder
    mode = args[2] if len(args) > 2 else node.kwargs.get("rounding_mode")
    if isinstance(y, int | float):
        dtype = str(x.ty.dtype)
        if isinstance(y, float) and "float" not in dtype:
            x, dtype = builder.emit(relax.op.astype(x, "float32")), "float32"
        y = relax.const(y, dtype)
    if mode == "floor":
        return builder.emit(relax.op.floor_divide(x, y))
    quotient = relax.op.divide(x, y)
    return builder.emit(relax.op.trunc(quotient) if mode == "trunc" else quotient)


# torch operators TVM 0.27's importer lacks ("Unsupported function types ['amax.default']") or imports
# wrongly (elu, a division by a number with a rounding mode)
TORCH_OPS = {
    "div.Tensor_mode": _divide_by_number,
    "amax.default": _reduction(relax.op.max),
    "amin.default": _reduction(relax.op.min),
    "unfold.default": _unfold,
    "elu.default": _elu,
}


def from_torch_export(program, shapes: dict[str, int] | None = None, name: str = "torch") -> BuiltModel:
    """A ``torch.export`` ExportedProgram through ``from_exported_program`` (not ``from_fx``, which
    gets BatchNorm wrong); one whose import would change what it computes is refused (``program_checks``)."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    with importer_errors(name):
        mod = from_exported_program(
            inference_program(program),
            keep_params_as_input=True,
            custom_convert_map=TORCH_OPS,
            run_ep_decomposition=False,  # inference_program decomposed it
        )
    origin = f"torch.export (torch {torch.__version__}) through relax.frontend.torch (TVM {tvm.__version__})"
    return from_relax(mod, "main", shapes=shapes, name=name, origin=origin)


def load_torch_program(path: str, shapes: dict[str, int] | None = None) -> BuiltModel:
    """A program saved with ``torch.export.save`` (``.pt2``); its inputs are the shapes it was
    exported with (symbolic dimensions bound with ``shapes``)."""
    program = read_torch_program(path)
    try:
        return from_torch_export(program, shapes, name=path)
    except DivimlInputError as error:
        raise error.within(path) from None


def read_torch_program(path: str):
    """The ExportedProgram a ``.pt2`` holds, read as data: its members bounded, no pickled object run."""
    try:
        import torch
    except ImportError:
        raise DivimlInputError(
            "reading .pt2 files needs torch", source=path, hint="pip install 'tvm-diviml[torch]'"
        ) from None
    check_model_file(path)
    if not zipfile.is_zipfile(path):  # torch would log its own traceback before failing
        raise DivimlInputError(
            "not a torch.export program (a .pt2 file is a zip archive)",
            source=path,
            hint="save it with torch.export.save(torch.export.export(model, args), path)",
        )
    check_archive_sizes(path)
    refuse_pickled_objects(path)
    register_pytree_types(path)
    quiet = logging.getLogger("torch.export")  # it logs a traceback before its fallback reader
    level, quiet.level = quiet.level, logging.ERROR
    try:
        with tensors_only_unpickling():
            program = torch.export.load(path)
    except Exception as error:  # torch raises zip, pickle and schema errors of many kinds
        raise DivimlInputError(
            f"not a readable torch.export program ({type(error).__name__}: {first_line(error)})",
            source=path,
            hint="save it with torch.export.save(torch.export.export(model, args), path)",
        ) from None
    finally:
        quiet.setLevel(level)
    return program


MAX_MODEL_BYTES = 1 << 40  # where the machine does not say how much memory it has free


def check_model_file(path: str) -> None:
    """A model file exists, is a regular file (not /dev/zero or a pipe) and fits in the memory free."""
    if not os.path.exists(path):
        raise DivimlInputError("no such file", source=path, hint="check the path")
    check_regular_file(path, os.stat(path), int(available_memory_bytes() or MAX_MODEL_BYTES))


# A compressed member that inflates more than this many times, to more than BOMB_MIN_BYTES, is refused:
# torch.export.save stores every member uncompressed, and weights compress little.
MAX_INFLATION = 100
BOMB_MIN_BYTES = 64 << 20


def check_archive_sizes(path: str) -> None:
    """Refuse, from the archive's directory and before any member is read, a .pt2 whose members would
    take more memory than this machine has free, or a member that inflates like a zip bomb (a 35 MB
    member declared at 8 GiB). Readers stop at a member's declared size, so that bounds what is read."""
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
    for member in members:
        if member.compress_type != zipfile.ZIP_STORED and member.file_size > max(
            BOMB_MIN_BYTES, MAX_INFLATION * member.compress_size
        ):
            raise DivimlInputError(
                f"member {member.filename} inflates from {format_bytes(member.compress_size)} to "
                f"{format_bytes(member.file_size)}: not what torch.export.save writes",
                source=path,
                hint="save the program again with torch.export.save",
            )
    total, available = sum(m.file_size for m in members), available_memory_bytes()
    if available is not None and total > available:
        largest = max(members, key=lambda m: m.file_size)
        raise DivimlInputError(
            f"its members take {format_bytes(total)} ({largest.filename}: {format_bytes(largest.file_size)}); this "
            f"machine has {format_bytes(available)} free",
            source=path,
            hint="read it on a machine with more memory, or export a smaller model",
        )


def refuse_pickled_objects(path: str) -> None:
    """Refuse a program whose constants are pickled Python objects (torchbind or opaque objects):
    torch.export.load would unpickle them, and unpickling runs whatever code the file names. A file
    a user gives is data, never code."""
    from torch.export.pt2_archive.constants import TENSOR_CONSTANT_FILENAME_PREFIX

    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            if not member.endswith("_constants_config.json"):
                continue
            try:
                config = json.loads(archive.read(member)).get("config", {})
            except (ValueError, AttributeError):
                continue  # torch.export.load names what is wrong with the file
            for name, payload in config.items():
                file = str(payload.get("path_name", "")) if isinstance(payload, dict) else ""
                if not file.startswith(TENSOR_CONSTANT_FILENAME_PREFIX):
                    raise DivimlInputError(
                        f"constant '{name}' is a pickled Python object ({file or 'no payload'}), and "
                        "unpickling it would run code the file chooses; tvm-diviml reads only tensors",
                        source=path,
                        hint="export the model without torchbind or opaque objects among its constants",
                    )


@contextlib.contextmanager
def tensors_only_unpickling():
    """While torch reads a .pt2, every ``torch.load`` is weights-only: torch itself loads pickled
    weights, tensor constants and sample inputs with ``weights_only=False`` (and falls back to it when
    a weights-only load fails), which would run any code a crafted file names. A payload that is not
    plain tensors and containers then fails to load, naming what it holds."""
    import torch

    full_load = torch.load

    def weights_only_load(*args, **kwargs):
        kwargs["weights_only"] = True
        return full_load(*args, **kwargs)

    torch.load = weights_only_load
    try:
        yield
    finally:
        torch.load = full_load


# Packages whose modules may be imported to read a .pt2's input and output structures: Hugging Face
# registers each ModelOutput class with torch's pytree when its module is imported. A file names
# modules; importing any it names would run code it chose.
PYTREE_PACKAGES = ("transformers",)


def register_pytree_types(path: str) -> None:
    """Import the modules that define the container types of a program's inputs and outputs (a
    Hugging Face model returns a ``ModelOutput``, which torch can read back only once registered),
    from ``PYTREE_PACKAGES`` only; a type from another package is left to torch's own error."""
    import importlib
    import importlib.metadata
    import importlib.util

    with zipfile.ZipFile(path) as archive:
        members = [name for name in archive.namelist() if name.endswith("models/model.json")]
        specs = []
        for member in members:
            try:
                program = json.loads(archive.read(member))
            except ValueError:
                continue  # torch.export.load names what is wrong with the file
            for call in program.get("graph_module", {}).get("module_call_graph", [])[:1]:
                signature = call.get("signature") or {}
                specs += [signature.get("in_spec") or "", signature.get("out_spec") or ""]
    types = {name for spec in specs for name in re.findall(r'"type": "([A-Za-z_][\w.]*)"', spec)}
    for module in sorted({name.rpartition(".")[0] for name in types}):
        package = module.split(".")[0]
        if package not in PYTREE_PACKAGES:
            continue
        if importlib.util.find_spec(package) is None:
            raise DivimlInputError(
                f"the program returns a {package} type ({module}), and {package} is not installed",
                source=path,
                hint=f"pip install {package} (the version the program was exported with)",
            )
        try:
            importlib.import_module(module)
        except ImportError as error:  # a module of another version of the package
            version = importlib.metadata.version(package)
            raise DivimlInputError(
                f"the program returns a type of {module}, which {package} {version} lacks ({first_line(error)})",
                source=path,
                hint=f"install the {package} version the program was exported with",
            ) from None


@contextlib.contextmanager
def importer_errors(source: str):
    """A TVM importer's failure (it raises errors of every type for operators it lacks) as one line."""
    try:
        yield
    except DivimlInputError:
        raise
    except Exception as error:
        raise_if_interrupted()
        raise DivimlInputError(
            f"TVM cannot import it: {type(error).__name__}: {first_line(error)}",
            source=source,
            hint="re-export the model (another opset, or without the operator named here)",
        ) from None
