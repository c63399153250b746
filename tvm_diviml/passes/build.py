"""Compile a placed module: ``tvm.compile(mod, target=None)``, every PrimFunc carrying its own target.

The Relax pipeline is TVM's default build pipeline; a build across devices leaves out
``StaticPlanBlockMemory``: in TVM 0.27 that planner shares one storage between tensors of *different*
vdevices (a cpu:1 buffer reused for a cpu:0 tensor; the kernel then refuses its arguments' device
ids), so each tensor is allocated on its own device instead, through the VM's pooled allocator. A
one-device build keeps the planner (randwire_ba at its small size: 48 us a call without, 40 with).

When TVM cannot compile the module, each kernel is compiled alone to find the one it rejects, and
the error names that kernel, its operator, its tensors' dtypes and the target, in one line.
"""

from __future__ import annotations

import logging
import time

import tvm
from tvm.relax import backend, transform

from tvm_diviml.errors import DivimlInputError, first_line, raise_if_interrupted
from tvm_diviml.runtime.vm import PlacedExecutable

from .apply_plan import AppliedPlan

log = logging.getLogger(__name__)


def placed_build_pipeline(one_device: bool = False) -> tvm.transform.Pass:
    """TVM 0.27's ``default_build_pipeline``, less the storage sharing across devices unless the build
    has ``one_device`` (module docstring)."""
    planner = [transform.StaticPlanBlockMemory()] if one_device else []
    return tvm.transform.Sequential(
        [
            backend.DispatchSampling(),
            backend.DispatchSortScan(),
            transform.LegalizeOps(),
            transform.RewriteDataflowReshape(),
            transform.ToNonDataflow(),
            transform.RemovePurityChecking(),
            transform.CallTIRRewrite(),
            *planner,
            transform.RewriteCUDAGraph(),
            transform.LowerAllocTensor(),
            transform.KillAfterLastUse(),
            transform.LowerRuntimeBuiltin(),
            transform.ComputePrimValue(),
            transform.VMShapeLower(),
            transform.AttachGlobalSymbol(),
        ],
        name="diviml.placed_build_pipeline",
    )


def build(applied: AppliedPlan) -> PlacedExecutable:
    """The executable of a placed module (one artifact for every device; ``export`` writes it)."""
    began = time.perf_counter()
    try:
        one_device = len(applied.placement.devices) == 1
        executable = tvm.compile(applied.mod, target=None, relax_pipeline=placed_build_pipeline(one_device))
    except Exception as error:  # TVM raises InternalError, ValueError, TVMError-likes from codegen
        raise compile_failure(applied.mod, error) from None
    log.info(
        "built %s for %s in %.1f s",
        applied.placement.entry,
        ", ".join(applied.placement.devices),
        time.perf_counter() - began,
    )
    return PlacedExecutable(executable, applied.placement)


def compile_failure(mod, error: BaseException, target=None) -> DivimlInputError:
    """The one-line error for a module TVM failed to compile: the first kernel that fails when
    compiled alone (for its own target, else ``target``), or TVM's own first line when every kernel
    compiles by itself."""
    import tvm

    raise_if_interrupted()
    for gvar, func in mod.functions_items():
        own = func.attrs["target"] if func.attrs is not None and "target" in func.attrs else None
        if not isinstance(func, tvm.tirx.PrimFunc) or (own or target) is None:
            continue
        kernel_target = tvm.target.Target(own or target)
        try:
            tvm.compile(tvm.IRModule({gvar.name_hint: func}), target=kernel_target)
        except Exception as kernel_error:
            raise_if_interrupted()
            return DivimlInputError(
                f"TVM {tvm.__version__} cannot compile kernel '{gvar.name_hint}' ({kernel_signature(func)}) "
                f"for {kernel_target.kind.name}: {type(kernel_error).__name__}: {first_line(kernel_error)}",
                field="MODEL",
                hint="no rewrite of this operator and dtype is known; export the model "
                "with another dtype for it, or report it to TVM",
            )
    return DivimlInputError(
        f"TVM {tvm.__version__} cannot build the module: {type(error).__name__}: {first_line(error)}", field="MODEL"
    )


def kernel_signature(func) -> str:
    """``reads bool[1, 16]; writes bool[1, 16]``: a PrimFunc's buffers (the last ones are its outputs)."""
    import tvm

    buffers = list(func.params)  # TVM 0.27: a PrimFunc's parameters are its buffers
    outputs = int(func.attrs["num_outputs"]) if func.attrs and "num_outputs" in func.attrs else 1

    def describe(buffer) -> str:
        dims = (str(int(d)) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in buffer.shape)
        return f"{buffer.dtype}[{', '.join(dims)}]"

    reads = ", ".join(map(describe, buffers[:-outputs])) or "nothing"
    writes = ", ".join(map(describe, buffers[-outputs:]))
    return f"reads {reads}; writes {writes}"
