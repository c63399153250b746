"""The CostModel interface that solvers and the simulator consume (TVM-free)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..errors import DivimlInputError
from ..graph import Kernel, OpGraph
from ..platform import Platform


@dataclass(frozen=True)
class ExecutorOverheads:
    """Seconds the concurrent executor pays beyond kernels and copies (``runtime.measure.executor_overheads``):
    once per inference (waking the first worker, collecting the outputs), per segment call, and per
    tensor read on another device's worker (waking that worker; measured links include it in their
    latency); ``stream_segment_s``, what a segment call costs in a stream, where more (timed on the
    model, ``passes.timing.executor_in_context``: the worker's and the driver's work on the next
    input beside it); and ``corun_factor``, how many times as long a CPU kernel takes while another CPU
    device's worker of the same machine computes (1: not at all; ``runtime.measure.corun_factor``)."""

    run_s: float = 0.0
    segment_s: float = 0.0
    handoff_s: float = 0.0
    corun_factor: float = 1.0
    stream_segment_s: float = 0.0

    @property
    def streamed_segment_s(self) -> float:
        """A segment call's cost in a stream: the larger of the two figures."""
        return max(self.segment_s, self.stream_segment_s)


class CostModel(ABC):
    """Seconds for a kernel on a device, and for a tensor on a link.

    ``compute_s`` returns ``math.inf`` where a device cannot run a kernel. Transfers default to the
    platform's links (latency + bytes / bandwidth); a model with measured links overrides
    ``transfer_s``.
    """

    # True when the costs describe builds run by this project's executor (measured here): the
    # simulator then prices a latency plan as the executor runs it, segment by segment.
    executor_segments = False
    # How far a prediction may stray from a measurement (relative), where the costs were measured:
    # ``--solver auto`` splits a model only when the split is predicted faster by more than this.
    prediction_error = 0.0
    # What the executor adds per inference and per segment call (charged with ``executor_segments``).
    executor_overheads = ExecutorOverheads()
    # How the figures were made, where they were measured here (``provenance.Provenance``): None otherwise.
    provenance = None

    def __init__(self, platform: Platform):
        self.platform = platform

    @abstractmethod
    def compute_s(self, kernel: str, device: str) -> float:
        """Seconds to run ``kernel`` on ``device`` (inf when it cannot run there)."""

    def transfer_s(self, nbytes: float, src: str, dst: str) -> float:
        """Seconds to send a tensor of ``nbytes`` from ``src`` to ``dst`` (zero on one device)."""
        return self.platform.transfer_s(nbytes, src, dst)

    def source(self, kernel: str, device: str) -> str:
        """Where a kernel cost came from: ``table``, ``measured``, ``tuned`` or ``estimated``."""
        return "table"

    def fingerprint_of(self, kernel: str) -> str | None:
        """The fingerprint (``Kernel.fingerprint``) of the kernel of this name that these costs were made
        for; None where they do not say. A model built from a graph says: its graph's kernel."""
        graph = getattr(self, "graph", None)
        made_for = graph.kernels.get(kernel) if graph is not None else None
        return made_for.fingerprint if made_for is not None else None

    def made_for_model(self) -> str | None:
        """The model these costs were measured for, where they say (a cost table exported by ``profile``)."""
        return None

    def check_made_for(self, graph: OpGraph, source: str | None = None) -> None:
        """Refuse costs made for another graph, naming the first kernel that differs from the one they
        describe (``twin_branch:hidden=64``'s costs would price ``hidden=2048``'s kernels of the same names)."""
        if getattr(self, "graph", None) is graph:
            return
        for name, kernel in graph.kernels.items():
            theirs = self.fingerprint_of(name)
            if theirs is not None and theirs != kernel.fingerprint:
                model = self.made_for_model()
                raise DivimlInputError(
                    f"the costs were made for another model: kernel '{name}' differs from the one they describe "
                    f"({_kernel_summary(kernel)} here)" + (f"; they were measured for {model}" if model else ""),
                    source=source,
                    field=f"fingerprints.{name}",
                    hint="measure this model's costs (diviml profile MODEL --export PATH), or give the model they "
                    "were made for",
                )

    @staticmethod
    def runs(seconds: float) -> bool:
        return not math.isinf(seconds)


def _kernel_summary(kernel: Kernel) -> str:
    """FLOPs and output shapes, as a user can compare them with the model they meant."""
    outputs = kernel.attrs.get("outputs") or []
    shapes = ", ".join("x".join(map(str, o.get("shape", []))) + f" {o.get('dtype', '')}" for o in outputs)
    return f"{kernel.flops:.4g} FLOPs, " + (f"output {shapes}" if shapes else f"{kernel.output_bytes:.4g} output bytes")
