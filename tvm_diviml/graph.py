"""OpGraph: the DAG of fused kernels that every solver works on.

TVM-free on purpose: the Relax extractor (``tvm_diviml.passes``) and the file readers produce it,
the solvers and the simulator consume it. A node is one kernel; an edge carries the bytes of the
tensor that flows along it. A kernel's outputs are treated as one tensor: however many consumers it
has on a device, the tensor crosses to that device once (the bytes sent are the largest any of
those edges reads).
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from .errors import DivimlInputError
from .jsonio import JsonFile, long_integers_as_floats, require_number

FORMAT = "diviml.opgraph/1"


@dataclass(frozen=True)
class Kernel:
    """One fused kernel (a ``call_tir`` binding), with what the cost models and memory need."""

    name: str
    flops: float = 0.0
    bytes_moved: float = 0.0  # bytes read + written by the kernel
    output_bytes: float = 0.0  # bytes of its result, live until its last consumer runs
    weights: tuple[str, ...] = ()  # ids into OpGraph.weights
    allowed_devices: tuple[str, ...] | None = None  # None: any device of the platform
    colocate: str | None = None  # kernels with the same group must share a device
    attrs: dict[str, Any] = field(default_factory=dict, compare=False)

    @functools.cached_property
    def fingerprint(self) -> str:
        """What the kernel computes, as far as its costs go: its PrimFunc's hash (shapes included) where
        extraction gave one, its FLOPs and bytes. Names alone prove nothing: a model's kernels keep their
        names at every size, so costs or records made for one size must not price another."""
        what = [self.attrs.get("primfunc_hash"), self.flops, self.bytes_moved, self.output_bytes]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "name": self.name,
            "flops": self.flops,
            "bytes_moved": self.bytes_moved,
            "output_bytes": self.output_bytes,
        }
        if self.weights:
            out["weights"] = list(self.weights)
        if self.allowed_devices is not None:
            out["allowed_devices"] = list(self.allowed_devices)
        if self.colocate is not None:
            out["colocate"] = self.colocate
        if self.attrs:
            out["attrs"] = self.attrs
        return out


@dataclass(frozen=True)
class Edge:
    """A tensor made by ``src`` and read by ``dst``."""

    src: str
    dst: str
    bytes: float


@dataclass(frozen=True)
class GraphInput:
    """A model input: it starts on the platform's host device and is read by ``consumers``."""

    name: str
    bytes: float
    consumers: tuple[str, ...]


