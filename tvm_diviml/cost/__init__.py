"""Cost models: seconds per (kernel, device) and per (tensor, link). TVM-free: they only price.

``base`` holds the interface, ``table`` the table (read from JSON, or made from figures measured
here: ``TableCostModel.from_provenance``), ``provenance`` the record of how measured figures were made,
``roofline`` the estimate for absent devices, ``remembered`` any of them asked once per figure, ``fit``
least-squares roofline and link fits. ``catalog.create`` makes one by name: "roofline", a table's
path, or "measured", which this package cannot make (measuring needs TVM, on the profiling floor
above): the caller passes the measuring factory, ``tvm_diviml.profiling.profile`` with its model bound.
"""

from .base import CostModel
from .catalog import create
from .provenance import Provenance
from .remembered import RememberedCosts
from .roofline import RooflineCostModel
from .table import TableCostModel

__all__ = ["CostModel", "Provenance", "RememberedCosts", "RooflineCostModel", "TableCostModel", "create"]
