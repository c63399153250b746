"""Cost models: seconds per (kernel, device) and per (tensor, link).

``base`` holds the interface, ``table`` the JSON-backed table, ``roofline`` the estimate for
absent devices, ``remembered`` any of them asked once per figure. The measured (TVM) model implements
the same interface; ``fallback_time`` names its kernels that only the fallback schedule took and that
take much of the model's time.
"""

from .base import CostModel
from .remembered import RememberedCosts
from .roofline import RooflineCostModel
from .table import TableCostModel

__all__ = ["CostModel", "RememberedCosts", "RooflineCostModel", "TableCostModel"]
