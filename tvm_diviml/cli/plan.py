"""``diviml plan``: place a model's kernels; the plan, its value, the lower bound and the gap."""

from __future__ import annotations

import argparse
import sys

from ..app.dataparallel import batch_split_workloads, format_batch_splits, solve_batch_splits
from ..app.job import solve_workload
from ..app.report import format_row
from ..app.workload import load_workload
from ..gantt import draw_schedule
from ..presets import preset_names
from .arguments import (
    batch_split_argument,
    load_options,
    model_arguments,
    png_path,
    problem_arguments,
    solve_options,
    tuning_arguments,
)
from .output import ProgressLines, write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model_arguments(parser)
    problem_arguments(
        parser,
        platform=None,
        platform_help=f"a preset ({', '.join(preset_names())}) or a platform "
        ".json (default paper-node; msr-fiddle files bring their own)",
        objective=None,
        objective_help="default latency; throughput (their max-load problem) for msr-fiddle files",
        time_limit=60.0,
        bound_time_limit=10.0,
    )
    batch_split_argument(parser)
    parser.add_argument(
        "--cost",
        help="roofline (default), measured (time the kernels with TVM on the devices "
        "present, roofline for the rest), or a cost table .json (msr-fiddle files bring their own)",
    )
    tuning_arguments(parser, "apply an existing MetaSchedule database (its work_dir)")
    parser.add_argument("--json", metavar="PATH", help="write the plan row as JSON to PATH, or - for stdout")
    parser.add_argument(
        "--gantt",
        metavar="PATH",
        type=png_path,
        help="draw the plan's schedule (or its loads) as a PNG to PATH (.png added where it names no format)",
    )


def run(args: argparse.Namespace) -> int:
    load = load_options(args)
    if args.batch_split > 1:
        workloads = batch_split_workloads(args.model, args.platform, args.cost, args.batch_split, **load.keywords())
        plan, sim, row, problem = solve_batch_splits(
            workloads, args.solver, args.objective, stages=args.stages, time_limit_s=args.time_limit, seed=args.seed
        )
    else:
        workload = load_workload(args.model, args.platform, args.cost, **load.keywords())
        solved, row, problem = solve_workload(
            workload, solve_options(args), listener=ProgressLines(), interrupt_keeps_best=True
        )
        plan, sim = solved.plan, solved.simulation
    if args.json != "-":
        print(format_row(row, problem.platform.device_names))
        if "batch_splits_tried" in row:
            print(format_batch_splits(row))
    if args.json:
        write_json(row, args.json)
        if args.json != "-":
            print(f"\nplan written to {args.json}")
    if args.gantt:
        draw_schedule(problem.graph, problem.platform, problem.costs, plan, sim, args.gantt)
        print(f"schedule drawn to {args.gantt}", file=sys.stderr if args.json == "-" else sys.stdout)
    return 0 if row["feasible"] else 1
