"""Running a placed build: its kernels cut into per-device segments, run by one worker thread per
device (or whole, in one VM); several builds side by side for a replicated plan or a batch split.
Only ``tvm.runtime`` is used, so a runtime-only TVM suffices."""

from ..segments import Boundary, Segment, segment_boundaries, segment_graph, split_segments
from .concurrent import ConcurrentRunner
from .executor import ConcurrentExecutor, SegmentCall, SegmentError, SegmentTimeoutError
from .placement import Placement
from .replicas import ReplicaError, ReplicatedRunner, SplitBatchRunner
from .routed import RoutedBuild, SplitBuild
from .vm import PlacedExecutable, SingleVMRunner

__all__ = [
    "Boundary",
    "ConcurrentExecutor",
    "ConcurrentRunner",
    "Placement",
    "PlacedExecutable",
    "ReplicaError",
    "ReplicatedRunner",
    "RoutedBuild",
    "Segment",
    "SegmentCall",
    "SegmentError",
    "SegmentTimeoutError",
    "SingleVMRunner",
    "SplitBatchRunner",
    "SplitBuild",
    "segment_boundaries",
    "segment_graph",
    "split_segments",
]
