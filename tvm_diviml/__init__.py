"""tvm-diviml: place a neural network's kernels across heterogeneous devices with TVM Relax.

The library (graph, platform, costs, plans, the simulator, solvers, bounds) imports no TVM; the
Relax side lives in ``tvm_diviml.passes``.
"""

from .graph import Edge, GraphInput, Kernel, OpGraph
from .plan import Plan, ReplicaGroup
from .platform import Device, Link, Platform
from .presets import get_platform, load_platform
from .problem import Problem
from .simulator import Simulation, simulate

__version__ = "0.1.0"

__all__ = [
    "Device",
    "Edge",
    "GraphInput",
    "Kernel",
    "Link",
    "OpGraph",
    "Plan",
    "Platform",
    "Problem",
    "ReplicaGroup",
    "Simulation",
    "get_platform",
    "load_platform",
    "simulate",
    "__version__",
]
