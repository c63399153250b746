"""Identical devices: those a solver cannot tell apart (the same prices for everything it charges)
become one class, so that a DP or a MIP chooses a class and a count instead of a device; and devices
that a swap leaves the whole problem unchanged, of which no plan needs more than it has kernels."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace

import numpy as np

from ..cost.base import CostModel
from ..platform import Platform
from ..problem import Problem

Description = tuple  # numbers and numpy arrays: what a device charges, as the solver sees it

# Two tensor sizes at which a cost model's transfers are compared: every model prices a copy as
# latency + bytes / bandwidth, which two sizes pin down.
PROBE_BYTES = (1.0, 2.0**20)


def identical_devices(
    devices: Sequence[str], describe: Callable[[str], Description]
) -> list[tuple[list[str], Description]]:
    """``devices`` grouped by equal descriptions, in first-seen order: (the group's devices, their
    shared description)."""
    groups: dict[Hashable, tuple[list[str], Description]] = {}
    for device in devices:
        description = describe(device)
        key = tuple(part.tobytes() if isinstance(part, np.ndarray) else part for part in description)
        groups.setdefault(key, ([], description))[0].append(device)
    return list(groups.values())


def interchangeable_devices(problem: Problem) -> list[list[str]]:
    """The devices in classes that a swap of two members leaves the problem unchanged (the same
    figures but name and index, the same price for every kernel, the same links to and from every
    other device, and both ways between them), in platform order. The host and the devices of a
    platform of several servers (whose solver pairs servers' devices by position) are classes alone.
    Kept in the problem's memo; prices are read only where two devices have the same figures."""
    memo, platform, costs = problem.memo, problem.platform, problem.costs
    if "interchangeable" in memo:
        return memo["interchangeable"]
    names = platform.device_names

    def figures(device: str) -> Description:
        spec = platform.device(device)
        target = json.dumps(spec.target, sort_keys=True)
        return (device == platform.host, replace(spec, name="", device=spec.kind, target=target))

    by_figures = identical_devices(names, figures)
    if platform.servers or all(len(members) == 1 for members, _ in by_figures):
        return memo.setdefault("interchangeable", [[d] for d in names])
    feasible = {k: set(problem.feasible_devices(k)) for k in problem.graph.kernels}

    def prices(device: str) -> Description:
        return (tuple(costs.compute_s(k, device) if device in ok else math.inf for k, ok in feasible.items()),)

    link = copy_prices(problem)
    classes = []
    for members, (host, _) in by_figures:
        for priced_alike, _ in identical_devices(members, prices):
            classes += [[d] for d in priced_alike] if host else _swap_classes(priced_alike, names, link)
    position = {d: i for i, d in enumerate(names)}
    return memo.setdefault("interchangeable", sorted(classes, key=lambda members: position[members[0]]))


def _swap_classes(
    members: list[str], devices: list[str], link: Callable[[str, str], Hashable] | None
) -> list[list[str]]:
    """``members`` (alike but for their links) in classes of devices whose swap maps every link onto
    one priced the same (all of them where ``link`` is None: every link alike)."""
    classes = []
    while members:
        first, rest = members[0], members[1:]
        alike = [d for d in rest if link is None or _swappable(first, d, devices, link)]
        classes.append([first, *alike])
        taken = set(alike)
        members = [d for d in rest if d not in taken]
    return classes


def _swappable(a: str, b: str, devices: list[str], link: Callable[[str, str], Hashable]) -> bool:
    """Whether exchanging ``a`` and ``b`` maps every link onto one priced the same."""
    if link(a, b) != link(b, a):
        return False
    return all(link(a, x) == link(b, x) and link(x, a) == link(x, b) for x in devices if x != a and x != b)


def copy_prices(problem: Problem) -> Callable[[str, str], Hashable] | None:
    """What a copy from one device to another costs, as something to compare: the platform's link
    figures where the cost model prices copies by this platform (None where every link has the same:
    no swap changes a link), else the model's prices at ``PROBE_BYTES``."""
    costs = problem.costs
    if not prices_by_platform(problem):
        return lambda src, dst: tuple(costs.transfer_s(nbytes, src, dst) for nbytes in PROBE_BYTES)
    if len(problem.platform.link_figures()) <= 1:
        return None
    links = problem.platform.links
    return lambda src, dst: (links[src, dst].latency_s, links[src, dst].bandwidth_Bps)


def prices_by_platform(problem: Problem) -> bool:
    """Whether the problem's cost model prices every copy by the problem's platform's links."""
    return type(problem.costs).transfer_s is CostModel.transfer_s and problem.costs.platform is problem.platform


def with_fewer_devices(problem: Problem) -> Problem:
    """``problem`` where each class of interchangeable devices keeps its first devices, as many as
    there are kernels: a plan without replicas uses at most that many, and any such plan maps onto
    the kept ones at the same value, so the optimum and every bound stay those of ``problem`` (gpu1000
    with 16 kernels: 17 devices). A pipeline keeps at most as many stages as devices then (each stage
    holds a kernel, so no plan had more). ``problem`` itself where no device goes."""
    kept = [d for members in interchangeable_devices(problem) for d in members[: len(problem.graph)]]
    if len(kept) == len(problem.platform.devices):
        return problem
    platform = problem.platform
    chosen = set(kept)
    devices = [d for d in platform.devices if d.name in chosen]
    fewer = Platform(
        platform.name,
        devices,
        {(a, b): platform.links[a, b] for a in chosen for b in chosen if a != b},
        host=platform.host,
        transfer_model=platform.transfer_model,
        description=platform.description,
        network=platform.network,
        extra_attrs=platform.extra_attrs,
    )
    stages = None if problem.stages is None else min(problem.stages, len(devices))
    return replace(problem, platform=fewer, stages=stages)
