"""Running a placed model: its kernels cut into per-device segments, run by one worker thread per device."""
from .executor import ConcurrentExecutor, SegmentCall, SegmentError, SegmentTimeoutError
from .segments import Boundary, Segment, segment_boundaries, segment_graph, split_segments

__all__ = ["Boundary", "ConcurrentExecutor", "Segment", "SegmentCall", "SegmentError", "SegmentTimeoutError",
           "segment_boundaries", "segment_graph", "split_segments"]
