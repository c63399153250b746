"""The problem that solvers and bounds model: the caller's, less what cannot change its optimum.

Interchangeable devices beyond the kernel count go (``device_classes.with_fewer_devices``), and prices
outside the range that matters are brought into it (``CappedCosts``): a time more than ``CAP_FACTOR``
times the best single device's value (as a serial schedule: kernels and copies one after another) is
priced at that (no plan paying it beats the single device), and one below its ``NEGLIGIBLE`` fraction
at zero. The validators accept figures 1e20 apart (a device that needs 1e5 s for a kernel another
runs in 1e-6 s, a 1e3 B/s link beside 1e12 B/s ones); in range, no MIP coefficient strays past
HiGHS's limit (it refuses 1e15) and no CP-SAT tick count past 64 bits. Both changes only lower prices
or drop spare devices, so every bound found stays a bound; the simulator still scores every plan at
the caller's prices, and prices already in range are untouched.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import replace

from ..cost.base import CostModel
from ..platform import Link
from ..problem import Problem
from .device_classes import prices_by_platform, with_fewer_devices
from .windows import trivial_horizon_s

log = logging.getLogger(__name__)

# The range kept, relative to the best single device's value: 1e12 between its ends, against the 1e15
# at which HiGHS refuses a coefficient.
CAP_FACTOR = 1e3
NEGLIGIBLE = 1e-9


class CappedCosts(CostModel):
    """``base``'s prices, each within [``floor_s``, ``cap_s``] or zero (``inf`` stays: cannot run)."""

    def __init__(self, base: CostModel, floor_s: float, cap_s: float):
        super().__init__(base.platform)
        self.base, self.floor_s, self.cap_s = base, floor_s, cap_s
        self.executor_segments = base.executor_segments
        self.executor_overheads = base.executor_overheads
        self.prediction_error = base.prediction_error

    def _within(self, seconds: float) -> float:
        return 0.0 if seconds < self.floor_s else min(seconds, self.cap_s)

    def compute_s(self, kernel: str, device: str) -> float:
        seconds = self.base.compute_s(kernel, device)
        return seconds if math.isinf(seconds) else self._within(seconds)

    def transfer_s(self, nbytes: float, src: str, dst: str) -> float:
        return self._within(self.base.transfer_s(nbytes, src, dst))

    def source(self, kernel: str, device: str) -> str:
        return self.base.source(kernel, device)


def solvable(problem: Problem, keeping: Iterable[str] = (), *, every_device: bool = False) -> Problem:
    """``problem`` as solvers and bounds model it (module docstring); kept in its memo, and its own.
    With all its devices where ``every_device`` (replicas: a kernel may run on as many identical
    devices as there are) or where some of ``keeping`` (those of a plan to start from) would go."""
    memo = problem.memo
    if not every_device:
        if "solvable" not in memo:
            memo["solvable"] = solvable(with_fewer_devices(problem), every_device=True)
        if set(keeping) <= set(memo["solvable"].platform.device_names):
            return memo["solvable"]
    if "solvable_every_device" not in memo:
        in_range = with_prices_in_range(problem)
        in_range.memo.update(solvable=in_range, solvable_every_device=in_range)
        memo["solvable_every_device"] = in_range
    return memo["solvable_every_device"]


def with_prices_in_range(problem: Problem) -> Problem:
    """``problem`` with ``CappedCosts`` where a price lies outside their range, else itself."""
    costs, graph, host = problem.costs, problem.graph, problem.platform.host
    devices = problem.platform.device_names
    sizes = [b for b in [*(e.bytes for e in graph.edges), *(i.bytes for i in graph.inputs)] if b > 0]
    outputs = [graph.kernels[k].output_bytes for k in graph.output_set if graph.kernels[k].output_bytes > 0]
    compute = {d: [costs.compute_s(k, d) for k in graph.kernels] for d in devices}
    alone = [  # each device alone, one kernel and copy after another: no better plan is slower
        sum(compute[d])
        + sum(costs.transfer_s(i.bytes, host, d) for i in graph.inputs)
        + sum(costs.transfer_s(nbytes, d, host) for nbytes in outputs)
        for d in devices
    ]
    upper_s = min(alone)
    if math.isinf(upper_s):  # no device runs every kernel
        upper_s = trivial_horizon_s(problem)
    cap_s, floor_s = CAP_FACTOR * upper_s, NEGLIGIBLE * upper_s
    prices = [p for row in compute.values() for p in row if not math.isinf(p)]
    ends = (min(sizes + outputs), max(sizes + outputs)) if sizes + outputs else ()
    if prices_by_platform(problem):  # every link's price at a size is one of its distinct figures'
        prices += [Link("", "", *figures).transfer_s(b) for figures in problem.platform.link_figures() for b in ends]
    else:
        prices += [costs.transfer_s(b, s, d) for b in ends for s in devices for d in devices]
    if all(p == 0 or floor_s <= p <= cap_s for p in prices):
        return problem
    log.info("prices capped to [%.3g s, %.3g s] for the solvers (the simulator keeps them)", floor_s, cap_s)
    return replace(problem, costs=CappedCosts(costs, floor_s, cap_s))
