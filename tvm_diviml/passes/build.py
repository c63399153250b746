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

from tvm_diviml.cost.measured import compile_failure
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
