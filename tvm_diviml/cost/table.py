"""A cost model read from a table: ``{kernel: {device: seconds}}`` (JSON ``diviml.costs/1``).

``null`` (or a missing device for a kernel restricted by ``allowed_devices``) means the device
cannot run the kernel. Optional ``links`` replace the platform's link figures. Costs measured here
are such a table too (``from_provenance``), with the record of how they were made beside it.
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
from typing import Any

from .. import __version__
from ..errors import DivimlInputError
from ..graph import OpGraph
from ..jsonio import MAX_SECONDS, JsonFile, long_integers_as_floats, require_number
from ..platform import Link, Platform, link_from_json
from .base import CostModel, ExecutorOverheads
from .provenance import InContext, Provenance
from .roofline import RooflineCostModel

FORMAT = "diviml.costs/1"

log = logging.getLogger(__name__)


class TableCostModel(CostModel, JsonFile):
    def __init__(
        self,
        platform: Platform,
        compute: dict[str, dict[str, float | None]],
        links: dict[tuple[str, str], Link] | None = None,
        sources: dict[str, str] | None = None,
        *,
        executor_segments: bool = False,
        prediction_error: float = 0.0,
        executor_overheads: ExecutorOverheads | None = None,
        fingerprints: dict[str, str] | None = None,
        made_for: dict | None = None,
        provenance: Provenance | None = None,
    ):
        """``fingerprints``: kernel -> ``Kernel.fingerprint`` of the kernels the costs were measured for;
        ``made_for``: the model, each device's target and the versions that measured them;
        ``provenance``: how they were measured here (not written to the file)."""
        super().__init__(platform)
        self.provenance = provenance
        self.fingerprints, self.made_for = dict(fingerprints or {}), dict(made_for or {})
        self.executor_segments, self.prediction_error = executor_segments, prediction_error
        self.executor_overheads = executor_overheads or ExecutorOverheads()
        self.compute = {
            k: {d: (math.inf if s is None else float(s)) for d, s in row.items()} for k, row in compute.items()
        }
        self.links = dict(links or {})
        self.sources = dict(sources or {})

    @classmethod
    def from_provenance(cls, graph: OpGraph, platform: Platform, provenance: Provenance) -> TableCostModel:
        """The costs of ``graph`` measured here: a timed device's kernels at their time alone as running
        inside the model prices it (``InContext``; uncalibrated, the device's launch overhead added),
        an absent device's by the roofline estimate, the timed links and the executor's overheads.
        The table says what it was measured for (each kernel's fingerprint, the model, each device's
        target, the versions), so that it never prices another model's kernels of the same names."""
        estimate = RooflineCostModel(graph, platform)

        def priced(kernel: str, device: str) -> float:
            allowed = graph.kernels[kernel].allowed_devices
            if allowed is not None and device not in allowed:
                return math.inf
            timings = provenance.timed.get(device)
            if timings is None:
                return estimate.compute_s(kernel, device)
            uncalibrated = InContext(platform.device(device).launch_overhead_s)
            return provenance.in_context.get(device, uncalibrated).price(timings.seconds[kernel])

        return cls(
            platform,
            {k: {d: priced(k, d) for d in platform.device_names} for k in graph.kernels},
            dict(provenance.links),
            {d: provenance.timed[d].source if d in provenance.timed else "estimated" for d in platform.device_names},
            executor_segments=True,  # measured here: the simulator prices plans as the executor runs them
            prediction_error=provenance.prediction_error,
            executor_overheads=provenance.executor_overheads,
            fingerprints={name: kernel.fingerprint for name, kernel in graph.kernels.items()},
            made_for={
                "model": graph.name,
                "targets": {d.name: d.target for d in platform.devices},
                "versions": {"tvm": tvm_version(), "tvm_diviml": __version__},
            },
            provenance=provenance,
        )

    def compute_s(self, kernel: str, device: str) -> float:
        return self.compute[kernel].get(device, math.inf)

    def transfer_s(self, nbytes: float, src: str, dst: str) -> float:
        if src == dst:
            return 0.0
        link = self.links.get((src, dst))
        return link.transfer_s(nbytes) if link else self.platform.transfer_s(nbytes, src, dst)

    def source(self, kernel: str, device: str) -> str:
        return self.sources.get(device, "table")

    def fingerprint_of(self, kernel: str) -> str | None:
        return self.fingerprints.get(kernel)

    def made_for_model(self) -> str | None:
        return self.made_for.get("model")

    def check_covers(self, graph: OpGraph, where: str = "costs") -> None:
        """The costs were made for this graph (where they say what for); every kernel has a cost on every
        device it may run on; no unknown device; no negative."""
        self.check_made_for(graph, where)
        devices = set(self.platform.device_names)
        for name, kernel in graph.kernels.items():
            row = self.compute.get(name)
            if row is None:
                raise DivimlInputError(
                    f"missing cost for kernel '{name}'",
                    source=where,
                    field=f"kernels.{name}",
                    hint="give seconds for every kernel of the graph on every device",
                )
            for device, seconds in row.items():
                if device not in devices:
                    raise DivimlInputError(
                        f"unknown device '{device}' for kernel '{name}'",
                        source=where,
                        field=f"kernels.{name}.{device}",
                        hint=f"platform '{self.platform.name}' has: {', '.join(sorted(devices))}",
                    )
                if seconds < 0 or math.isnan(seconds):
                    raise DivimlInputError(
                        f"negative or NaN time {seconds}",
                        source=where,
                        field=f"kernels.{name}.{device}",
                        hint="times are seconds >= 0",
                    )
            allowed = kernel.allowed_devices if kernel.allowed_devices is not None else self.platform.device_names
            missing = [d for d in allowed if d in devices and d not in row]
            if missing:
                raise DivimlInputError(
                    f"missing cost for kernel '{name}' on device '{missing[0]}'",
                    source=where,
                    field=f"kernels.{name}",
                    hint="add it, or null if that device cannot run the kernel",
                )

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "unit": "s",
            "platform": self.platform.name,
            "kernels": {
                k: {d: (None if math.isinf(s) else s) for d, s in row.items()} for k, row in self.compute.items()
            },
            "links": [
                {"src": link.src, "dst": link.dst, "latency_s": link.latency_s, "bandwidth_Bps": link.bandwidth_Bps}
                for link in self.links.values()
            ],
            "sources": self.sources,
            "executor": {
                "segments": self.executor_segments,
                "prediction_error": self.prediction_error,
                "run_s": self.executor_overheads.run_s,
                "segment_s": self.executor_overheads.segment_s,
                "stream_segment_s": self.executor_overheads.stream_segment_s,
                "corun_factor": self.executor_overheads.corun_factor,
            },
            **({"fingerprints": self.fingerprints} if self.fingerprints else {}),
            **({"made_for": self.made_for} if self.made_for else {}),
        }

    @classmethod
    def from_json(cls, data: Any, platform: Platform) -> TableCostModel:
        data = long_integers_as_floats(data)
        if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict):
            raise DivimlInputError(
                "not a cost table: expected an object with 'kernels': {kernel: {device: s}}", field="kernels"
            )
        compute: dict[str, dict[str, float | None]] = {}
        for kernel, row in data["kernels"].items():
            if not isinstance(row, dict):
                raise DivimlInputError("must be an object {device: seconds}", field=f"kernels.{kernel}")
            for device, seconds in row.items():
                if seconds is not None:
                    require_number(
                        seconds,
                        f"kernels.{kernel}.{device}",
                        minimum=0.0,
                        maximum=MAX_SECONDS,
                        hint="seconds >= 0, or null where the device cannot run the kernel",
                    )
            compute[str(kernel)] = row
        links = {}
        if not isinstance(data.get("links", []), list):
            raise DivimlInputError(f"must be a list of links, got {data.get('links')!r}", field="links")
        for i, raw in enumerate(data.get("links", [])):
            link = link_from_json(raw, f"links[{i}]")
            for end in (link.src, link.dst):
                if end not in platform.by_name:
                    raise DivimlInputError(
                        f"unknown device '{end}'",
                        field=f"links[{i}]",
                        hint=f"platform '{platform.name}' has: {', '.join(platform.device_names)}",
                    )
            links[(link.src, link.dst)] = link
        sources = data.get("sources") or {}
        if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
            raise DivimlInputError(
                f"must be an object {{device: source}}, got {sources!r}",
                field="sources",
                hint='e.g. {"cpu0": "measured"}, or leave it out',
            )
        executor = data.get("executor", {})
        overheads = _overheads_from_json(executor)
        return cls(
            platform,
            compute,
            links,
            sources,
            executor_segments=executor.get("segments", False),
            prediction_error=float(executor.get("prediction_error", 0.0)),
            executor_overheads=overheads,
            fingerprints=_fingerprints_from_json(data.get("fingerprints", {})),
            made_for=_made_for_from_json(data.get("made_for", {}), platform),
        )

    @classmethod
    def load(cls, path: str, platform: Platform, graph: OpGraph | None = None) -> TableCostModel:
        model = super().load(path, platform)
        if graph is not None:
            model.check_covers(graph, where=path)
        return model


