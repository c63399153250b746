"""Data parallelism: a batch-B inference as R sub-batch copies of the graph, placed together.

``replicate`` puts R copies of the graph at batch B/R side by side (kernels ``b{i}/name``, edges
only within a copy, weights shared, so a device that runs two copies holds each weight once);
``ReplicatedCosts`` prices copy ``i`` of a kernel as the sub-batch model prices the kernel. Any
solver then places the copies like any other graph, so copies may run side by side on different
devices.

A lower bound for one split holds only for plans of that split: the batch's bound is the minimum
over the splits tried, R = 1 (the model as given) included (docs/design.md#lower-bounds, rules
that keep every bound valid). ``plan_with_batch_splits`` solves every split and reports that
minimum.

The splitting itself is TVM-free; ``split_workload`` and ``plan_with_batch_splits`` reach TVM only
through ``load_workload``, to build the zoo model at the sub-batch size.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

from ..bounds import lower_bound
from ..cost.base import CostModel
from ..errors import DivimlInputError
from ..graph import Edge, GraphInput, Kernel, OpGraph
from ..modelspec import format_model_spec, parse_model_spec
from ..plan import Plan
from ..runtime.routed import SplitBuild
from ..simulator import Simulation
from ..solvers import Problem
from ..tolerances import meets
from ..units import format_seconds
from ..zoo import ZOO, check_zoo_name, zoo_names
from .job import workload_problem
from .report import solve_and_report
from .workload import GENERATORS, Workload, load_workload

log = logging.getLogger(__name__)

COPY_ATTR = "batch_copy"  # kernel attribute: which sub-batch copy the kernel belongs to


def copy_name(index: int, name: str) -> str:
    return f"b{index}/{name}"


def split_copy_name(name: str) -> tuple[int, str]:
    """``b{i}/kernel`` -> (i, kernel). The prefix holds no '/', so the first one ends it."""
    prefix, sep, base = name.partition("/")
    if not sep or not prefix.startswith("b") or not prefix[1:].isdigit():
        raise KeyError(f"'{name}' is not a kernel of a replicated graph (expected b<copy>/<kernel>)")
    return int(prefix[1:]), base


def replicate(graph: OpGraph, copies: int) -> OpGraph:
    """``copies`` independent copies of ``graph``, sharing its weights.

    Kernels, inputs and co-location groups are renamed per copy; the model's outputs are every
    copy's outputs. Weight ids are kept, because the copies run one set of weights: the simulator
    counts a weight id once per device, so two copies on one device hold it once.
    """
    if not isinstance(copies, int) or copies < 1:
        raise DivimlInputError(f"copies must be a positive integer, got {copies!r}", field="--batch-split")
    kernels, edges, inputs, outputs = [], [], [], []
    for index in range(copies):
        for kernel in graph.kernels.values():
            kernels.append(
                Kernel(
                    copy_name(index, kernel.name),
                    kernel.flops,
                    kernel.bytes_moved,
                    kernel.output_bytes,
                    kernel.weights,
                    kernel.allowed_devices,
                    None if kernel.colocate is None else copy_name(index, kernel.colocate),
                    {**kernel.attrs, COPY_ATTR: index},
                )
            )
        edges += [Edge(copy_name(index, e.src), copy_name(index, e.dst), e.bytes) for e in graph.edges]
        inputs += [
            GraphInput(copy_name(index, i.name), i.bytes, tuple(copy_name(index, c) for c in i.consumers))
            for i in graph.inputs
        ]
        outputs += [copy_name(index, o) for o in graph.outputs]
    return OpGraph(
        kernels,
        edges,
        inputs=inputs,
        outputs=outputs,
        weights=graph.weights,
        name=f"{graph.name} x{copies}",
        attrs={**graph.attrs, "batch_split": copies},
    )


class ReplicatedCosts(CostModel):
    """Prices kernel ``b{i}/k`` of a replicated graph as ``base`` prices ``k`` (the sub-batch shape).

    Transfers are the base model's: a tensor costs what it costs, whichever copy sends it.
    """

    def __init__(self, base: CostModel, copies: int):
        super().__init__(base.platform)
        self.base = base
        self.copies = copies

    def _base_kernel(self, kernel: str) -> str:
        index, name = split_copy_name(kernel)
        if index >= self.copies:
            raise KeyError(f"'{kernel}' names copy {index}, but there are {self.copies} copies")
        return name

    def compute_s(self, kernel: str, device: str) -> float:
        return self.base.compute_s(self._base_kernel(kernel), device)

    def transfer_s(self, nbytes: float, src: str, dst: str) -> float:
        return self.base.transfer_s(nbytes, src, dst)

    def source(self, kernel: str, device: str) -> str:
        return self.base.source(self._base_kernel(kernel), device)


# ---------------------------------------------------------------------- zoo models at a sub-batch
def divisors(number: int) -> list[int]:
    return [r for r in range(1, number + 1) if number % r == 0]


def sub_batch_spec(model_spec: str, copies: int, cost: str | None = None) -> tuple[str, int]:
    """The MODEL string at batch B / ``copies``, and B. Only zoo models have a batch to split."""
    name, options = parse_model_spec(model_spec)
    is_file = model_spec.endswith((".json", ".onnx")) or os.path.sep in model_spec
    if is_file or name in GENERATORS:
        raise DivimlInputError(
            f"batch split needs a zoo model; '{model_spec}' has no batch dimension",
            field="--batch-split",
            hint="use a zoo model with MODEL:batch=B, e.g. resnet18:batch=4; `diviml models` lists them",
        )
    if copies > 1 and cost not in (None, "roofline", "measured"):
        raise DivimlInputError(
            "a cost table prices one batch size, not the sub-batch of a split",
            field="--cost",
            hint="use --cost roofline or --cost measured with --batch-split",
        )
    check_zoo_name(name)  # a typo is refused before TVM is imported
    zoo_names()  # imports the zoo's modules (and TVM), which fill ZOO
    defaults = ZOO[name].defaults()
    if "batch" not in defaults:
        raise DivimlInputError(f"zoo model '{name}' has no batch option", field="--batch-split")
    batch = options.get("batch", defaults["batch"])
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise DivimlInputError(
            f"batch must be a positive integer, got {batch!r}", field="MODEL", hint=f"e.g. {name}:batch=4"
        )
    if not isinstance(copies, int) or copies < 1 or batch % copies:
        raise DivimlInputError(
            f"a batch of {batch} cannot be split into {copies} equal sub-batches",
            field="--batch-split",
            hint=f"for batch {batch} use one of {', '.join(map(str, divisors(batch)))}; "
            f"or give a larger batch with {name}:batch=B",
        )
    options["batch"] = batch // copies
    return format_model_spec(name, options), batch


def split_workload(
    model_spec: str, platform: str | None, cost: str | None, copies: int, **load_options: Any
) -> Workload:
    """The zoo model of ``model_spec`` (batch B) as ``copies`` copies at batch B / ``copies``.

    The sub-batch model is loaded like any MODEL (so roofline and measured costs are those of the
    sub-batch shape), then replicated.
    """
    spec, batch = sub_batch_spec(model_spec, copies, cost)
    # inputs given are the whole batch's: each copy takes its rows of them when it runs
    sub = load_workload(spec, platform, cost, **{**load_options, "given_inputs": None})
    return Workload(
        replicate(sub.graph, copies),
        sub.platform,
        ReplicatedCosts(sub.costs, copies),
        f"{model_spec} as {copies} copies of batch {batch // copies}",
        sub.cost_source,
        sub.default_objective,
        sub.loaded,
    )


# ---------------------------------------------------------------------- solve every split, keep the best
def copy_devices(plan: Plan) -> dict[int, list[str]]:
    """Copy index -> the devices its kernels ran on (copy 0 for an unsplit graph)."""
    used: dict[int, set[str]] = {}
    for kernel, device in plan.assignment.items():
        index = split_copy_name(kernel)[0] if plan.batch_split > 1 else 0
        used.setdefault(index, set()).add(device)
    return {index: sorted(devices) for index, devices in sorted(used.items())}


def solve_batch_splits(
    workloads: dict[int, Workload],
    solver: str,
    objective: str | None = None,
    *,
    stages: int | None = None,
    time_limit_s: float = 60.0,
    seed: int = 0,
) -> tuple[Plan, Simulation, dict, Problem]:
    """Solve each split (``workloads``: R -> the R-copy workload, R = 1 the model as given) and
    return the best plan's (plan, simulation, row, problem).

    The row's bound is the minimum over the splits of each split's bound; a split whose solver
    gives up still counts, with its combinatorial bound (which needs no plan). Baselines are those
    of the unsplit model, what the batch costs on one device (the chosen split's when the unsplit
    model found no plan).
    """
    if 1 not in workloads:
        raise ValueError("the splits tried must include R = 1, the model as given")
    tried: dict[int, dict[str, Any]] = {}
    solved: dict[int, tuple[Plan, Simulation, dict, Problem]] = {}
    failures: dict[int, DivimlInputError] = {}
    for copies, workload in sorted(workloads.items()):
        problem = workload_problem(workload, objective, stages)
        began = time.perf_counter()
        try:
            plan, sim, row = solve_and_report(
                problem, solver, workload.model, workload.cost_source, time_limit_s=time_limit_s, seed=seed
            )
        except DivimlInputError as error:
            failures[copies] = error
            tried[copies] = {
                "value_s": None,
                "lower_bound_s": lower_bound(problem),
                "kernels": len(problem.graph),
                "error": str(error),
            }
            log.warning("batch split %d: no plan (%s)", copies, error)
            continue
        plan.batch_split = copies
        solved[copies] = (plan, sim, row, problem)
        tried[copies] = {
            "value_s": sim.value_s if sim.feasible else None,
            "lower_bound_s": row["lower_bound_s"],
            "lower_bound_parts": row["lower_bound_parts"],
            "kernels": len(problem.graph),
        }
        log.info(
            "batch split %d: %d kernels, value %s, bound %s, solved in %.2f s",
            copies,
            len(problem.graph),
            format_seconds(sim.value_s),
            format_seconds(row["lower_bound_s"]),
            time.perf_counter() - began,
        )
    if not solved:
        raise failures[1]
    return best_of_splits(solved, tried)


def best_of_splits(
    solved: dict[int, tuple[Plan, Simulation, dict, Problem]], tried: dict[int, dict[str, Any]]
) -> tuple[Plan, Simulation, dict, Problem]:
    """The best split's (plan, simulation, row, problem), its row rewritten for the whole batch: a
    split's own bound holds only for its plans, so the bound (and gap, optimality) is the minimum over
    every split tried, and the baselines are the unsplit model's where it found a plan."""
    best = min(solved, key=lambda r: (not solved[r][1].feasible, solved[r][1].value_s, r))
    plan, sim, row, problem = solved[best]
    bound = min(entry["lower_bound_s"] for entry in tried.values())
    value = sim.value_s
    baselines = solved[1][2]["baselines"] if 1 in solved else row["baselines"]
    best_single = baselines.get("fastest_single_device")
    row.update(
        {
            "lower_bound_s": bound,
            "lower_bound_parts": {"min_over_batch_splits": bound},
            "gap": value / bound - 1.0 if bound > 0 and math.isfinite(value) else None,
            "optimal": math.isfinite(value) and meets(value, bound),
            "baselines": baselines,
            "speedup_over_fastest_single_device": (best_single / value) if best_single and value > 0 else None,
            "batch_split": best,
            "batch_splits_tried": tried,
            "copies": copy_devices(plan),
        }
    )
    plan.lower_bound_s, plan.optimal = bound, row["optimal"]
    return plan, sim, row, problem


