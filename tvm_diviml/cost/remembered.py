"""A cost model that remembers: each (kernel, device) and (bytes, link) asked of the model beneath once.

For solvers that score many plans of one graph (the symmetric solver simulates hundreds of them):
every simulation asks for every kernel's and tensor's time again.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..platform import Platform
from .base import CostModel


class RememberedCosts(CostModel):
    """``base``'s costs on ``platform``, each asked once; the kernels in ``free`` take no time anywhere
    (the entry and exit kernels a solver adds to a sub-problem, which ``base`` does not know)."""

    def __init__(self, base: CostModel, platform: Platform, *, free: Iterable[str] = ()):
        super().__init__(platform)
        self.base = base
        self.free = frozenset(free)
        # What the simulator charges beyond kernels and transfers, as ``base`` has it: without them a
        # symmetric plan on measured costs claimed 255 us where the simulator priced it at 305 us.
        self.executor_segments = base.executor_segments
        self.executor_overheads = base.executor_overheads
        self.prediction_error = base.prediction_error
        self._compute: dict[tuple[str, str], float] = {}
        self._transfer: dict[tuple[float, str, str], float] = {}

    def compute_s(self, kernel: str, device: str) -> float:
        if kernel in self.free:
            return 0.0
        key = (kernel, device)
        if key not in self._compute:
            self._compute[key] = self.base.compute_s(kernel, device)
        return self._compute[key]

    def transfer_s(self, nbytes: float, src: str, dst: str) -> float:
        key = (nbytes, src, dst)
        if key not in self._transfer:
            self._transfer[key] = self.base.transfer_s(nbytes, src, dst)
        return self._transfer[key]
