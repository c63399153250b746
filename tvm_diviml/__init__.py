"""tvm-diviml: place a neural network's kernels across heterogeneous devices with TVM Relax.

The library (graph, platform, costs, plans, the simulator, solvers, bounds) imports no TVM; the
Relax side lives in ``tvm_diviml.passes``. The face below is what a script needs: ``load_model`` (a zoo
name, a model file or a model object, built and extracted), ``load_workload`` (a model and a platform,
priced), ``plan_model`` (solved, with its bound), ``run_model`` (``diviml run``: planned, built, checked
and timed here), ``extract``, ``apply_plan``, ``build`` and ``PartitionForDevices`` (the Relax side),
``load`` (an exported build).
Its names are imported when first used, so that ``import tvm_diviml`` (and the ``diviml`` command's
start, which answers Ctrl-C from its first instant) reads no module it does not need.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "apply_plan": "passes",
    "build": "passes",
    "Device": "platform",
    "Edge": "graph",
    "extract": "passes",
    "get_platform": "presets",
    "get_solver": "solvers",
    "GraphInput": "graph",
    "Kernel": "graph",
    "Link": "platform",
    "load": "runtime.artefact",  # an artefact `diviml run --export DIR` wrote, ready to run
    "load_model": "app.load",
    "load_platform": "presets",
    "load_workload": "app.workload",
    "LoadOptions": "app.job",
    "OpGraph": "graph",
    "PartitionForDevices": "app.partition",
    "partition_options": "app.partition",
    "Plan": "plan",
    "plan_model": "planning",
    "Platform": "platform",
    "Problem": "problem",
    "ReplicaGroup": "plan",
    "run_model": "app.run",
    "RunOptions": "app.run",
    "simulate": "simulator",
    "Simulation": "simulator",
    "Solved": "planning",
    "SolveOptions": "app.job",
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
