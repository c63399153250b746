"""Cost models: seconds per (kernel, device) and per (tensor, link).

``base`` holds the interface, ``table`` the JSON-backed table, ``roofline`` the estimate for
absent devices. The measured (TVM) model implements the same interface.
"""

from .base import CostModel
from .roofline import RooflineCostModel
from .table import TableCostModel

__all__ = ["CostModel", "RooflineCostModel", "TableCostModel"]
