"""IRModule -> OpGraph at fused-kernel granularity (or per legalized operator).

The module is lowered the way the build will lower it: the sort/scan and sampling dispatch (cumsum,
sort, top-k become TIR kernels; for the host CPU, as a GPU build would keep them generic), LegalizeOps,
LiftTransformParams (weight-only
work such as transposing a weight runs once at load time, not per inference), AnnotateTIROpPattern,
FoldConstant, FuseOps, FuseTIR. Then every ``call_tir`` binding of the entry function becomes one
node, named after its PrimFunc (with a suffix .1, .2, ... for repeated PrimFuncs; Relax variable
names are not unique either, so the binding's (block, index) position is kept too). Aliases, tuples and
``TupleGetItem`` are followed to the kernel that really made a tensor. A node records its
PrimFunc, that PrimFunc's structural hash with ``global_symbol`` stripped (the profile cache key),
its FLOPs, the bytes it reads and writes, the weights it reads (a weight read by several kernels is
one weight id), and its output shapes. ``Extraction`` keeps, for every node, where each argument
comes from, so a plan can be applied to — and the kernels run from — the very same module.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax import backend

from tvm_diviml.errors import DivimlInputError, first_line, raise_if_interrupted
from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph

from ..schedules.tiling import WEIGHT_PARAMS_ATTR
from .layout import layout_passes
from .legalize import legalize_ops

log = logging.getLogger(__name__)

_CALL_TIR_OPS = ("relax.call_tir", "relax.call_tir_inplace")
# Operators whose result is their first argument's data (annotations that survive lowering).
_IDENTITY_OPS = ("relax.hint_on_device", "relax.builtin.stop_lift_params")


@dataclass(frozen=True)
class Ref:
    """Where a tensor comes from: a kernel's output (element ``index`` of a tuple output, or
    None for a single tensor), a model input, a weight (a parameter) or a constant."""

    kind: str  # "kernel" | "input" | "weight" | "const" | "view"
    name: str
    index: int | None = None


@dataclass
class Extraction:
    graph: OpGraph
    mod: Any  # the lowered tvm.IRModule the nodes refer to
    entry: str
    kernel_args: dict[str, list[Ref]] = field(default_factory=dict)  # per node, its call_tir arguments
    kernel_func: dict[str, str] = field(default_factory=dict)  # per node, its PrimFunc's name
    outputs: list[Ref] = field(default_factory=list)  # the entry function's results, flat
    weight_params: list[str] = field(default_factory=list)  # weight ids in parameter order
    constants: dict[str, Any] = field(default_factory=dict)  # const id -> its Constant
    views: dict[Ref, tuple[Ref, tuple[int, ...]]] = field(default_factory=dict)  # view -> (tensor, shape)
    transform_params: str | None = None  # the lifted weight-preparation function


def lowering_passes(fused: bool = True, lift_params: bool = True) -> list:
    """The passes extraction applies; the heterogeneous build applies the same ones. Without
    ``lift_params`` a function keeps its calling convention (its weights are not pre-transformed)."""
    passes = [
        *layout_passes(),
        backend.DispatchSampling(),
        backend.DispatchSortScan(),
        legalize_ops(),
        *([relax.transform.LiftTransformParams()] if lift_params else []),
    ]
    if fused:
        passes += [
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    else:
        passes += [relax.transform.FoldConstant()]
    # A pure reshape becomes a view of its input, as the build makes it: no kernel runs for it.
    return passes + [relax.transform.RewriteDataflowReshape()]


def lower(mod, *, fused: bool = True, lift_params: bool = True):
    """``mod`` through ``lowering_passes``, for the host CPU (the dispatch passes pick kernels by target)."""
    with tvm.target.Target("llvm"):
        return tvm.transform.Sequential(lowering_passes(fused, lift_params))(mod)


def bind_shapes(mod, entry: str, shapes: dict[str, int] | None):
    """Bind symbolic dimensions by name; fail naming any that stay symbolic."""
    if shapes:
        known = _symbolic_dims(mod[entry])
        unknown = sorted(set(shapes) - known)
        if unknown:
            raise DivimlInputError(
                f"--shape {unknown[0]}=...: the model has no symbolic dimension '{unknown[0]}'",
                field="--shape",
                hint=f"symbolic dimensions: {', '.join(sorted(known)) or 'none'}",
            )
        try:
            mod = relax.transform.BindSymbolicVars(dict(shapes), entry)(mod)
        except Exception as error:  # TVM's own error types, e.g. two symbolic variables of one name
            raise_if_interrupted()
            raise DivimlInputError(
                f"TVM cannot bind --shape {', '.join(f'{k}={v}' for k, v in shapes.items())} ({first_line(error)})",
                field="--shape",
                hint="export the model with these dimensions fixed, or with distinct names for them",
            ) from None
    left = sorted(_symbolic_dims(mod[entry]))
    if left:
        raise DivimlInputError(
            f"the model's shapes depend on the symbolic dimension '{left[0]}'",
            field="MODEL",
            hint=f"bind it with --shape {left[0]}=VALUE (symbolic: {', '.join(left)})",
        )
    return mod


INT32_ELEMENTS = 2**31 - 1  # TVM's lowering indexes tensors with 32-bit loop variables


def refuse_tensors_past_int32(func) -> None:
    """A tensor of more elements than a 32-bit index reaches (``resnet18:batch=1000000000``) makes
    TVM's lowering fail deep inside a pass: refuse it first, naming its shape."""
    for var, info in _tensor_infos(func):
        elements = math.prod(int(d) for d in info.shape.values)
        if elements > INT32_ELEMENTS:
            shape = "x".join(str(int(d)) for d in info.shape.values)
            raise DivimlInputError(
                f"tensor '{var}' ({shape}, {elements:.3g} elements) is past the {INT32_ELEMENTS + 1:.3g} elements "
                "TVM's kernels index",
                field="MODEL",
                hint="choose smaller model options (batch, resolution, seq) or --shape values",
            )