def batch_split_workloads(
    model_spec: str, platform: str | None = None, cost: str | None = None, max_split: int = 1, **load_options: Any
) -> dict[int, Workload]:
    """Zoo model ``model_spec`` (batch B) unsplit (R = 1) and as R copies for every divisor R of B up
    to ``max_split`` (which must divide B)."""
    _, batch = sub_batch_spec(model_spec, max_split, cost)  # fail before loading anything
    splits = [r for r in divisors(batch) if r <= max_split]
    log.info("%s: batch %d, trying splits %s", model_spec, batch, splits)
    workloads = {1: load_workload(model_spec, platform, cost, **load_options)}
    for copies in splits[1:]:
        workloads[copies] = split_workload(model_spec, platform, cost, copies, **load_options)
    return workloads


def plan_with_batch_splits(
    model_spec: str,
    platform: str | None = None,
    cost: str | None = None,
    max_split: int = 1,
    solver: str = "fastest_single_device",
    objective: str | None = None,
    time_limit_s: float = 60.0,
    seed: int = 0,
    *,
    stages: int | None = None,
    **load_options: Any,
) -> tuple[Plan, Simulation, dict, Problem]:
    """Place zoo model ``model_spec`` (batch B) unsplit and as R copies for every divisor R of B up
    to ``max_split`` (which must divide B); return the best plan, its simulation, row and problem."""
    workloads = batch_split_workloads(model_spec, platform, cost, max_split, **load_options)
    return solve_batch_splits(workloads, solver, objective, stages=stages, time_limit_s=time_limit_s, seed=seed)


