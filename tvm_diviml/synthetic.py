"""Seeded random kernel DAGs with plausible sizes, for tests, benchmarks and the demo (TVM-free).

Kernels get FLOPs and bytes drawn log-uniformly around a conv layer's, so that the roofline
prices some as compute-bound and some as memory-bound; every choice comes from ``seed``.
"""

from __future__ import annotations

import random

from .graph import Edge, GraphInput, Kernel, OpGraph

# random_dag draws a number for every earlier kernel (so that published graphs stay the same): its
# time grows with the square of the count, 9 s at 20,000 kernels, minutes at 100,000.
MAX_RANDOM_KERNELS = 100_000
MAX_BRANCHY_KERNELS = 1_000_000  # about 1 KiB of Python objects each


def random_dag(
    kernels: int = 16,
    seed: int = 0,
    *,
    edge_probability: float = 0.25,
    max_fan_in: int = 3,
    input_bytes: float = 602_112.0,
) -> OpGraph:
    """A layered-by-index DAG: each kernel reads 1..max_fan_in of the earlier ones (the first reads
    the model input), so it is connected, with one input and the sinks as outputs."""
    if kernels < 1:
        raise ValueError("kernels must be at least 1")
    if kernels > MAX_RANDOM_KERNELS:
        raise ValueError(
            f"kernels={kernels} is past the {MAX_RANDOM_KERNELS:,} this generator makes (its time grows with "
            "the square of the count); for a larger graph, write an OpGraph .json"
        )
    rng = random.Random(seed)
    nodes, edges, weights = [], [], {}
    for index in range(kernels):
        name = f"k{index}"
        flops = 10 ** rng.uniform(6.5, 9.5)
        out_bytes = 10 ** rng.uniform(4.5, 6.5)
        weight = 10 ** rng.uniform(3.5, 6.5)
        weights[f"w{index}"] = weight
        nodes.append(
            Kernel(
                name, flops=flops, bytes_moved=out_bytes * 2 + weight, output_bytes=out_bytes, weights=(f"w{index}",)
            )
        )
        if index == 0:
            continue
        earlier = [j for j in range(index) if rng.random() < edge_probability]
        if not earlier:
            earlier = [rng.randrange(max(0, index - 3), index)]
        for j in sorted(rng.sample(earlier, min(len(earlier), max_fan_in))):
            edges.append(Edge(f"k{j}", name, nodes[j].output_bytes))
    return OpGraph(
        nodes,
        edges,
        inputs=[GraphInput("input", input_bytes, ("k0",))],
        weights=weights,
        name=f"random:kernels={kernels},seed={seed}",
    )


def branchy(branches: int = 4, depth: int = 3, *, flops: float = 2e9, tensor_bytes: float = 800_000.0) -> OpGraph:
    """A stem, ``branches`` parallel chains of ``depth`` kernels each, and a concatenation: the shape
    (an Inception block) where running branches on different devices pays."""
    if branches * depth > MAX_BRANCHY_KERNELS:
        raise ValueError(f"branches x depth = {branches * depth} is past the {MAX_BRANCHY_KERNELS:,} kernels it makes")
    nodes = [Kernel("stem", flops=flops / 4, bytes_moved=3 * tensor_bytes, output_bytes=tensor_bytes)]
    edges = []
    for b in range(branches):
        previous = "stem"
        for d in range(depth):
            name = f"b{b}_{d}"
            scale = 1.0 + 0.5 * ((b + d) % 3)
            nodes.append(Kernel(name, flops=flops * scale, bytes_moved=2 * tensor_bytes, output_bytes=tensor_bytes))
            edges.append(Edge(previous, name, tensor_bytes))
            previous = name
        edges.append(Edge(previous, "concat", tensor_bytes))
    nodes.append(
        Kernel("concat", flops=0.0, bytes_moved=(branches + 1) * tensor_bytes, output_bytes=branches * tensor_bytes)
    )
    return OpGraph(
        nodes,
        edges,
        inputs=[GraphInput("input", tensor_bytes, ("stem",))],
        name=f"branchy:branches={branches},depth={depth}",
    )