def _tensor_infos(func):
    """(name, TensorType) of every statically shaped tensor ``func`` takes or binds."""
    bound = [b.var for block in func.body.blocks for b in block.bindings]
    for var in list(func.params) + bound:
        for one in var.ty.fields if isinstance(var.ty, relax.TupleType) else [var.ty]:
            if isinstance(one, relax.TensorType) and isinstance(one.shape, relax.ShapeExpr):
                if all(isinstance(d, tvm.tirx.IntImm) for d in one.shape.values):
                    yield var.name, one


def extract(
    mod, entry: str | None = None, *, fused: bool = True, shapes: dict[str, int] | None = None, name: str = "model"
) -> Extraction:
    """The OpGraph of ``mod``'s function ``entry`` (default: "forward", else "main")."""
    functions = sorted(gv.name_hint for gv, f in mod.functions_items() if isinstance(f, relax.Function))
    entry = entry or ("forward" if "forward" in functions else "main")
    if entry not in functions:
        raise DivimlInputError(
            f"the module has no Relax function '{entry}'",
            field="entry",
            hint=f"name one of {', '.join(functions) or 'none: the module holds no Relax function'}",
        )
    mod = bind_shapes(mod, entry, shapes)
    refuse_tensors_past_int32(mod[entry])
    func = mod[entry]
    num_inputs = _num_inputs(func)
    lowered = lower(mod, fused=fused)
    lifted = f"{entry}_transform_params"
    lifted = lifted if any(gv.name_hint == lifted for gv in lowered.get_global_vars()) else None
    names = _weight_names(lowered, lifted, func, num_inputs)
    extraction = _Walker(lowered, entry, num_inputs, names).run(name)
    extraction.transform_params = lifted
    return extraction


def _weight_names(lowered, lifted: str | None, func, num_inputs: int) -> list[str | None]:
    """For each weight the lowered entry takes: the model parameter it is computed from alone (a
    transposed or re-laid-out weight keeps its parameter's name), else None (its lifted name)."""
    if lifted is None:
        return []
    transform = lowered[lifted]
    (packed,) = transform.params
    names = [param.name for param in func.params[num_inputs:]]
    sources: dict[Any, frozenset[int]] = {}
    values = {}
    for block in transform.body.blocks:
        for binding in block.bindings:
            value = values[binding.var] = binding.value
            if isinstance(value, relax.TupleGetItem) and value.tuple_value.same_as(packed):
                sources[binding.var] = frozenset([int(value.index)])
            else:
                used = [sources.get(var, frozenset()) for var in relax.analysis.free_vars(value)]
                sources[binding.var] = frozenset().union(*used)
    returned = values.get(transform.body.body, transform.body.body)
    fields = returned.fields if isinstance(returned, relax.Tuple) else [returned]
    return [names[next(iter(sources[f]))] if len(sources.get(f, ())) == 1 else None for f in fields]


