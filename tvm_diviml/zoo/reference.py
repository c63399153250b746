"""Run a BuiltModel whole on this machine's CPU: the reference that every split build must match."""

from __future__ import annotations

import numpy as np

from ..runtime.vm import flatten
from . import BuiltModel


def run_reference(model: BuiltModel, inputs: list[np.ndarray] | None = None) -> list[np.ndarray]:
    """Compile ``model`` for llvm with the default pipeline (fusion included) and run it once.

    Returns the outputs as numpy arrays (a tuple output becomes several arrays).
    """
    import tvm
    from tvm import relax

    target = tvm.target.Target("llvm")
    executable = tvm.compile(model.mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    device = tvm.cpu(0)
    vm = relax.VirtualMachine(executable, device)
    arrays = inputs if inputs is not None else model.sample_inputs()
    args = [tvm.runtime.tensor(a, device) for a in arrays] + [tvm.runtime.tensor(w, device) for _, w in model.params]
    return [tensor.numpy() for tensor in flatten(vm[model.entry](*args))]
