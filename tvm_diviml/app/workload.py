"""Turn the user's MODEL, --platform and --cost into (OpGraph, Platform, CostModel).

MODEL is a zoo name with options (``resnet18:resolution=64``), an ``.onnx`` file, a ``.pt2``
program saved with ``torch.export.save``, an OpGraph
``.json``, a graph in the msr-fiddle format (detected by its keys; it carries its own platform and
costs), or a synthetic generator (``random:kernels=20,seed=1``, ``branchy:branches=4``). This is
the glue layer: the one place the library reaches, lazily, into ``tvm_diviml.passes`` — only for
models that TVM must build.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..cost.base import CostModel
from ..cost.catalog import MEASURED, Factory
from ..cost.catalog import create as create_costs
from ..errors import DivimlInputError
from ..frontends import SUFFIXES as IMPORTED_SUFFIXES
from ..graph import OpGraph
from ..host_memory import available_memory_bytes
from ..jsonio import read_json
from ..modelspec import check_counts, parse_model_spec
from ..msr_fiddle import is_msr_fiddle, read_msr_fiddle
from ..platform import Platform
from ..presets import load_platform
from ..servers import PREFIX as SERVERS_PREFIX
from ..servers import spec_groups
from ..synthetic import branchy, random_dag
from ..units import format_bytes
from ..zoo import check_zoo_name
from .inputs import InputFile
from .reference import framework_input_names

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
    cost_source: str  # "roofline", "msr-fiddle", or the cost file's path
    default_objective: str = "latency"
    loaded: Any = None  # the TVM model and its extraction, for zoo and imported models


@dataclass
class ModelGraph:
    """A MODEL read into an OpGraph, with what came along: the TVM model and its extraction (zoo,
    ONNX, .pt2), or the devices and costs an msr-fiddle file carries."""

    graph: OpGraph
    loaded: Any = None
    platform: Platform | None = None
    costs: CostModel | None = None


def load_graph(model: str, *, shapes: dict[str, int] | None = None, granularity: str = "fused") -> ModelGraph:
    if os.path.isdir(model):
        raise DivimlInputError(
            "is a folder, not a model",
            source=model,
            hint="give a zoo name, or a model file in it (.onnx, .pt2, or an OpGraph / msr-fiddle .json)",
        )
    if model.endswith(IMPORTED_SUFFIXES):
        from .load import load_model  # TVM enters here, and only for TVM models

        loaded = load_model(model, {}, shapes=shapes, fused=granularity == "fused", path=model)
        return ModelGraph(loaded.extraction.graph, loaded)
    if is_model_file(model):
        data = read_json(model)
        try:
            if is_msr_fiddle(data):
                graph, platform, costs = read_msr_fiddle(data, name=os.path.basename(model))
                return ModelGraph(graph, platform=platform, costs=costs)
            return ModelGraph(OpGraph.from_json(data))
        except DivimlInputError as error:
            raise error.within(model) from None
    name, options = parse_model_spec(model)
    if name in GENERATORS:
        generator = GENERATORS[name][0]
        defaults = {
            k: p.default
            for k, p in inspect.signature(generator).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
        check_counts(name, options, defaults)
        try:
            return ModelGraph(generator(**options))
        except (TypeError, ValueError) as error:
            raise DivimlInputError(
                f"bad options for '{name}': {error}", field="MODEL", hint=GENERATORS[name][1]
            ) from None
    check_zoo_name(name)
    from .load import load_model  # TVM enters here, and only for TVM models

    loaded = load_model(name, options, shapes=shapes, fused=granularity == "fused")
    return ModelGraph(loaded.extraction.graph, loaded)


def is_model_file(model: str) -> bool:
    """Whether MODEL names a file (an imported model, a graph .json, any path), not a zoo name or generator."""
    return model.endswith((*IMPORTED_SUFFIXES, ".json")) or os.path.sep in model


def platform_files(spec: str | None) -> list[str]:
    """The files a ``--platform`` spec reads: a platform .json, or the .json kinds of a ``servers:`` spec."""
    if not spec:
        return []
    if spec.startswith(SERVERS_PREFIX):
        return [kind for _, kind in spec_groups(spec)[0] if kind.endswith(".json")]
    return [spec] if spec.endswith(".json") else []


def load_workload(
    model: str,
    platform: str | None = None,
    cost: str | None = None,
    *,
    shapes: dict[str, int] | None = None,
    granularity: str = "fused",
    tune=None,
    tuning_db: str | None = None,
    runs_here: bool = False,
    given_inputs: InputFile | None = None,
) -> Workload:
    """``runs_here``: the model will be built and run on this machine (``diviml run``), as it is to
    measure its costs: its memory is checked against this machine's first, and measured costs are
    priced inside the model as timed now (this VM's speed drifts by tens of percent within the hour
    that a cached whole-model time is kept: a prediction and its measurement then disagree). The platform is read (and,
    where it will be built for, its targets checked with TVM) before the model, the slow part.
    ``given_inputs``: the user's inputs, which the model then takes everywhere it runs (checked against
    its inputs before any kernel is timed)."""
    plat = load_platform(platform or DEFAULT_PLATFORM)
    tuned = (tune is not None and tune.active) or bool(tuning_db)  # tune: a TuningBudget
    cost = cost or (MEASURED if tuned else None)
    if runs_here or cost == MEASURED:
        from ..profiling.measured import check_targets  # TVM enters here: only to measure or run, which need it

        check_targets(plat, platform)
    found = load_graph(model, shapes=shapes, granularity=granularity)
    if given_inputs is not None and found.loaded is not None:
        found.loaded.built = given_inputs.fed_to(found.loaded.built, framework_input_names(model))
    if found.platform is not None:
        if platform is not None or cost is not None:
            raise DivimlInputError(
                "an msr-fiddle file carries its own devices and costs",
                source=model,
                hint="drop --platform and --cost for this file",
            )
        return Workload(found.graph, found.platform, found.costs, model, "msr-fiddle", default_objective="throughput")
    graph = found.graph
    cost = cost or "roofline"
    if tuned and cost != MEASURED:
        raise DivimlInputError(
            "--tune, --tune-minutes and --tuning-db apply to measured costs",
            field="--cost",
            hint="drop --cost or use --cost measured",
        )
    if found.loaded is not None and (runs_here or cost == MEASURED):
        require_memory_to_run(graph, model)
    measure = measuring(found.loaded, tune=tune, tuning_db=tuning_db, fresh=runs_here)
    costs = create_costs(cost, graph, plat, measure=measure)
    return Workload(graph, plat, costs, model, cost, loaded=found.loaded)


def measuring(loaded, *, tune=None, tuning_db: str | None = None, fresh: bool = False) -> Factory:
    """The cost catalog's "measured" for a loaded model (None where TVM does not build it: refused when
    measured): ``profiling.profile`` with the model, the schedules and the freshness bound."""

    def measure(graph: OpGraph, platform: Platform) -> CostModel:
        from ..profiling.profiler import profile  # TVM enters here, and only for measured costs

        built, extraction = (loaded.built, loaded.extraction) if loaded else (None, None)
        return profile(graph, platform, built, extraction, tune=tune, tuning_db=tuning_db, fresh=fresh)

    return measure


def require_memory_to_run(graph: OpGraph, model: str) -> None:
    """Refuse, before anything is allocated, a model whose weights, inputs and largest tensor
    together exceed the memory this machine has available (numpy would fail deep inside with tens
    of GiB asked for); a machine that does not say what it has is not checked."""
    available = available_memory_bytes()
    largest = max((k.output_bytes for k in graph.kernels.values()), default=0.0)
    weights, inputs = sum(graph.weights.values()), sum(i.bytes for i in graph.inputs)
    needed = weights + inputs + largest
    if available is not None and needed > available:
        raise DivimlInputError(
            f"running it here needs at least {format_bytes(needed)} (weights {format_bytes(weights)}, inputs "
            f"{format_bytes(inputs)}, largest tensor {format_bytes(largest)}); this machine has "
            f"{format_bytes(available)} available",
            source=model,
            hint="choose smaller model options (batch, resolution, seq) or --shape values, or plan it without running",
        )