# ---------------------------------------------------------------------- helpers
def tensor_bytes(ty) -> float:
    """Bytes of a static-shaped tensor struct info, or the sum over a tuple's fields."""
    if isinstance(ty, relax.TupleType):
        return sum(tensor_bytes(f) for f in ty.fields)
    if isinstance(ty, relax.TensorType) and ty.shape is not None:
        dims = [int(d) for d in ty.shape.values]
        return float(np.prod(dims, dtype=np.int64)) * np.dtype(str(ty.dtype)).itemsize
    return 0.0


def _describe(ty) -> list[dict]:
    if isinstance(ty, relax.TupleType):
        return [d for f in ty.fields for d in _describe(f)]
    if isinstance(ty, relax.TensorType) and ty.shape is not None:
        return [{"shape": [int(d) for d in ty.shape.values], "dtype": str(ty.dtype)}]
    return []


def _symbolic_dims(func) -> set[str]:
    names = set()
    for param in func.params:
        ty = param.ty
        fields = ty.fields if isinstance(ty, relax.TupleType) else [ty]
        for f in fields:
            if isinstance(f, relax.TensorType) and f.shape is not None:
                for dim in f.shape.values:
                    if not isinstance(dim, tvm.tirx.IntImm):
                        names.add(str(dim))
    return names


def _num_inputs(func) -> int:
    if func.attrs is not None and "num_input" in func.attrs:
        return int(func.attrs["num_input"])
    return len(func.params)


def primfunc_hash(func) -> str:
    """A process-stable structural hash, blind to the symbol name the PrimFunc happens to carry."""
    import tvm_ffi

    if func.attrs is not None and "global_symbol" in func.attrs:
        func = func.without_attr("global_symbol")
    return f"{tvm_ffi.structural_hash(func) & 0xFFFFFFFFFFFFFFFF:016x}"


