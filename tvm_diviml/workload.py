"""Turn the user's MODEL, --platform and --cost into (OpGraph, Platform, CostModel).

MODEL is an OpGraph ``.json``, a graph in the msr-fiddle format (detected by its keys; it carries
its own platform and costs), or a built-in generator with options (``random:kernels=20,seed=1``,
``branchy:branches=4``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from .cost.base import CostModel
from .cost.roofline import RooflineCostModel
from .cost.table import TableCostModel
from .errors import DivimlInputError
from .graph import OpGraph
from .jsonio import read_json
from .msr_fiddle import is_msr_fiddle, read_msr_fiddle
from .platform import Platform, get_platform
from .synthetic import branchy, random_dag

DEFAULT_PLATFORM = "paper-node"

GENERATORS: dict[str, tuple[Callable[..., OpGraph], str]] = {
    "random": (random_dag, "seeded random DAG (kernels=16, seed=0, edge_probability=0.25)"),
    "branchy": (branchy, "stem, parallel branches, concat (branches=4, depth=3)"),
}


@dataclass
class Workload:
    graph: OpGraph
    platform: Platform
    costs: CostModel
    model: str
    cost_source: str              # "roofline", "msr-fiddle", or the cost file's path
    default_objective: str = "latency"


def parse_model_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``name:key=value,key=value`` -> (name, options); values become int, float or str."""
    name, _, rest = spec.partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DivimlInputError(f"option '{item}' is not key=value", field="MODEL",
                                   hint="write options as name:key=value,key=value")
        options[key.strip()] = _parse_value(value.strip())
    return name, options


def _parse_value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def load_workload(model: str, platform: str | None = None, cost: str | None = None) -> Workload:
    if model.endswith(".json") or os.path.sep in model:
        data = read_json(model)
        if is_msr_fiddle(data):
            if platform is not None or cost is not None:
                raise DivimlInputError("an msr-fiddle file carries its own devices and costs", source=model,
                                       hint="drop --platform and --cost for this file")
            try:
                graph, plat, costs = read_msr_fiddle(data, name=os.path.basename(model))
            except DivimlInputError as error:
                raise error.within(model) from None
            return Workload(graph, plat, costs, model, "msr-fiddle", default_objective="throughput")
        try:
            graph = OpGraph.from_json(data)
        except DivimlInputError as error:
            raise error.within(model) from None
    else:
        name, options = parse_model_spec(model)
        if name not in GENERATORS:
            raise DivimlInputError(f"unknown model '{name}'", field="MODEL",
                                   hint=f"give an OpGraph .json, an msr-fiddle .json, or one of: {', '.join(GENERATORS)}")
        try:
            graph = GENERATORS[name][0](**options)
        except (TypeError, ValueError) as error:
            raise DivimlInputError(f"bad options for '{name}': {error}", field="MODEL",
                                   hint=GENERATORS[name][1]) from None
    plat = get_platform(platform or DEFAULT_PLATFORM)
    cost = cost or "roofline"
    if cost == "roofline":
        costs: CostModel = RooflineCostModel(graph, plat)
    elif cost == "measured":
        raise DivimlInputError("measured costs need the TVM front end, which this build does not have yet",
                               field="--cost", hint="use --cost roofline or a cost table FILE")
    else:
        costs = TableCostModel.load(cost, plat, graph)
    return Workload(graph, plat, costs, model, cost)
