"""The ``diviml`` command line. Bad input: one line naming what is wrong, exit status 2."""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from typing import Any

from . import __version__
from .errors import DivimlInputError
from .plan import OBJECTIVES
from .platform import PRESETS, get_platform, preset_names
from .report import format_row, format_seconds, solve_and_report
from .solvers import SOLVERS, Problem
from .workload import GENERATORS, load_workload

log = logging.getLogger("tvm_diviml")


def _json_safe(value: Any) -> Any:
    """JSON has no infinity: write it as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, tuple) else "->".join(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_json(data: Any, destination: str) -> None:
    text = json.dumps(_json_safe(data), indent=1)
    if destination == "-":
        print(text)
    else:
        try:
            with open(destination, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
        except OSError as error:
            raise DivimlInputError(f"cannot write: {error.strerror}", source=destination,
                                   hint="check that the folder exists and is writable") from None


# ---------------------------------------------------------------------- commands
def cmd_platforms(args: argparse.Namespace) -> int:
    if args.json:
        write_json(get_platform(args.json).to_json(), "-")
        return 0
    for name, make in PRESETS.items():
        platform = make()
        devices = ", ".join(f"{d.name} ({d.device})" for d in platform.devices)
        print(f"{name:<12} {platform.description}\n{'':<12} devices: {devices}")
    print(f"{'gpuK':<12} K identical H100-class GPUs on NVLink-class links (e.g. gpu4, gpu16)")
    print("\nOr a platform .json file; `diviml platforms --json NAME` prints a preset in that format.")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    workload = load_workload(args.model, args.platform, args.cost)
    objective = args.objective or workload.default_objective
    problem = Problem(workload.graph, workload.platform, workload.costs, objective=objective, stages=args.stages)
    if objective == "pipeline" and args.stages is None:
        problem.stages = len(workload.platform.devices)
    _, _, row = solve_and_report(problem, args.solver, workload.model, workload.cost_source,
                                 time_limit_s=args.time_limit, seed=args.seed)
    if args.json != "-":
        print(format_row(row, workload.platform.device_names))
    if args.json:
        write_json(row, args.json)
        if args.json != "-":
            print(f"\nplan written to {args.json}")
    return 0 if row["feasible"] else 1


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job on built-in inputs; it grows as the project does (never canned output)."""
    print("tvm-diviml demo: a branchy model (a stem, four parallel branches, a concat) placed on\n"
          "paper-node (a CPU and two different GPUs) with roofline costs, for each objective.\n")
    for objective in OBJECTIVES:
        workload = load_workload("branchy:branches=4,depth=3", "paper-node", "roofline")
        problem = Problem(workload.graph, workload.platform, workload.costs, objective=objective,
                          stages=len(workload.platform.devices))
        _, _, row = solve_and_report(problem, "fastest_single_device", workload.model, workload.cost_source)
        print(f"== {objective} ==")
        print(format_row(row, workload.platform.device_names))
        print()
    cpu = get_platform("paper-node").device("cpu")
    print(f"Note: the CPU is priced at {cpu.efficiency:.1%} of its datasheet peak ({cpu.peak_flops / 1e12:.2f} "
          f"TFLOP/s -> {format_seconds(1e9 / cpu.effective_flops)} per GFLOP), because TVM 0.27 leaves CPU "
          "kernels unscheduled.")
    return 0


# ---------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diviml", description="Place a model's kernels across heterogeneous "
                                     "devices, with lower bounds that say how close to optimal the placement is.")
    parser.add_argument("--version", action="version", version=f"tvm-diviml {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="the main job on built-in defaults")
    demo.set_defaults(run=cmd_demo)

    platforms = commands.add_parser("platforms", help="list the platform presets")
    platforms.add_argument("--json", metavar="NAME", help="print one preset (or platform file) as JSON")
    platforms.set_defaults(run=cmd_platforms)

    plan = commands.add_parser("plan", help="place a model's kernels and report value, bound and gap")
    plan.add_argument("model", metavar="MODEL",
                      help=f"an OpGraph .json, an msr-fiddle .json, or a generator ({', '.join(GENERATORS)}) "
                      "with options, e.g. random:kernels=20,seed=1")
    plan.add_argument("--platform", help=f"a preset ({', '.join(preset_names())}) or a platform .json "
                      "(default paper-node; msr-fiddle files bring their own)")
    plan.add_argument("--objective", choices=OBJECTIVES,
                      help="default latency; throughput (their max-load problem) for msr-fiddle files")
    plan.add_argument("--stages", type=_positive_int, help="pipeline: the most stages (default: one per device)")
    plan.add_argument("--solver", choices=sorted(SOLVERS), default="fastest_single_device")
    plan.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="solver time limit in seconds")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--cost", help="roofline (default) or a cost table .json (msr-fiddle files bring their own)")
    plan.add_argument("--json", metavar="PATH", help="write the plan row as JSON to PATH, or - for stdout")
    plan.set_defaults(run=cmd_plan)
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except DivimlInputError as error:
        if args.debug:
            raise
        print(f"diviml: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("diviml: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
