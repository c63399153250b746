"""The ``extract`` suite: extraction time and graph size per zoo model at its default size."""

from __future__ import annotations

from collections.abc import Iterator

from ..app.load import load_model
from ..zoo import zoo_names
from .suite import Row


def suite_extract(models: list[str] | None = None) -> Iterator[Row]:
    """Extraction time and kernel count per zoo model at its default size."""
    for name in models or zoo_names():
        loaded = load_model(name, {})
        graph = loaded.extraction.graph
        yield {
            "suite": "extract",
            "model": name,
            "kernels": len(graph),
            "edges": len(graph.edges),
            "primfuncs": len({k.attrs["primfunc_hash"] for k in graph.kernels.values()}),
            "gflops": sum(k.flops for k in graph.kernels.values()) / 1e9,
            "weights_mb": sum(graph.weights.values()) / 1e6,
            "time_s": loaded.extract_s,
        }
