"""HEFT (Topcuoglu, Hariri and Wu, IEEE TPDS 2002): kernels by decreasing upward rank, each on the
device where it finishes earliest, idle gaps filled (``toolkit.list_scheduling.heft_placement``)."""

from __future__ import annotations

from ..toolkit.list_scheduling import heft_placement
from .list_scheduler import ListScheduler


class Heft(ListScheduler):
    name = "heft"
    placement = staticmethod(heft_placement)