class OpGraph(JsonFile):
    """A validated DAG of kernels with explicit model inputs and outputs.

    ``outputs`` names the kernels whose results the model returns; it defaults to the sinks.
    ``weights`` maps a weight id to its bytes, so a weight shared by several kernels (a tied
    embedding) is counted once per device that uses it.
    """

    def __init__(
        self,
        kernels: Iterable[Kernel],
        edges: Iterable[Edge],
        *,
        inputs: Iterable[GraphInput] = (),
        outputs: Iterable[str] | None = None,
        weights: dict[str, float] | None = None,
        name: str = "graph",
        attrs: dict[str, Any] | None = None,
    ):
        self.name = name
        self.kernels: dict[str, Kernel] = {}
        for kernel in kernels:
            if kernel.name in self.kernels:
                raise DivimlInputError(
                    f"kernel '{kernel.name}' appears twice", field="kernels", hint="kernel names must be unique"
                )
            self.kernels[kernel.name] = kernel
        self.edges: list[Edge] = list(edges)
        self.inputs: list[GraphInput] = list(inputs)
        self.weights: dict[str, float] = dict(weights or {})
        self.attrs: dict[str, Any] = dict(attrs or {})
        self._validate_and_index()
        self.outputs: list[str] = list(outputs) if outputs is not None else self.sinks()
        self.output_set = frozenset(self.outputs)
        for out in self.outputs:
            if out not in self.kernels:
                raise DivimlInputError(
                    f"output '{out}' is not a kernel", field="outputs", hint="list kernel names only"
                )

    # ------------------------------------------------------------------ structure
    def _validate_and_index(self) -> None:
        self.succ: dict[str, list[Edge]] = {k: [] for k in self.kernels}
        self.pred: dict[str, list[Edge]] = {k: [] for k in self.kernels}
        seen_pairs = set()
        for edge in self.edges:
            for end in (edge.src, edge.dst):
                if end not in self.kernels:
                    raise DivimlInputError(
                        f"edge {edge.src} -> {edge.dst} names unknown kernel '{end}'",
                        field="edges",
                        hint="every edge endpoint must be a kernel name",
                    )
            if edge.src == edge.dst:
                raise DivimlInputError(
                    f"edge {edge.src} -> {edge.dst} is a self-loop",
                    field="edges",
                    hint="remove it; the graph must be acyclic",
                )
            _check_size(edge.bytes, f"edges[{edge.src}->{edge.dst}].bytes")
            if (edge.src, edge.dst) in seen_pairs:
                raise DivimlInputError(
                    f"edge {edge.src} -> {edge.dst} appears twice", field="edges", hint="merge the two into one edge"
                )
            seen_pairs.add((edge.src, edge.dst))
            self.succ[edge.src].append(edge)
            self.pred[edge.dst].append(edge)
        for kernel in self.kernels.values():
            for attr in ("flops", "bytes_moved", "output_bytes"):
                _check_size(getattr(kernel, attr), f"kernels[{kernel.name}].{attr}")
            for wid in kernel.weights:
                if wid not in self.weights:
                    raise DivimlInputError(
                        f"kernel '{kernel.name}' reads unknown weight '{wid}'",
                        field="weights",
                        hint="declare every weight id with its bytes",
                    )
        for wid, size in self.weights.items():
            _check_size(size, f"weights[{wid}]")
        for graph_input in self.inputs:
            if graph_input.name in self.kernels:
                raise DivimlInputError(
                    f"input '{graph_input.name}' has the name of a kernel",
                    field="inputs",
                    hint="give model inputs names of their own",
                )
            _check_size(graph_input.bytes, f"inputs[{graph_input.name}].bytes")
            for consumer in graph_input.consumers:
                if consumer not in self.kernels:
                    raise DivimlInputError(
                        f"input '{graph_input.name}' feeds unknown kernel '{consumer}'",
                        field="inputs",
                        hint="consumers must be kernel names",
                    )
        self.topo_order = self._topological_order()
        self.position = {name: i for i, name in enumerate(self.topo_order)}

    def _topological_order(self) -> list[str]:
        """Kahn's algorithm, ties broken by declaration order, so the order is deterministic."""
        indegree = {k: len(self.pred[k]) for k in self.kernels}
        declared = {k: i for i, k in enumerate(self.kernels)}
        ready = [(declared[k], k) for k, d in indegree.items() if d == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, name = heapq.heappop(ready)
            order.append(name)
            for edge in self.succ[name]:
                indegree[edge.dst] -= 1
                if indegree[edge.dst] == 0:
                    heapq.heappush(ready, (declared[edge.dst], edge.dst))
        if len(order) != len(self.kernels):
            stuck = [k for k, d in indegree.items() if d > 0]
            cycle = _find_cycle(self, stuck)
            raise DivimlInputError(
                f"the graph has a cycle: {' -> '.join(cycle)}",
                field="edges",
                hint="a kernel graph must be a DAG; remove one edge of the cycle",
            )
        return order

    def sources(self) -> list[str]:
        return [k for k in self.kernels if not self.pred[k]]

    def sinks(self) -> list[str]:
        return [k for k in self.kernels if not self.succ[k]]

    def __len__(self) -> int:
        return len(self.kernels)

    def to_networkx(self) -> nx.DiGraph:
        """A networkx view: node attributes are the Kernel fields, edge attribute ``bytes``."""
        graph = nx.DiGraph(name=self.name)
        for kernel in self.kernels.values():
            graph.add_node(kernel.name, kernel=kernel, flops=kernel.flops, output_bytes=kernel.output_bytes)
        for edge in self.edges:
            graph.add_edge(edge.src, edge.dst, bytes=edge.bytes)
        return graph

    def widest_antichain(self, exact_up_to: int = 1500) -> tuple[int, bool]:
        """The most kernels that no path orders (how many could run at once), and whether exact.

        Exact by Dilworth's theorem (kernels minus a maximum matching of the reachability
        relation) up to ``exact_up_to`` kernels; beyond, the widest level of a longest-path
        layering, a lower bound.
        """
        if len(self) > exact_up_to:
            depth: dict[str, int] = {}
            for kernel in self.topo_order:
                depth[kernel] = 1 + max((depth[e.src] for e in self.pred[kernel]), default=-1)
            return max(Counter(depth.values()).values()), False
        index = self.position
        reach = [0] * len(self)
        for kernel in reversed(self.topo_order):
            mask = 0
            for edge in self.succ[kernel]:
                mask |= (1 << index[edge.dst]) | reach[index[edge.dst]]
            reach[index[kernel]] = mask
        bipartite = nx.Graph()
        left = [("out", i) for i in range(len(self))]
        bipartite.add_nodes_from(left)
        bipartite.add_nodes_from(("in", i) for i in range(len(self)))
        for i, mask in enumerate(reach):
            j = 0
            while mask:
                if mask & 1:
                    bipartite.add_edge(("out", i), ("in", j))
                mask >>= 1
                j += 1
        matching = nx.bipartite.hopcroft_karp_matching(bipartite, top_nodes=left)
        return len(self) - len(matching) // 2, True

    def weight_bytes(self, kernels: Iterable[str]) -> float:
        """Bytes of the distinct weights read by ``kernels`` (a shared weight counts once)."""
        ids = {wid for k in kernels for wid in self.kernels[k].weights}
        return sum(self.weights[wid] for wid in ids)

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        out = {
            "format": FORMAT,
            "name": self.name,
            "kernels": [k.to_json() for k in self.kernels.values()],
            "edges": [{"src": e.src, "dst": e.dst, "bytes": e.bytes} for e in self.edges],
            "inputs": [{"name": i.name, "bytes": i.bytes, "consumers": list(i.consumers)} for i in self.inputs],
            "outputs": list(self.outputs),
            "weights": dict(self.weights),
        }
        if self.attrs:
            out["attrs"] = self.attrs
        return out

    @classmethod
    def from_json(cls, data: Any) -> OpGraph:
        data = long_integers_as_floats(data)
        if not isinstance(data, dict) or "kernels" not in data:
            raise DivimlInputError(
                "not an OpGraph: expected an object with 'kernels' and 'edges'",
                field="kernels",
                hint="write it with `diviml graph MODEL --json`",
            )
        kernels = [_kernel_from_json(k, i) for i, k in enumerate(_list_field(data, "kernels"))]
        by_name = {k.name: k for k in kernels}
        edges = []
        for i, raw in enumerate(_list_field(data, "edges")):
            src = _name(_required(raw, "src", f"edges[{i}]"), f"edges[{i}].src")
            dst = _name(_required(raw, "dst", f"edges[{i}]"), f"edges[{i}].dst")
            default = by_name[src].output_bytes if src in by_name else 0.0
            edges.append(Edge(src, dst, _number(raw.get("bytes", default), f"edges[{i}].bytes")))
        inputs = [
            GraphInput(
                _name(_required(raw, "name", f"inputs[{i}]"), f"inputs[{i}].name"),
                _number(raw.get("bytes", 0.0), f"inputs[{i}].bytes"),
                tuple(_names(raw.get("consumers", []), f"inputs[{i}].consumers")),
            )
            for i, raw in enumerate(_list_field(data, "inputs", required=False))
        ]
        weights = data.get("weights", {})
        if not isinstance(weights, dict):
            raise DivimlInputError("must be an object {weight id: bytes}", field="weights")
        weights = {str(w): _number(b, f"weights[{w}]") for w, b in weights.items()}
        outputs = data.get("outputs")
        return cls(
            kernels,
            edges,
            inputs=inputs,
            outputs=_names(outputs, "outputs") if outputs is not None else None,
            weights=weights,
            name=str(data.get("name", "graph")),
            attrs=_object(data["attrs"], "attrs") if data.get("attrs") is not None else None,
        )


# ---------------------------------------------------------------------- helpers
def _check_size(value: float, where: str) -> None:
    _number(value, where)


def _number(value: Any, where: str) -> float:
    return require_number(
        value, where, minimum=0.0, hint="sizes, FLOPs and times are non-negative finite numbers, at most 1e18"
    )


def _required(raw: Any, key: str, where: str) -> Any:
    if not isinstance(raw, dict) or key not in raw:
        raise DivimlInputError(f"missing '{key}'", field=where, hint=f"every entry needs '{key}'")
    return raw[key]


def _list_field(data: dict, key: str, required: bool = True) -> list:
    value = data.get(key, None if required else [])
    if not isinstance(value, list):
        raise DivimlInputError("must be a list" if value is not None else "missing", field=key)
    return value


def _kernel_from_json(raw: Any, index: int) -> Kernel:
    where = f"kernels[{index}]"
    name = _name(_required(raw, "name", where), f"{where}.name")
    allowed = raw.get("allowed_devices")
    return Kernel(
        name=name,
        flops=_number(raw.get("flops", 0.0), f"kernels[{name}].flops"),
        bytes_moved=_number(raw.get("bytes_moved", 0.0), f"kernels[{name}].bytes_moved"),
        output_bytes=_number(raw.get("output_bytes", 0.0), f"kernels[{name}].output_bytes"),
        weights=tuple(str(w) for w in _names(raw.get("weights", []), f"kernels[{name}].weights")),
        allowed_devices=tuple(_names(allowed, f"kernels[{name}].allowed_devices")) if allowed is not None else None,
        colocate=_name(raw["colocate"], f"kernels[{name}].colocate") if raw.get("colocate") is not None else None,
        attrs=_object(raw.get("attrs", {}), f"kernels[{name}].attrs"),
    )


def _names(value: Any, where: str) -> list[str]:
    """A JSON list of names (a bare string is refused, not split into characters)."""
    if not isinstance(value, list):
        raise DivimlInputError(
            f"must be a list of names, got {value!r}",
            field=where,
            hint=f'write ["{value}"] for one name' if isinstance(value, str) else None,
        )
    return [_name(item, f"{where}[{i}]") for i, item in enumerate(value)]


def _name(value: Any, where: str) -> str:
    """A name: a non-empty string (a whole number is taken as its digits)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise DivimlInputError(f"must be a name (a non-empty string), got {value!r}", field=where)
    return str(value)


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise DivimlInputError(f"must be an object, got {value!r}", field=where)
    return dict(value)


def _find_cycle(graph: OpGraph, stuck: list[str]) -> list[str]:
    """One cycle among the kernels Kahn's algorithm could not order, for the error message."""
    sub = nx.DiGraph()
    stuck_set = set(stuck)
    sub.add_edges_from((e.src, e.dst) for e in graph.edges if e.src in stuck_set and e.dst in stuck_set)
    cycle = nx.find_cycle(sub)
    return [u for u, _ in cycle] + [cycle[0][0]]
