"""Roofline estimate for devices that are not present (TVM-free).

time = max(FLOPs / effective peak, bytes moved / effective bandwidth) + launch overhead, with the
*effective* figures of the Platform (datasheet x stated efficiency), never the bare datasheet peak.
"""

from __future__ import annotations

import math

from ..graph import OpGraph
from ..platform import Platform
from .base import CostModel


class RooflineCostModel(CostModel):
    def __init__(self, graph: OpGraph, platform: Platform):
        super().__init__(platform)
        self.graph = graph

    def compute_s(self, kernel: str, device: str) -> float:
        node = self.graph.kernels[kernel]
        if node.allowed_devices is not None and device not in node.allowed_devices:
            return math.inf
        dev = self.platform.device(device)
        return (
            max(node.flops / dev.effective_flops, node.bytes_moved / dev.effective_bandwidth_Bps)
            + dev.launch_overhead_s
        )

    def source(self, kernel: str, device: str) -> str:
        return "estimated"
