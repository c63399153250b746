"""Hypothesis strategies: random kernel DAGs with costs on the three-device unit platform, plain or
with memory, co-location, allowed devices, infinite costs and direction-dependent links."""

import math

from hypothesis import strategies as st

from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph
from tvm_diviml.platform import Device, Link, Platform

from .conftest import table, unit_platform

DEVICES = ("A", "B", "C")


@st.composite
def dag_problems(draw, max_kernels=8, transfer_model="direct"):
    """(graph, platform, costs): kernels k0..k{n-1}, edges only from lower to higher index."""
    n = draw(st.integers(1, max_kernels))
    names = [f"k{i}" for i in range(n)]
    edges = [
        Edge(names[i], names[j], draw(st.integers(0, 5))) for j in range(n) for i in range(j) if draw(st.booleans())
    ]
    kernels = [Kernel(name, output_bytes=draw(st.integers(0, 3))) for name in names]
    inputs = [GraphInput("x", draw(st.integers(0, 4)), (names[0],))]
    graph = OpGraph(kernels, edges, inputs=inputs)
    latency = draw(st.sampled_from([0.0, 0.5, 1.0]))
    platform = unit_platform(
        DEVICES, latency=latency, bandwidth=draw(st.sampled_from([1.0, 2.0])), transfer_model=transfer_model
    )
    times = {name: {d: float(draw(st.integers(1, 9))) for d in DEVICES} for name in names}
    return graph, platform, table(platform, times)


def assignments(graph):
    return st.fixed_dictionaries({k: st.sampled_from(DEVICES) for k in graph.kernels})


@st.composite
def constrained_problems(draw, max_kernels=6):
    """(graph, platform, costs) as ``dag_problems``, with what real problems carry: weights (some
    shared) against device memory, a co-location group, allowed devices, infinite costs, and links
    whose latency and bandwidth differ by direction and device pair. Every kernel keeps at least one
    device it may run on; whether any plan fits is for the brute force to say."""
    n = draw(st.integers(2, max_kernels))
    names = [f"k{i}" for i in range(n)]
    edges = [
        Edge(names[i], names[j], draw(st.integers(0, 5))) for j in range(n) for i in range(j) if draw(st.booleans())
    ]
    weights = {f"w{i}": float(draw(st.integers(1, 4))) for i in range(n)}
    used = {name: tuple(sorted(draw(st.sets(st.sampled_from(sorted(weights)), max_size=2)))) for name in names}
    colocated = set(draw(st.sets(st.sampled_from(names), max_size=2))) if draw(st.booleans()) else set()
    allowed = {}
    for name in names:
        if draw(st.integers(0, 3)) == 0:
            allowed[name] = tuple(sorted(draw(st.sets(st.sampled_from(DEVICES), min_size=1, max_size=2))))
    kernels = [
        Kernel(
            name,
            output_bytes=draw(st.integers(0, 2)),
            weights=used[name],
            allowed_devices=allowed.get(name),
            colocate="g" if name in colocated else None,
        )
        for name in names
    ]
    graph = OpGraph(kernels, edges, inputs=[GraphInput("x", draw(st.integers(0, 4)), (names[0],))], weights=weights)
    memory = draw(st.sampled_from([None, None, 6.0, 9.0, 14.0]))
    devices = [
        Device(
            name,
            {"kind": "llvm"} if i == 0 else {"kind": "cuda"},
            "cpu:0" if i == 0 else f"cuda:{i - 1}",
            memory_bytes=None if i == 0 and draw(st.booleans()) else memory,
        )
        for i, name in enumerate(DEVICES)
    ]
    links = {
        (a, b): Link(a, b, draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])), draw(st.sampled_from([0.5, 1.0, 4.0])))
        for a in DEVICES
        for b in DEVICES
        if a != b
    }
    platform = Platform("constrained", devices, links)
    times = {}
    for name in names:
        row = {d: float(draw(st.integers(1, 9))) for d in DEVICES}
        for device in draw(st.sets(st.sampled_from(DEVICES), max_size=2)):
            row[device] = math.inf  # no kernel for this device
        times[name] = row
    return graph, platform, table(platform, times)
