"""Each same-device segment of a plan as its own Relax function, for the concurrent executor.

A segment function receives the tensors it reads from other segments (and model inputs) already on its
device — the executor moves them with TVM — takes its device's copies of the weights it reads, and
returns what later segments read and the model outputs it makes. Tensors are named by string keys
(``tensor_key``) so that the executor, which knows nothing of Relax, can route them.
"""

from __future__ import annotations

from tvm import relax

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.segments import Segment

from .emit import FunctionEmitter, Param, TargetFunc, base_ref
from .extract import Extraction, Ref


def tensor_key(ref: Ref) -> str:
    """``kind:name`` or ``kind:name:index``: how the executor names a tensor."""
    return f"{ref.kind}:{ref.name}" if ref.index is None else f"{ref.kind}:{ref.name}:{ref.index}"


def emit_segments(
    builder: relax.BlockBuilder,
    emitter: FunctionEmitter,
    extraction: Extraction,
    segments: list[Segment],
    target_funcs: dict[tuple[str, str], TargetFunc],
    devices: set[str] | None = None,
) -> list[dict]:
    """Add one function per segment to ``builder``; returns each segment's calling convention
    (name, device, reads, writes, weights) for the Placement. ``devices``: emit only the segments
    on these (one server's); what they read and write still follows from all ``segments``."""
    segment_of = {kernel: seg.name for seg in segments for kernel in seg.kernels}
    reads: dict[str, list[Ref]] = {seg.name: [] for seg in segments}
    for seg in segments:
        for kernel in seg.kernels:
            for ref in extraction.kernel_args[kernel]:
                base = base_ref(extraction, ref)
                outside = base.kind == "input" or (base.kind == "kernel" and segment_of[base.name] != seg.name)
                if outside and base not in reads[seg.name]:
                    reads[seg.name].append(base)
    writes: dict[str, list[Ref]] = {seg.name: [] for seg in segments}
    for seg_reads in reads.values():
        for ref in seg_reads:
            if ref.kind == "kernel" and ref not in writes[segment_of[ref.name]]:
                writes[segment_of[ref.name]].append(ref)
    for ref in extraction.outputs:
        base = base_ref(extraction, ref)
        if ref.kind == "input":
            continue  # a model input returned as it is: the executor passes it on
        if base.kind != "kernel":
            raise DivimlInputError(
                f"model output {tensor_key(ref)} is not computed by any kernel (a weight, a "
                "constant or a reshaped input); the concurrent build cannot return it",
                field="MODEL",
                hint="return it from the model's caller instead",
            )
        if ref not in writes[segment_of[base.name]]:
            writes[segment_of[base.name]].append(ref)
    conventions = []
    for seg in segments:
        if devices is not None and seg.device not in devices:
            continue
        weights = emitter.emit(
            builder,
            seg.name,
            list(seg.kernels),
            [Param(r, seg.device) for r in reads[seg.name]],
            [Param(r, seg.device) for r in writes[seg.name]],
            target_funcs,
        )
        conventions.append(
            {
                "name": seg.name,
                "device": seg.device,
                "kernels": list(seg.kernels),
                "reads": [tensor_key(r) for r in reads[seg.name]],
                "writes": [tensor_key(r) for r in writes[seg.name]],
                "weights": [[p.ref.kind, p.ref.name, p.device] for p in weights],
            }
        )
    return conventions
