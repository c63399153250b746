"""The TVM Relax side of tvm-diviml, installed as ``tvm_diviml.passes``.

Only this package (and the measured cost model, the zoo and the runtime) imports TVM's compiler. It
extracts the OpGraph from an IRModule (``extract``), applies a Plan (``ApplyPlan``/``apply_plan``:
vdevices, device copies, per-device targets and weights) and builds it (``build``).
"""

from .apply_plan import AppliedPlan, ApplyPlan, apply_plan, check_plan
from .build import build, placed_build_pipeline
from .extract import Extraction, extract


def ir_json_roundtrip_ok() -> bool:
    """True when ``tvm.ir.save_json``/``load_json`` round-trip an IR object (apache-tvm-ffi
    0.1.15.post2 segfaults here; setup.py pins 0.1.14.post0)."""
    import tvm
    from tvm import relax

    value = relax.const(3, "int32")
    restored = tvm.ir.load_json(tvm.ir.save_json(value))
    tvm.ir.assert_structural_equal(value, restored)
    return True


__all__ = [
    "AppliedPlan",
    "ApplyPlan",
    "Extraction",
    "apply_plan",
    "build",
    "check_plan",
    "extract",
    "ir_json_roundtrip_ok",
    "placed_build_pipeline",
]