def _overheads_from_json(executor: Any) -> ExecutorOverheads:
    """The executor's overheads a table states, checked (the whole ``executor`` object: its segments flag
    and prediction error too)."""
    if (
        not isinstance(executor, dict)
        or not isinstance(executor.get("segments", False), bool)
        or not all(
            _is_fraction(executor.get(name, 0.0))
            for name in ("prediction_error", "run_s", "segment_s", "stream_segment_s")
        )
        or not (_is_fraction(executor.get("corun_factor", 1.0)) and executor.get("corun_factor", 1.0) >= 1)
    ):
        raise DivimlInputError(
            'must be {"segments": true|false, "prediction_error": a fraction >= 0, '
            '"run_s", "segment_s" and "stream_segment_s": seconds >= 0, "corun_factor": >= 1}',
            field="executor",
            hint="as `diviml profile --export` writes it",
        )
    return ExecutorOverheads(
        run_s=float(executor.get("run_s", 0.0)),
        segment_s=float(executor.get("segment_s", 0.0)),
        stream_segment_s=float(executor.get("stream_segment_s", 0.0)),
        corun_factor=float(executor.get("corun_factor", 1.0)),
    )


def _is_fraction(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _fingerprints_from_json(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise DivimlInputError(
            "must be an object {kernel: fingerprint}",
            field="fingerprints",
            hint="as `diviml profile --export` writes it",
        )
    return {str(k): v for k, v in raw.items()}


def _made_for_from_json(raw: Any, platform: Platform) -> dict:
    """What the costs were measured for; a device whose target differs from the platform's is refused
    (its kernels were timed as another target builds them)."""
    targets = raw.get("targets", {}) if isinstance(raw, dict) else None
    if not isinstance(targets, dict):
        raise DivimlInputError(
            'must be {"model": ..., "targets": {device: target}, "versions": {...}}',
            field="made_for",
            hint="as `diviml profile --export` writes it",
        )
    for device, target in targets.items():
        if device in platform.by_name and platform.device(device).target != target:
            raise DivimlInputError(
                f"device '{device}' was measured as target {target!r}; platform '{platform.name}' builds it as "
                f"{platform.device(device).target!r}",
                field=f"made_for.targets.{device}",
                hint="measure on this platform (diviml profile MODEL --platform P --export PATH)",
            )
    versions = raw.get("versions", {})
    theirs, ours = (versions.get("tvm") if isinstance(versions, dict) else None), tvm_version()
    if theirs and ours and theirs != ours:
        log.warning("costs measured with TVM %s, used with TVM %s: kernel times may differ", theirs, ours)
    return dict(raw)


def tvm_version() -> str | None:
    """The installed TVM's version, read without importing TVM (this module plans without it)."""
    try:
        return importlib.metadata.version("apache-tvm")
    except importlib.metadata.PackageNotFoundError:
        return None
