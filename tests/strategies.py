"""Hypothesis strategies: random kernel DAGs with costs on the three-device unit platform."""
from hypothesis import strategies as st

from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph

from .conftest import table, unit_platform

DEVICES = ("A", "B", "C")


@st.composite
def dag_problems(draw, max_kernels=8, transfer_model="direct"):
    """(graph, platform, costs): kernels k0..k{n-1}, edges only from lower to higher index."""
    n = draw(st.integers(1, max_kernels))
    names = [f"k{i}" for i in range(n)]
    edges = [Edge(names[i], names[j], draw(st.integers(0, 5)))
             for j in range(n) for i in range(j) if draw(st.booleans())]
    kernels = [Kernel(name, output_bytes=draw(st.integers(0, 3))) for name in names]
    inputs = [GraphInput("x", draw(st.integers(0, 4)), (names[0],))]
    graph = OpGraph(kernels, edges, inputs=inputs)
    latency = draw(st.sampled_from([0.0, 0.5, 1.0]))
    platform = unit_platform(DEVICES, latency=latency, bandwidth=draw(st.sampled_from([1.0, 2.0])),
                             transfer_model=transfer_model)
    times = {name: {d: float(draw(st.integers(1, 9))) for d in DEVICES} for name in names}
    return graph, platform, table(platform, times)


def assignments(graph):
    return st.fixed_dictionaries({k: st.sampled_from(DEVICES) for k in graph.kernels})
