"""Bring a user's model into the zoo's form (a BuiltModel): an ONNX file, a torch.export program,
or a Relax IRModule of their own.

Weights stay parameters of the entry function (``keep_params_in_input``), so that extraction can
see which kernels read which weight and the build can place each weight once per device.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.zoo import BuiltModel

from .extract import bind_shapes, tensor_bytes


def from_relax(mod, entry: str = "main", params: list[np.ndarray] | None = None, *,
               shapes: dict[str, int] | None = None, name: str = "relax") -> BuiltModel:
    """A user's IRModule: inputs are the first ``num_input`` parameters of ``entry`` (all of them if
    the attribute is absent); weights come from ``params`` or the function's ``params`` attribute
    (where TVM's importers leave them)."""
    if not any(gv.name_hint == entry for gv in mod.get_global_vars()):
        names = ", ".join(gv.name_hint for gv in mod.get_global_vars() if isinstance(mod[gv], relax.Function))
        raise DivimlInputError(f"the module has no function '{entry}'", field="entry", hint=f"functions: {names}")
    func = mod[entry]
    attrs = func.attrs or {}
    if params is None and "params" in attrs:
        params = [p.numpy() for p in attrs["params"]]
        func = func.without_attr("params")
        mod = mod.clone()                    # the caller's module stays as it was
        mod[entry] = func
    params = list(params or [])
    num_inputs = int(attrs["num_input"]) if "num_input" in attrs else len(func.params) - len(params)
    if num_inputs + len(params) != len(func.params):
        raise DivimlInputError(f"'{entry}' takes {len(func.params)} parameters, but {num_inputs} inputs and "
                               f"{len(params)} weights were given", field="params")
    mod = bind_shapes(mod, entry, shapes)
    func = mod[entry]
    inputs = []
    for param in func.params[:num_inputs]:
        ty = param.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            raise DivimlInputError(f"input '{param.name}' is not a tensor of known rank", field="MODEL")
        inputs.append((param.name, tuple(int(d) for d in ty.shape.values), str(ty.dtype)))
    names = [p.name for p in func.params[num_inputs:]]
    for param, array in zip(func.params[num_inputs:], params, strict=True):
        if tensor_bytes(param.ty) != array.nbytes:
            raise DivimlInputError(f"weight '{param.name}' has {array.nbytes} bytes, the function expects "
                                   f"{tensor_bytes(param.ty):.0f}", field="params")
    return BuiltModel(name, mod, entry, inputs, list(zip(names, params, strict=True)))


def load_onnx(path: str, shapes: dict[str, int] | None = None) -> BuiltModel:
    """An ``.onnx`` file through ``relax.frontend.onnx`` (needs the ``onnx`` extra)."""
    try:
        import onnx
    except ImportError:
        raise DivimlInputError("reading .onnx files needs the onnx package", source=path,
                               hint="pip install 'tvm-diviml[onnx]'") from None
    from tvm.relax.frontend.onnx import from_onnx

    try:
        model = onnx.load(path)
    except FileNotFoundError:
        raise DivimlInputError("no such file", source=path) from None
    except Exception as error:        # onnx raises DecodeError and friends for files that are not ONNX
        raise DivimlInputError(f"not a readable ONNX model ({type(error).__name__})", source=path) from None
    try:
        mod = from_onnx(model, keep_params_in_input=True)
    except tvm.error.TVMError as error:
        raise DivimlInputError(f"TVM cannot import it: {str(error).splitlines()[-1]}", source=path) from None
    try:
        return from_relax(mod, "main", shapes=shapes, name=path)
    except DivimlInputError as error:
        raise error.within(path) from None


def from_torch_export(program, shapes: dict[str, int] | None = None, name: str = "torch") -> BuiltModel:
    """A ``torch.export`` ExportedProgram through ``from_exported_program`` (not ``from_fx``, which
    gets BatchNorm wrong)."""
    from tvm.relax.frontend.torch import from_exported_program

    mod = from_exported_program(program, keep_params_as_input=True)
    return from_relax(mod, "main", shapes=shapes, name=name)
