"""Reader for the msr-fiddle graph format (Tarnawski et al., NeurIPS 2020,
``msr-fiddle/dnn-partitioning``).

Their model, kept exactly: ``maxFPGAs`` identical accelerators with ``maxSizePerFPGA`` bytes each
and ``maxCPUs`` CPU cores; a node runs in ``cpuLatency`` on a core or ``fpgaLatency`` on an
accelerator (only if ``supportedOnFpga``) and needs ``size`` bytes of accelerator memory; nodes of
one ``colorClass`` share a device; an edge's ``cost`` is the time to move the source's output
between an accelerator and CPU memory. Every copy goes through host memory, so the platform's
transfer model is ``host_staged``. Also reads their human experts' splits, scored by the same
simulator.

How times, bytes, sizes and a missing CPU translate into a Platform and an OpGraph (so that every
``cost`` is reproduced exactly): docs/design.md#host_staged.
"""

from __future__ import annotations

from typing import Any

from .cost.table import TableCostModel
from .errors import DivimlInputError
from .graph import Edge, Kernel, OpGraph
from .jsonio import require_number
from .plan import Plan
from .platform import Device, Link, Platform

MILLISECOND = 1e-3
HOST_BANDWIDTH_BPS = 2**31  # bytes/s: 2147483.648 bytes per ms, their size/cost ratio
_NODE_KEYS = ("id", "cpuLatency", "fpgaLatency", "supportedOnFpga")
_EDGE_KEYS = ("sourceId", "destId", "cost")


def is_msr_fiddle(data: Any) -> bool:
    """Its keys: 'nodes' and 'edges' (an OpGraph has 'kernels'); a missing count is then named by the reader."""
    return isinstance(data, dict) and "nodes" in data and "edges" in data and "kernels" not in data


def read_msr_fiddle(data: Any, name: str = "msr-fiddle") -> tuple[OpGraph, Platform, TableCostModel]:
    """OpGraph, Platform and TableCostModel for one msr-fiddle input file's parsed JSON."""
    for key in ("maxFPGAs", "maxCPUs", "maxSizePerFPGA"):
        if key not in data:
            raise DivimlInputError(
                f"missing '{key}'", field=key, hint="an msr-fiddle file gives maxFPGAs, maxCPUs and maxSizePerFPGA"
            )
        value = require_number(data[key], key, minimum=0.0, hint="a non-negative count or size")
        if key != "maxSizePerFPGA" and value != int(value):
            raise DivimlInputError(f"must be a whole number of devices, got {value!r}", field=key)
    accelerators, cpus = int(data["maxFPGAs"]), int(data["maxCPUs"])
    if accelerators + cpus == 0:
        raise DivimlInputError(
            "the file allows no device (maxFPGAs = maxCPUs = 0)",
            field="maxFPGAs",
            hint="at least one CPU or accelerator is needed",
        )
    platform = _platform(name, accelerators, cpus, float(data["maxSizePerFPGA"]))
    cpu_names = [f"cpu{i}" for i in range(cpus)]
    acc_names = [d.name for d in platform.devices if d.kind != "cpu"]

    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        raise DivimlInputError("must be a list of nodes" if "nodes" in data else "missing", field="nodes")
    kernels, weights, compute = [], {}, {}
    for index, raw in enumerate(nodes):
        where = f"nodes[{index}]"
        if not isinstance(raw, dict):
            raise DivimlInputError("must be an object", field=where)
        for key in _NODE_KEYS:
            if key not in raw:
                raise DivimlInputError(
                    f"missing '{key}'", field=where, hint=f"every node needs {', '.join(_NODE_KEYS)}"
                )
        kid = str(raw["id"])
        cpu_s = _time(raw["cpuLatency"], f"{where}.cpuLatency")
        acc_s = _time(raw["fpgaLatency"], f"{where}.fpgaLatency")
        size = _time(raw.get("size", 0.0), f"{where}.size")
        supported = bool(raw["supportedOnFpga"])
        weights[kid] = size
        allowed = tuple(cpu_names) if not supported else None if cpus else tuple(acc_names)
        color = raw.get("colorClass")
        kernels.append(
            Kernel(
                kid,
                weights=(kid,),
                allowed_devices=allowed,
                colocate=None if color is None else str(color),
                attrs={"name": raw.get("name", kid), "backward": bool(raw.get("isBackwardNode", False))},
            )
        )
        row: dict[str, float | None] = {d: cpu_s * MILLISECOND for d in cpu_names}
        row.update({d: (acc_s * MILLISECOND if supported else None) for d in acc_names})
        compute[kid] = row
    edges = []
    raw_edges = data.get("edges")
    if not isinstance(raw_edges, list):
        raise DivimlInputError("must be a list of edges" if "edges" in data else "missing", field="edges")
    for index, raw in enumerate(raw_edges):
        where = f"edges[{index}]"
        if not isinstance(raw, dict) or any(k not in raw for k in _EDGE_KEYS):
            raise DivimlInputError(f"needs {', '.join(_EDGE_KEYS)}", field=where)
        cost = _time(raw["cost"], f"{where}.cost")
        edges.append(Edge(str(raw["sourceId"]), str(raw["destId"]), cost * MILLISECOND * HOST_BANDWIDTH_BPS))
    graph = OpGraph(
        kernels,
        edges,
        weights=weights,
        name=name,
        outputs=[],
        attrs={"format": "msr-fiddle", "time_unit_in_file": "ms"},
    )
    costs = TableCostModel(platform, compute, sources={d: "profiled (msr-fiddle)" for d in platform.device_names})
    return graph, platform, costs


