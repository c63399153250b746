"""Hypothesis strategies: random kernel DAGs with costs on the three-device unit platform, plain or
with memory, co-location, allowed devices, infinite costs and direction-dependent links; pipeline
problems drawn from them."""

import dataclasses
import math

from hypothesis import strategies as st

from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph
from tvm_diviml.platform import Device, Link, Platform

from .helpers import pipeline, table, unit_platform

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


@st.composite
def pipeline_problems(draw, max_kernels=5, uneven_links=False):
    """A pipeline problem of 1..3 stages on the three-device unit platform; ``uneven_links``: one link
    (B -> C or C -> A) made cheaper than the rest, so that links no longer price alike."""
    graph, platform, costs = draw(dag_problems(max_kernels=max_kernels))
    if uneven_links:
        pair = draw(st.sampled_from([("B", "C"), ("C", "A")]))
        costs = TableCostModel(platform, costs.compute, links={pair: Link(*pair, 0.0, 10.0)})
    return pipeline(graph, platform, costs, draw(st.integers(1, 3)))


@st.composite
def constrained_pipeline_problems(draw):
    """Pipeline problems whose kernels may be barred from devices, tied into co-location groups and
    hold weights against small device memories. Activations peak below 20 bytes, so with 44 bytes a
    device holds either weight with them, never both weights (the MIP models weights only)."""
    problem = draw(pipeline_problems(max_kernels=5))
    graph = problem.graph
    kernels = [
        dataclasses.replace(
            k,
            allowed_devices=draw(st.sampled_from([None, ("A",), ("B", "C"), ("A", "C")])),
            colocate=draw(st.sampled_from([None, None, "g"])),
            weights=draw(st.sampled_from([(), ("w1",), ("w2",), ("w1", "w2")])),
        )
        for k in graph.kernels.values()
    ]
    graph = OpGraph(kernels, graph.edges, inputs=graph.inputs, weights={"w1": 20, "w2": 25})
    platform = unit_platform(DEVICES, memory=draw(st.sampled_from([None, 44, 100])))
    costs = TableCostModel(platform, problem.costs.compute)
    return pipeline(graph, platform, costs, problem.stages)
