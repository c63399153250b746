"""Re-emit an Extraction's kernels as a new Relax function with every tensor on a chosen vdevice.

Both the single-VM build (the whole entry function) and the concurrent executor (one function per
same-device segment) are written this way: from the Extraction, which records exactly what each
kernel reads, rather than by mutating the original bindings. A tensor made on one device and read on
another gets one ``to_vdevice`` per destination device; views (reshapes) are re-made where they are
read; weights and constants are parameters of the new function, one per device that reads them, so
the runtime uploads them once instead of copying them on every call. A kernel whose schedule reads a
weight packed for its vector loads takes the packed copy, a parameter of its own (``runtime/packing.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tvm import relax

from ..runtime.packing import PACKED, packed_name, packed_shape, packed_source
from .extract import Extraction, Ref


@dataclass(frozen=True)
class TargetFunc:
    """A kernel's PrimFunc compiled for one device: its GlobalVar in the module being built, and the
    parameter positions whose weight its schedule reads packed, with the lanes of the packing."""

    gvar: Any
    packed: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Param:
    """A parameter of an emitted function: a tensor (``ref``) as it lives on ``device``."""

    ref: Ref
    device: str

    @property
    def name(self) -> str:
        base = f"{self.ref.name}" if self.ref.index is None else f"{self.ref.name}_{self.ref.index}"
        return re.sub(r"\W", "_", f"{self.ref.kind}_{base}_on_{self.device}")


def packed_ref(ref: Ref, lanes: int) -> Ref:
    """Weight or constant ``ref`` packed in blocks of ``lanes`` (``runtime/packing.py``)."""
    return Ref(PACKED, packed_name(ref.kind, ref.name, lanes))


def base_ref(extraction: Extraction, ref: Ref) -> Ref:
    """The tensor a view looks at (views of views followed)."""
    while ref.kind == "view":
        ref = extraction.views[ref][0]
    return ref


def param_types(extraction: Extraction) -> dict[Ref, Any]:
    """Types of the lowered entry function's inputs and weights, by Ref."""
    func = extraction.mod[extraction.entry]
    num_inputs = len(extraction.graph.inputs)
    types = {Ref("input", param.name): param.ty for param in func.params[:num_inputs]}
    types.update(
        {
            Ref("weight", wid): param.ty
            for wid, param in zip(extraction.weight_params, func.params[num_inputs:], strict=True)
        }
    )
    return types


class FunctionEmitter:
    """Emits ``kernels`` (in the order given) of ``extraction`` into one Relax function.

    ``device_of`` names each kernel's device; ``vdevices`` maps a device name to its VDevice.
    ``reads`` are the tensors the function receives (model inputs, or other segments' outputs), each
    already on the device it is listed with; weights and constants become parameters automatically,
    one per device that reads them (listed in ``weight_params`` after emission). ``returns`` are the
    tensors to return, each on the device it is listed with.
    """

    def __init__(self, extraction: Extraction, device_of: dict[str, str], vdevices: dict[str, Any]):
        self.extraction = extraction
        self.device_of = device_of
        self.vdevices = vdevices
        self.param_types = param_types(extraction)

    def tensor_type(self, ref: Ref, device: str) -> Any:
        """The Relax type of the tensor ``ref`` placed on ``device``."""
        ref_type = self._type(ref)
        return relax.TensorType(ref_type.shape, ref_type.dtype, vdevice=self.vdevices[device])

    def _type(self, ref: Ref):
        if ref.kind == "view":
            base, shape = self.extraction.views[ref]
            return relax.TensorType(list(shape), self._type(base).dtype)
        if ref.kind == "kernel":
            out = self.extraction.graph.kernels[ref.name].attrs["outputs"][ref.index or 0]
            return relax.TensorType(list(out["shape"]), out["dtype"])
        if ref.kind == "const":
            value = self.extraction.constants[ref.name].value
            return relax.TensorType(list(value.shape), str(value.dtype))
        if ref.kind == PACKED:
            kind, name, lanes = packed_source(ref.name)
            source = self._type(Ref(kind, name))
            return relax.TensorType(packed_shape([int(d) for d in source.shape.values], lanes), source.dtype)
        return self.param_types[ref]

    def emit(
        self,
        builder: relax.BlockBuilder,
        name: str,
        kernels: list[str],
        reads: list[Param],
        returns: list[Param],
        target_funcs: dict[tuple[str, str], TargetFunc],
    ) -> list[Param]:
        """Add the function to ``builder``; returns the weight/constant parameters it takes after ``reads``.

        ``target_funcs`` maps (PrimFunc name, device) to that PrimFunc compiled for the device's target
        (added to ``builder``)."""
        read_vars = [relax.Var(p.name, self.tensor_type(p.ref, p.device)) for p in reads]
        weight_vars: dict[Param, relax.Var] = {}
        values: dict[tuple[Ref, str], Any] = {(p.ref, p.device): v for p, v in zip(reads, read_vars, strict=True)}
        made: dict[str, Any] = {}  # kernel -> its call's result var (tensor or tuple)
        kernel_set = set(kernels)

        def value(ref: Ref, device: str):
            key = (ref, device)
            if key in values:
                return values[key]
            if ref.kind in ("weight", "const", PACKED):
                param = Param(ref, device)
                var = relax.Var(param.name, self.tensor_type(ref, device))
                weight_vars[param] = var
                values[key] = var
            elif ref.kind == "view":
                base, shape = self.extraction.views[ref]
                values[key] = builder.emit(relax.op.reshape(value(base, device), list(shape)))
            elif ref.kind == "kernel" and ref.name in kernel_set and self.device_of[ref.name] == device:
                result = made[ref.name]
                values[key] = result if ref.index is None else builder.emit(relax.TupleGetItem(result, ref.index))
            else:
                home = self._home(ref, kernel_set, [d for (r, d) in values if r == ref])
                values[key] = builder.emit(relax.op.to_vdevice(value(ref, home), self.vdevices[device]))
            return values[key]

        with builder.function(name, params=None, pure=True):
            with builder.dataflow():
                for kernel in kernels:
                    device = self.device_of[kernel]
                    compiled = target_funcs[(self.extraction.kernel_func[kernel], device)]
                    refs = [
                        packed_ref(ref, compiled.packed[i]) if i in compiled.packed else ref
                        for i, ref in enumerate(self.extraction.kernel_args[kernel])
                    ]
                    args = [value(ref, device) for ref in refs]
                    outputs = self.extraction.graph.kernels[kernel].attrs["outputs"]
                    out_types = [
                        relax.TensorType(list(o["shape"]), o["dtype"], vdevice=self.vdevices[device]) for o in outputs
                    ]
                    call = relax.call_tir(compiled.gvar, args, out_types if len(out_types) > 1 else out_types[0])
                    made[kernel] = builder.emit(call, name_hint=kernel.replace(".", "_"))
                results = [value(p.ref, p.device) for p in returns]
                out = builder.emit_output(results[0] if len(results) == 1 else relax.Tuple(results))
            weights = sorted(weight_vars, key=lambda p: (p.device, p.ref.kind, p.ref.name))
            builder.emit_func_output(out, params=read_vars + [weight_vars[p] for p in weights])
        return weights

    def _home(self, ref: Ref, kernel_set: set[str], held_on: list[str]) -> str:
        """Where a tensor that this function must copy comes from: a device it was received on, else
        its producer's device."""
        if held_on:
            return held_on[0]
        if ref.kind == "kernel" and ref.name in kernel_set:
            return self.device_of[ref.name]
        raise KeyError(f"tensor {ref} is neither received by nor made in this function")
