"""The flags several commands share and how their values are read: a MODEL and how it is loaded, where
and how it is placed, tuning; numbers that must be positive, shapes, picture paths."""

from __future__ import annotations

import argparse
import math
import os

from ..app.job import LoadOptions, SolveOptions
from ..app.workload import GENERATORS
from ..plan import OBJECTIVES
from ..solvers import SOLVERS


def model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="a zoo model with options (resnet18:resolution=64; see `diviml models`), an .onnx "
        "file, a .pt2 program (torch.export.save), an OpGraph .json, an msr-fiddle .json, or a generator "
        f"({', '.join(GENERATORS)}) with options",
    )
    parser.add_argument(
        "--shape",
        action="append",
        type=shape_binding,
        metavar="NAME=VALUE",
        help="bind a symbolic dimension of an imported model (repeatable)",
    )
    parser.add_argument(
        "--granularity",
        choices=["fused", "operator"],
        default="fused",
        help="one node per fused kernel (default) or per operator",
    )


def problem_arguments(
    parser: argparse.ArgumentParser,
    *,
    platform: str | None,
    platform_help: str,
    objective: str | None,
    objective_help: str,
    time_limit: float,
    bound_time_limit: float,
) -> None:
    """The flags ``plan`` and ``run`` share: where, what for, and how the placement is solved (their
    defaults differ: ``run`` plans for this machine and spends less time on solving)."""
    parser.add_argument("--platform", default=platform, help=platform_help)
    parser.add_argument("--objective", choices=OBJECTIVES, default=objective, help=objective_help)
    parser.add_argument("--stages", type=positive_int, help="pipeline: the most stages (default: one per device)")
    parser.add_argument(
        "--solver",
        choices=["auto", *sorted(SOLVERS)],
        default="auto",
        help="default auto: symmetric on several servers (latency, throughput), else split for "
        "latency, milp for throughput, downsets for pipelines and msr-fiddle files",
    )
    parser.add_argument(
        "--time-limit",
        type=positive_float,
        default=time_limit,
        metavar="S",
        help="wall time of the whole solve in seconds: the plan, its baselines and bounds (default "
        f"{time_limit:g}; past a few thousand kernels the first plan and the cheap bounds may take longer)",
    )
    parser.add_argument(
        "--bound-time-limit",
        type=non_negative_float,
        default=bound_time_limit,
        metavar="S",
        help="seconds of the time limit kept from the solver for the stronger lower bounds: pipelines' stage "
        "cover and MIPs, latency's series decomposition and overlap branching (up to a quarter of the limit); "
        "they also get whatever the solver leaves, and start only with a second left "
        f"(default {bound_time_limit:g}; 0: combinatorial bounds only)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")


def tuning_arguments(parser: argparse.ArgumentParser, db_help: str) -> None:
    parser.add_argument(
        "--tune",
        type=positive_int,
        default=0,
        metavar="TRIALS",
        help="tune each kernel with MetaSchedule (TRIALS per kernel) before measuring; the database "
        "persists under the cache directory and a repeated run resumes",
    )
    parser.add_argument(
        "--tune-minutes",
        type=lambda text: seconds(text, allow_zero=False, unit=" of minutes"),
        default=0.0,
        metavar="M",
        help="tune the model's kernels with MetaSchedule for M minutes in all (with --tune: whichever "
        "ends first), starting from the default schedules, with a progress bar and the time left",
    )
    parser.add_argument("--tuning-db", metavar="DIR", help=db_help)


def batch_split_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-split",
        type=positive_int,
        default=1,
        metavar="R",
        help="data parallelism (zoo models, MODEL:batch=B): also try R and every smaller divisor "
        "of B as sub-batch copies placed together; the best plan wins, the bound is the minimum "
        "(run: the copies are built, run side by side and their outputs joined)",
    )


def load_options(args: argparse.Namespace) -> LoadOptions:
    """How the model flags say to load MODEL (``run --input``'s file among them)."""
    return LoadOptions(
        shapes=args.shape,
        granularity=args.granularity,
        tune=tuning_budget(args),
        tuning_db=args.tuning_db,
        input_file=getattr(args, "input", None),
    )


def solve_options(args: argparse.Namespace) -> SolveOptions:
    """How the problem flags say to solve the placement."""
    return SolveOptions(
        objective=args.objective,
        stages=args.stages,
        solver=args.solver,
        time_limit_s=args.time_limit,
        bound_time_limit_s=args.bound_time_limit,
        seed=args.seed,
    )


def tuning_budget(args: argparse.Namespace):
    """The ``TuningBudget`` of ``--tune`` and ``--tune-minutes`` (None without either)."""
    if not (args.tune or args.tune_minutes):
        return None
    from ..profiling.tuning import TuningBudget  # TVM enters here, and only to tune

    return TuningBudget(args.tune, args.tune_minutes)


def flag_dest(flag: str) -> str:
    """The ``args`` attribute argparse gives a flag: ``--time-limit`` -> ``time_limit``."""
    return flag.lstrip("-").replace("-", "_")


def shape_binding(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not NAME=VALUE with a positive integer VALUE")
    return name, int(value)


def seconds(text: str, allow_zero: bool, unit: str = " of seconds") -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not (value >= 0 if allow_zero else value > 0) or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a {'non-negative' if allow_zero else 'positive'} number{unit}")
    return value


def png_path(text: str) -> str:
    """A picture's path as it will be written: matplotlib adds .png to a name without a suffix."""
    if not text or os.path.splitext(text)[1] or os.path.isdir(text):
        return text  # a folder is refused by name when outputs are checked
    return text + ".png"


def tolerance(text: str) -> float:
    return seconds(text, allow_zero=True, unit="")


def positive_float(text: str) -> float:
    return seconds(text, allow_zero=False)


def non_negative_float(text: str) -> float:
    return seconds(text, allow_zero=True)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def at_least_two(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError("must be at least 2: a stream's period is timed between its outputs")
    return value