def _platform(name: str, accelerators: int, cpus: int, memory: float) -> Platform:
    devices = [Device(f"cpu{i}", {"kind": "llvm"}, f"cpu:{i}", num_threads=1) for i in range(cpus)]
    if not cpus:  # host memory only: it runs no node
        devices.append(Device("host", {"kind": "llvm"}, "cpu:0", num_threads=1))
    devices += [
        Device(f"acc{i}", {"kind": "cuda"}, f"cuda:{i}", memory_bytes=memory or None) for i in range(accelerators)
    ]
    links = {}
    for a in devices:
        for b in devices:
            if a.name == b.name:
                continue
            if a.kind == b.kind == "cpu":
                links[(a.name, b.name)] = Link(a.name, b.name, 0.0, None)
            elif a.kind == "cpu" or b.kind == "cpu":
                links[(a.name, b.name)] = Link(a.name, b.name, 0.0, float(HOST_BANDWIDTH_BPS))
            else:  # through host memory: two hops
                links[(a.name, b.name)] = Link(a.name, b.name, 0.0, HOST_BANDWIDTH_BPS / 2)
    return Platform(
        f"msr-fiddle:{name}",
        devices,
        links,
        host=devices[0].name,
        transfer_model="host_staged",
        description=f"{accelerators} identical accelerators and {cpus} CPU cores, copies through host memory"
        + ("" if cpus else " (device 'host' stands for that memory and runs no node)"),
    )


def _time(value: Any, where: str) -> float:
    return require_number(value, where, minimum=0.0, hint="times and sizes are non-negative finite numbers")


def read_expert_split(data: Any, graph: OpGraph, platform: Platform) -> Plan:
    """The hand-made split of an msr-fiddle ``human-experts`` file as a ``host_staged`` throughput Plan.

    Format: ``{"cpus": [{"load", "nodes"}], "fpgas": [{"load", "nodes"}]}``; ``cpus[i]`` runs on
    ``cpu{i}`` and ``fpgas[i]`` on ``acc{i}``; their ``load`` fields (-1 where unknown) are ignored:
    the simulator scores the plan. Every node of ``graph`` must be placed exactly once.
    """
    if not isinstance(data, dict):
        raise DivimlInputError("not an expert split: expected an object with 'cpus' and 'fpgas'", field="fpgas")
    assignment: dict[str, str] = {}
    for key, prefix in (("cpus", "cpu"), ("fpgas", "acc")):
        groups = data.get(key, [])
        if not isinstance(groups, list):
            raise DivimlInputError('must be a list of {"load", "nodes"}', field=key)
        for index, group in enumerate(groups):
            where = f"{key}[{index}]"
            nodes = group.get("nodes") if isinstance(group, dict) else None
            if not isinstance(nodes, list):
                raise DivimlInputError("needs a 'nodes' list", field=where)
            device = f"{prefix}{index}"
            if nodes and device not in platform.by_name:
                raise DivimlInputError(
                    f"places nodes on '{device}', which platform '{platform.name}' lacks",
                    field=where,
                    hint=f"the graph's file allows: {', '.join(platform.device_names)}",
                )
            for node in nodes:
                kernel = str(node)
                if kernel not in graph.kernels:
                    raise DivimlInputError(
                        f"names node {node!r}, which graph '{graph.name}' does not have",
                        field=where,
                        hint="the split belongs to another graph file",
                    )
                if kernel in assignment:
                    raise DivimlInputError(
                        f"places node {node!r} again (already on '{assignment[kernel]}')",
                        field=where,
                        hint="every node goes to exactly one device",
                    )
                assignment[kernel] = device
    missing = [k for k in graph.topo_order if k not in assignment]
    if missing:
        raise DivimlInputError(
            f"leaves node {missing[0]!r} unplaced ({len(missing)} nodes in all)",
            field="fpgas",
            hint="every node of the graph goes to exactly one device",
        )
    return Plan(
        {k: assignment[k] for k in graph.kernels}, objective="throughput", mode="host_staged", solver="human-expert"
    )
