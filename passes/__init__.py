"""The TVM Relax side of tvm-diviml, installed as ``tvm_diviml.passes``.

Only this package (and the measured cost model, the zoo and the runtime) imports TVM. It will hold
graph extraction from an IRModule and the pass that applies a Plan; for now it offers the check
that the installed TVM can serialise IR, which a broken apache-tvm-ffi release cannot.
"""


def ir_json_roundtrip_ok() -> bool:
    """True when ``tvm.ir.save_json``/``load_json`` round-trip an IR object (apache-tvm-ffi
    0.1.15.post2 segfaults here; setup.py pins 0.1.14.post0)."""
    import tvm
    from tvm import relax

    value = relax.const(3, "int32")
    restored = tvm.ir.load_json(tvm.ir.save_json(value))
    tvm.ir.assert_structural_equal(value, restored)
    return True
