"""tvm-diviml: place a neural network's kernels across heterogeneous devices with TVM Relax.

The library (graph, platform, costs, plans, the simulator, solvers, bounds) imports no TVM; the
Relax side lives in ``tvm_diviml.passes``. The names below are imported when first used, so that
``import tvm_diviml`` (and the ``diviml`` command's start, which answers Ctrl-C from its first
instant) reads no module it does not need.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Device": "platform",
    "Edge": "graph",
    "GraphInput": "graph",
    "Kernel": "graph",
    "Link": "platform",
    "OpGraph": "graph",
    "Plan": "plan",
    "Platform": "platform",
    "Problem": "problem",
    "ReplicaGroup": "plan",
    "Simulation": "simulator",
    "get_platform": "presets",
    "load": "runtime.artefact",  # an artefact `diviml run --export DIR` wrote, ready to run
    "load_platform": "presets",
    "simulate": "simulator",
}

__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tvm_diviml' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
