"""PartitionForDevices: the whole job as one module pass — extract, price, solve, apply.

``PartitionForDevices(platform, objective=..., solver=..., cost=...)(mod)`` returns the placed
module (as ``ApplyPlan`` does) with two attributes to inspect: ``diviml_placement`` (how to call
it, see ``Placement``) and ``diviml_plan`` (the Plan JSON; ``attrs.simulated_value_s`` is the
simulator's value of it). The pass object keeps its last result too: ``.plan``, ``.placement``,
``.applied``, ``.simulation``. A placed module must be built without ``StaticPlanBlockMemory``
(see ``build``), so the pass comes with its build pipeline: ``relax_pipeline=partition.pipeline()``.

TVM users also name pipelines (``relax_pipeline="diviml"``), but TVM passes such a pipeline no
arguments and ``PassContext(config=...)`` rejects unknown keys, so the options come from our context
manager ``partition_options(platform, ...)``, which also hands back the result; outside it the
"diviml" pipeline refuses to guess the machine and raises. Both uses, step by step:
tutorials/04_as_a_tvm_pipeline.py; the TVM 0.27 traps behind them: docs/design.md#tvm-027-traps.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import math
from collections.abc import Iterator

import tvm
import tvm_ffi
from tvm import relax

from tvm_diviml.cost.base import CostModel
from tvm_diviml.cost.catalog import check as check_cost
from tvm_diviml.cost.catalog import create as create_costs
from tvm_diviml.cost.provenance import MeasureOptions
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import OpGraph
from tvm_diviml.plan import OBJECTIVES, Plan
from tvm_diviml.planning import plan_model
from tvm_diviml.platform import Platform
from tvm_diviml.presets import load_platform
from tvm_diviml.simulator import PlanError, Simulation, simulate
from tvm_diviml.solvers import SOLVERS, Problem

from ..frontends.importers import module_as_model
from ..passes.apply_plan import PLACEMENT_ATTR, AppliedPlan, apply_plan
from ..passes.build import placed_build_pipeline
from ..passes.extract import Extraction, extract
from ..profiling.profiler import profile
from ..profiling.timing import candidate_platform, choose_by_measurement

log = logging.getLogger(__name__)

PLAN_ATTR = "diviml_plan"
PIPELINE_NAME = "diviml"

# A pass runs behind TVM's FFI, which turns unknown exception types into RuntimeError; registered,
# a bad-input error raised inside the pass reaches the caller of tvm.compile as itself.
for _error in (DivimlInputError, PlanError):
    tvm_ffi.register_error(_error.__name__, _error)


def _platform_of(platform: Platform | str) -> Platform:
    if isinstance(platform, Platform):
        return platform
    if isinstance(platform, str):
        return load_platform(platform)
    raise DivimlInputError(
        f"platform must be a Platform, a preset name or a .json file, not {type(platform).__name__}",
        field="platform",
        hint="e.g. platform='cpu2'",
    )


def _check_cost(cost) -> None:
    """A CostModel object, or what the cost catalog names (``cost.catalog.check``)."""
    if not isinstance(cost, CostModel):
        check_cost(cost)


@tvm.transform.module_pass(opt_level=0, name="diviml.PartitionForDevices")
class PartitionForDevices:
    """Module pass: place ``mod``'s kernels on ``platform``'s devices for ``objective`` and return the
    placed module (module docstring). Options are checked here, before any compile starts."""

    def __init__(
        self,
        platform: Platform | str,
        *,
        objective: str = "latency",
        solver: str = "auto",
        cost: str | CostModel = "roofline",
        stages: int | None = None,
        time_limit_s: float = 10.0,
        entry: str | None = None,
        seed: int = 0,
        candidates: int | None = None,
    ):
        """``candidates``: build and time that many best plans and the single-device configurations
        here (seeded random weights) and keep the fastest measured (``passes.timing.choose_by_measurement``);
        ``.selection`` then says which won and what each measured."""
        if objective not in OBJECTIVES:
            raise DivimlInputError(
                f"unknown objective '{objective}'", field="objective", hint=f"use one of {', '.join(OBJECTIVES)}"
            )
        if solver != "auto" and solver not in SOLVERS:
            raise DivimlInputError(
                f"unknown solver '{solver}'", field="solver", hint=f"use 'auto' or one of {', '.join(SOLVERS)}"
            )
        _check_cost(cost)
        if not time_limit_s > 0:
            raise DivimlInputError(f"time_limit_s must be positive, not {time_limit_s}", field="time_limit_s")
        self.platform = _platform_of(platform)
        self.objective, self.solver, self.cost, self.stages = objective, solver, cost, stages
        if stages is not None and (isinstance(stages, bool) or not isinstance(stages, int) or stages < 1):
            raise DivimlInputError(
                f"stages must be a positive integer, not {stages!r}",
                field="stages",
                hint="e.g. stages=2 with objective='pipeline'; None gives one stage per device",
            )
        if candidates is not None and (not isinstance(candidates, int) or candidates < 1):
            raise DivimlInputError(f"candidates must be a positive integer, not {candidates!r}", field="candidates")
        self.time_limit_s, self.entry, self.seed, self.candidates = time_limit_s, entry, seed, candidates
        self.selection = None
        self.plan: Plan | None = None
        self.simulation: Simulation | None = None
        self.applied: AppliedPlan | None = None

    @property
    def placement(self):
        return self.applied.placement if self.applied else None

    def cost_model(self, extraction: Extraction, mod=None) -> CostModel:
        """The prices the solver sees for this module's kernels. Measured costs are those of ``diviml
        run``: kernels timed, and with ``mod`` (the module ``extraction`` came from) calibrated inside
        the whole model, run with its own weights (seeded random ones where it lacks them)."""
        if isinstance(self.cost, CostModel):
            return self.cost

        def measure(graph: OpGraph, platform: Platform) -> CostModel:
            model = None if mod is None else module_as_model(mod, extraction.entry, self.seed)
            options = MeasureOptions(progress=False)
            return profile(graph, platform, model, extraction, options=options, calibrate=mod is not None)

        return create_costs(self.cost, extraction.graph, self.platform, measure=measure)

    def solve(self, extraction: Extraction, mod=None) -> tuple[Plan, Simulation]:
        """The solver's plan for ``extraction``'s graph, scored by the simulator; with ``candidates``,
        the fastest measured of the best plans of ``mod`` (the module ``extraction`` came from) instead."""
        problem = Problem(
            extraction.graph,
            self.platform,
            self.cost_model(extraction, mod),
            objective=self.objective,
            stages=self.stages,
        )
        solved = plan_model(problem, self.solver, time_limit_s=self.time_limit_s, seed=self.seed)
        plan, sim = solved.plan, solved.simulation
        if not sim.feasible or math.isinf(sim.value_s):
            raise DivimlInputError(
                f"solver {plan.solver} found no feasible placement of {len(problem.graph)} kernels on "
                f"'{self.platform.name}': {'; '.join(sim.problems) or 'infinite cost'}",
                field="platform",
                hint="use devices with more memory, or another solver",
            )
        plan.simulated_value_s = sim.value_s
        log.info(
            "%s placed %d kernels on %s for %s: %.4g s (simulated, lower bound %.4g s), solved in %.2f s",
            plan.solver,
            len(problem.graph),
            ", ".join(plan.devices_used()),
            self.objective,
            sim.value_s,
            solved.bound_s,
            plan.solve_s or 0.0,
        )
        if solved.kept_single_device:
            log.info("%s", solved.kept_single_device)
        if self.candidates:
            if mod is None:
                raise DivimlInputError(
                    "timing candidates needs the module the extraction came from",
                    field="mod",
                    hint="call solve(extraction, mod)",
                )
            model = module_as_model(mod, extraction.entry, self.seed)
            self.selection, _, _ = choose_by_measurement(
                model, extraction, problem, plan, self.candidates, progress=log.info
            )
            plan = self.module_winner().plan
            sim = simulate(problem, plan)
            plan.simulated_value_s = sim.value_s
        return plan, sim

    def module_winner(self):
        """The fastest measured candidate that one module holds: a replicated plan is one build per
        route (``runtime.routed``; build it with ``passes.timing.build_runnable``), so where one
        measured fastest it stays in ``.selection`` and the pass places the best plain plan."""
        plain = [c for c in self.selection.candidates if not c.plan.replicas and c.measured_s is not None]
        winner = self.selection.winner
        if winner.plan.replicas and plain:
            log.warning(
                "%s measured fastest (%s per inference); one module holds one plan, so the pass places %s: "
                "build the replicated plan from .selection.winner.plan with passes.timing.build_runnable",
                winner.label,
                winner.measured_s,
                plain[0].label,
            )
            return plain[0]
        return winner

    def transform_module(self, mod, ctx):
        extraction = extract(mod, self.entry)
        plan, sim = self.solve(extraction, mod)
        platform = self.platform  # the whole CPU as one device, if that won
        if self.selection is not None:
            platform = candidate_platform(platform, self.module_winner())
        applied = apply_plan(mod, plan, platform, entry=extraction.entry, extraction=extraction)
        self.plan, self.simulation, self.applied = plan, sim, applied
        return applied.mod.with_attr(PLACEMENT_ATTR, applied.placement.to_json()).with_attr(
            PLAN_ATTR, json.dumps(plan.to_json(), sort_keys=True)
        )

    def pipeline(self) -> tvm.transform.Pass:
        """This pass then the placed build pipeline: ``tvm.compile(mod, target=None, relax_pipeline=...)``.
        The result lands on this object (``self`` here is the instance TVM's wrapper delegates to)."""
        partition = tvm.transform.module_pass(self.transform_module, opt_level=0, name="diviml.PartitionForDevices")
        return tvm.transform.Sequential([partition, placed_build_pipeline()], name="diviml.partition_and_build")


_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("diviml_partition_options", default=None)


@contextlib.contextmanager
def partition_options(platform: Platform | str, **options) -> Iterator[PartitionForDevices]:
    """Options for the registered "diviml" pipeline inside this block (per thread; nests); yields the
    pass, whose ``.plan`` and ``.placement`` hold the result once ``tvm.compile`` returns."""
    partition = PartitionForDevices(platform, **options)
    token = _ACTIVE.set(partition)
    try:
        yield partition
    finally:
        _ACTIVE.reset(token)


def diviml_pipeline() -> tvm.transform.Pass:
    """The pipeline ``relax_pipeline="diviml"`` names: the active ``partition_options``' pass and build."""
    partition = _ACTIVE.get()
    if partition is None:
        raise DivimlInputError(
            "the 'diviml' pipeline needs to know the devices and the objective",
            field="relax_pipeline",
            hint="wrap tvm.compile in `with partition_options(platform, ...)`, or pass "
            "relax_pipeline=PartitionForDevices(platform, ...).pipeline()",
        )
    return partition.pipeline()


# Re-importing (importlib.reload re-runs this file in the same namespace) must not register twice:
# TVM raises on a taken name, and the registered function reads this module's globals anyway.
if PIPELINE_NAME not in relax.pipeline.PIPELINE_MAP:
    relax.register_pipeline(PIPELINE_NAME)(diviml_pipeline)