def primfunc_flops(func) -> float:
    try:
        return float(tvm.s_tir.analysis.estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception as error:  # TVM raises TVMError subclasses for loops it cannot count
        raise_if_interrupted()
        log.warning("cannot count FLOPs of a PrimFunc (%s); counting 0", error)
        return 0.0


class _Walker:
    """Follows the entry function's bindings, turning call_tir bindings into nodes."""

    def __init__(self, mod, entry: str, num_inputs: int, weight_names: list[str | None]):
        self.mod, self.entry, self.weight_names = mod, entry, weight_names
        self.func = mod[entry]
        self.num_inputs = num_inputs
        self.sources: dict[Any, Any] = {}  # relax.Var -> Ref | tuple of sources | None
        self.kernels: list[Kernel] = []
        self.kernel_args: dict[str, list[Ref]] = {}
        self.kernel_func: dict[str, str] = {}
        self.edges: dict[tuple[str, str], dict[Ref, float]] = {}
        self.input_consumers: dict[str, list[str]] = {}
        self.weights: dict[str, float] = {}
        self.constants: dict[str, Any] = {}
        self.const_ids: dict[Any, str] = {}
        self.flops: dict[str, float] = {}
        self.hashes: dict[str, str] = {}
        self.used_names: dict[str, int] = {}
        self.views: dict[Ref, tuple[Ref, tuple[int, ...]]] = {}

    def run(self, name: str) -> Extraction:
        params = list(self.func.params)
        # The lowered function may have more parameters than the original (lifted weights).
        inputs = params[: self.num_inputs]
        weight_params = params[self.num_inputs :]
        graph_inputs = []
        for param in inputs:
            self.sources[param] = Ref("input", param.name)
            self.input_consumers[param.name] = []
        weight_ids = []
        named = self.weight_names if len(self.weight_names) == len(weight_params) else [None] * len(weight_params)
        for param, source in zip(weight_params, named, strict=True):
            wid = self._unique(source or param.name, self.weights)
            self.sources[param] = Ref("weight", wid)
            self.weights[wid] = tensor_bytes(param.ty)
            weight_ids.append(wid)
        body = self.func.body
        for block_index, block in enumerate(body.blocks):
            for binding_index, binding in enumerate(block.bindings):
                self._bind(binding, (block_index, binding_index))
        outputs = self._flatten(self._source_of(body.body))
        self._mark_weight_params()
        for param in inputs:
            graph_inputs.append(
                GraphInput(param.name, tensor_bytes(param.ty), tuple(dict.fromkeys(self.input_consumers[param.name])))
            )
        edges = [Edge(src, dst, sum(refs.values())) for (src, dst), refs in self.edges.items()]
        output_kernels = list(dict.fromkeys(r.name for r in map(self._base, outputs) if r.kind == "kernel"))
        graph = OpGraph(
            self.kernels,
            edges,
            inputs=graph_inputs,
            outputs=output_kernels,
            weights=self.weights,
            name=name,
            attrs={"entry": self.entry},
        )
        return Extraction(
            graph,
            self.mod,
            self.entry,
            self.kernel_args,
            self.kernel_func,
            outputs,
            weight_ids,
            self.constants,
            self.views,
        )

    def _mark_weight_params(self) -> None:
        """Give each PrimFunc the positions of the parameters that every call of it fills with a weight or
        a constant (``WEIGHT_PARAMS_ATTR``): a CPU schedule may lay those out for its vector loads,
        since the runtime packs them once at upload (``runtime/packing.py``). A view of a weight is
        made per inference: not one of them."""
        positions: dict[str, set[int]] = {}
        for node, func_name in self.kernel_func.items():
            fixed = {i for i, ref in enumerate(self.kernel_args[node]) if ref.kind in ("weight", "const")}
            positions[func_name] = positions.get(func_name, fixed) & fixed
        for func_name, fixed in positions.items():
            if fixed:
                gvar = self.mod.get_global_var(func_name)
                self.mod[gvar] = self.mod[gvar].with_attr(WEIGHT_PARAMS_ATTR, sorted(fixed))
                self.hashes[func_name] = primfunc_hash(self.mod[gvar])
        for kernel in self.kernels:
            kernel.attrs["primfunc_hash"] = self.hashes[kernel.attrs["primfunc"]]

    # -------------------------------------------------------------- bindings
    def _bind(self, binding, position: tuple[int, int]) -> None:
        var = binding.var
        if not isinstance(binding, relax.VarBinding):
            self.sources[var] = None  # a match_cast: shapes only, no data dependency we track
            return
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in _CALL_TIR_OPS:
            self._kernel(var, value, position)
        elif isinstance(value, relax.Tuple):
            self.sources[var] = tuple(self._source_of(f) for f in value.fields)
        elif isinstance(value, relax.TupleGetItem):
            source = self._source_of(value.tuple_value)
            self.sources[var] = _element(source, value.index)
        elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.reshape":
            view = Ref("view", f"{var.name}#{position[0]}.{position[1]}")
            self.views[view] = (self._source_of(value.args[0]), tuple(int(d) for d in value.ty.shape.values))
            self.sources[var] = view
        elif isinstance(value, (relax.Var, tvm.ir.expr.Constant)):
            self.sources[var] = self._source_of(value)
        elif _op_name(value) in _IDENTITY_OPS:
            self.sources[var] = self._source_of(value.args[0])
        elif _holds_tensors(value.ty):
            # A tensor made by neither a kernel nor a view: treating it as its input would give
            # wrong outputs, and the build cannot place it.
            raise DivimlInputError(
                f"'{var.name}' is computed by {_op_name(value)}, which lowering leaves outside any TIR kernel",
                field="MODEL",
                hint="the build places TIR kernels only; express it with operators TVM legalizes",
            )
        else:
            self.sources[var] = None  # shapes and scalars: no tensor data

    def _kernel(self, var, call, position: tuple[int, int]) -> None:
        global_var = call.args[0]
        func_name = global_var.name_hint
        func = self.mod[global_var]
        if func_name not in self.flops:
            self.flops[func_name] = primfunc_flops(func)
            self.hashes[func_name] = primfunc_hash(func)
        node = self._unique(func_name, self.used_names)
        self.used_names[node] = 1
        args: list[Ref] = []
        weights: list[str] = []
        read_bytes: dict[Ref, float] = {}
        for arg in call.args[1].fields:
            refs = self._flatten(self._source_of(arg))
            args.extend(refs)
            nbytes = tensor_bytes(arg.ty)
            for ref in map(self._base, refs):
                share = nbytes / len(refs)
                read_bytes[ref] = share
                if ref.kind == "kernel":
                    self.edges.setdefault((ref.name, node), {})[ref] = share
                elif ref.kind == "input":
                    self.input_consumers[ref.name].append(node)
                else:
                    weights.append(ref.name)
        out_ty = call.ty
        output_bytes = tensor_bytes(out_ty)
        self.kernels.append(
            Kernel(
                node,
                flops=self.flops[func_name],
                bytes_moved=sum(read_bytes.values()) + output_bytes,
                output_bytes=output_bytes,
                weights=tuple(dict.fromkeys(weights)),
                attrs={
                    "primfunc": func_name,
                    "primfunc_hash": self.hashes[func_name],
                    "outputs": _describe(out_ty),
                    "var": var.name,
                    "binding": list(position),
                },
            )
        )
        self.kernel_args[node] = args
        self.kernel_func[node] = func_name
        if isinstance(out_ty, relax.TupleType):
            self.sources[var] = tuple(Ref("kernel", node, i) for i in range(len(out_ty.fields)))
        else:
            self.sources[var] = Ref("kernel", node)

    # -------------------------------------------------------------- sources
    def _source_of(self, expr):
        if isinstance(expr, tvm.ir.expr.Constant):
            if expr not in self.const_ids:
                cid = f"const{len(self.constants)}"
                self.const_ids[expr] = cid
                self.constants[cid] = expr
                self.weights[cid] = float(expr.value.numpy().nbytes)
            return Ref("const", self.const_ids[expr])
        if isinstance(expr, relax.Tuple):
            return tuple(self._source_of(f) for f in expr.fields)
        if isinstance(expr, relax.TupleGetItem):
            return _element(self._source_of(expr.tuple_value), expr.index)
        if isinstance(expr, relax.Var):
            if expr not in self.sources:
                raise DivimlInputError(f"variable '{expr.name}' is used before it is bound", field="MODEL")
            return self.sources[expr]
        return None  # shapes, PrimValues: no tensor data

    def _flatten(self, source) -> list[Ref]:
        if source is None:
            return []
        if isinstance(source, Ref):
            return [source]
        return [ref for item in source for ref in self._flatten(item)]

    def _base(self, ref: Ref) -> Ref:
        """The tensor a view looks at (views of views followed)."""
        while ref.kind == "view":
            ref = self.views[ref][0]
        return ref

    @staticmethod
    def _unique(name: str, taken: dict) -> str:
        if name not in taken:
            return name
        suffix = 1
        while f"{name}.{suffix}" in taken:
            suffix += 1
        return f"{name}.{suffix}"


def _op_name(value) -> str:
    """What a binding calls: ``relax.cumsum``, ``relax.call_pure_packed(my_library.f)``, or its type."""
    if not isinstance(value, relax.Call):
        return type(value).__name__
    if isinstance(value.op, tvm.ir.Op):
        callee = value.args[0] if value.args and isinstance(value.args[0], relax.ExternFunc) else None
        return value.op.name + (f"({callee.global_symbol})" if callee is not None else "")
    return getattr(value.op, "name_hint", None) or type(value.op).__name__


def _holds_tensors(ty) -> bool:
    if isinstance(ty, relax.TupleType):
        return any(_holds_tensors(f) for f in ty.fields)
    return isinstance(ty, relax.TensorType)


def _element(source, index: int):
    """Element ``index`` of a tuple-valued source (a tuple of sources, or a kernel's tuple output)."""
    if isinstance(source, tuple):
        return source[index]
    if isinstance(source, Ref) and source.kind == "kernel":
        return Ref("kernel", source.name, index)
    return source