def build_split(plan: Plan, whole: Workload, split: Workload, build_one) -> SplitBuild:
    """A batch split's builds: the sub-batch model (``split``'s) placed as each copy's kernels are,
    by ``build_one(model, extraction, plan)``; copies placed alike share one build. An input is cut
    along axis 0 where the batch model's has R times the sub-batch's rows there."""
    copies = plan.batch_split
    by_copy: dict[int, dict[str, str]] = {index: {} for index in range(copies)}
    for kernel, device in plan.assignment.items():
        index, name = split_copy_name(kernel)
        by_copy[index][name] = device
    sub = split.loaded
    builds: dict[tuple, Any] = {}
    per_copy, names = [], []
    for index, assignment in sorted(by_copy.items()):
        key = tuple(sorted(assignment.items()))
        if key not in builds:
            builds[key] = build_one(sub.built, sub.extraction, Plan(assignment, objective=plan.objective))
        per_copy.append(builds[key])
        names.append(f"copy {index} ({', '.join(sorted(set(assignment.values())))})")
    whole_inputs, sub_inputs = whole.loaded.built.sample_inputs(), sub.built.sample_inputs()
    batched = [
        w.ndim > 0 and s.ndim > 0 and w.shape[0] == s.shape[0] * copies for w, s in zip(whole_inputs, sub_inputs)
    ]
    return SplitBuild(per_copy, names, batched, [w for _, w in sub.built.params])


def format_batch_splits(row: dict[str, Any]) -> str:
    """One line per split tried, the bound rule, and which copy ran where."""
    what = "latency" if row["objective"] == "latency" else "period"
    lines = []
    for copies, entry in sorted(row["batch_splits_tried"].items()):
        result = (
            f"{what} {format_seconds(entry['value_s'])}"
            if entry.get("error") is None
            else f"no plan ({entry['error']})"
        )
        chosen = "   <- chosen" if copies == row["batch_split"] else ""
        lines.append(
            f"batch split {copies}: {entry['kernels']} kernels, {result}, its own bound "
            f"{format_seconds(entry['lower_bound_s'])}{chosen}"
        )
    lines.append("lower bound reported: the minimum over the splits tried (a split's bound holds only for that split)")
    lines += [f"copy {index} ran on {', '.join(devices)}" for index, devices in row["copies"].items()]
    return "\n".join(lines)
