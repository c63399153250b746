"""What ``plan``, ``run`` and ``profile`` share: how a MODEL is loaded (``LoadOptions``), how its placement
is solved (``SolveOptions``), and the solve itself: the workload's problem, ``plan_model``'s answer and
the contract row every report prints. TVM-free: ``diviml plan`` on an OpGraph never imports it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import DivimlInputError
from ..planning import Solved, plan_model
from ..problem import Problem
from ..toolkit.incumbents import Event
from .inputs import read_input_file
from .report import report_row
from .workload import Workload, load_workload


@dataclass(frozen=True)
class LoadOptions:
    """How a MODEL is read: symbolic dimensions bound (``shapes``), one node per fused kernel or per
    operator, MetaSchedule tuning (``tune``: a ``TuningBudget``) or an existing database, and the
    user's inputs (``input_file``: .npy or .npz, ``run --input``)."""

    shapes: dict[str, int] | None = None
    granularity: str = "fused"
    tune: Any = None
    tuning_db: str | None = None
    input_file: str | None = None

    def keywords(self, runs_here: bool = False) -> dict[str, Any]:
        """``load_workload``'s keywords; the input file is read here, before the model, so that a missing
        or unreadable file is refused first."""
        return dict(
            shapes=self.shapes,
            granularity=self.granularity,
            tune=self.tune,
            tuning_db=self.tuning_db,
            runs_here=runs_here,
            given_inputs=read_input_file(self.input_file) if self.input_file else None,
        )


AS_GIVEN = LoadOptions()  # the model as it is: fused kernels, no tuning, random inputs


@dataclass(frozen=True)
class SolveOptions:
    """How a placement is solved: the objective (None: the workload's own), a pipeline's most stages
    (None: one per device), the solver, the wall time of the whole solve, the part of it kept for the
    stronger bounds, and the seed of every random choice."""

    objective: str | None = None
    stages: int | None = None
    solver: str = "auto"
    time_limit_s: float = 60.0
    bound_time_limit_s: float = 0.0
    seed: int = 0


def workload_problem(workload: Workload, objective: str | None, stages: int | None) -> Problem:
    """The problem of a workload: its own objective unless one is given, and for a pipeline one stage per
    device unless ``stages`` says otherwise."""
    chosen = objective or workload.default_objective
    return Problem(
        workload.graph,
        workload.platform,
        workload.costs,
        objective=chosen,
        stages=stages or (len(workload.platform.devices) if chosen == "pipeline" else None),
    )


def solve_workload(
    workload: Workload,
    options: SolveOptions,
    *,
    listener: Callable[[Event], None] | None = None,
    interrupt_keeps_best: bool = False,
) -> tuple[Solved, dict[str, Any], Problem]:
    """Place ``workload`` (``plan_model``, which may replicate the model or its stages for throughput: a
    run builds a replicated plan as one executable per route); with the contract row and the problem.
    ``interrupt_keeps_best``: Ctrl-C during the solve keeps the best plan so far (``plan``: the plan is
    the result) instead of stopping the command (``run``: a user who interrupts it wants nothing built)."""
    problem = workload_problem(workload, options.objective, options.stages)
    solved = plan_model(
        problem,
        options.solver,
        time_limit_s=options.time_limit_s,
        seed=options.seed,
        bound_time_limit_s=options.bound_time_limit_s,
        listener=listener,
        interrupt_keeps_best=interrupt_keeps_best,
        replicas=True,
    )
    return solved, report_row(problem, solved, workload.model, workload.cost_source), problem


def runnable_workload(model: str, platform: str | None, cost: str | None, load: LoadOptions) -> Workload:
    """The workload of a run on this machine: a model that TVM builds (not an OpGraph or msr-fiddle file)."""
    workload = load_workload(model, platform, cost, **load.keywords(runs_here=True))
    if workload.loaded is None:
        raise DivimlInputError(
            "run needs a model that TVM builds",
            field="MODEL",
            hint="give a zoo name, an .onnx file or a .pt2 program (an OpGraph or msr-fiddle file has no kernels)",
        )
    return workload
