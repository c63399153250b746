"""``diviml run``: plan, build and execute on this machine's devices (or across RPC servers); the outputs
checked and the time measured against the prediction and every single-device configuration."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..app.export import export_run
from ..app.reference import FRAMEWORKS
from ..app.report import format_row
from .arguments import (
    at_least_two,
    batch_split_argument,
    load_options,
    model_arguments,
    non_negative_int,
    positive_float,
    positive_int,
    problem_arguments,
    solve_options,
    tolerance,
    tuning_arguments,
)
from .output import ProgressLines, print_warnings, write_json

if TYPE_CHECKING:
    from ..app.run import Planned


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model_arguments(parser)
    problem_arguments(
        parser,
        platform="cpu2",
        platform_help="a preset, local (this machine, detected) or platform .json whose devices this machine "
        "has (default cpu2: this CPU as two single-thread devices)",
        objective="latency",
        objective_help="default latency",
        time_limit=30.0,
        bound_time_limit=0.0,
    )
    parser.add_argument(
        "--cost", default="measured", help="measured (default: time the kernels here), roofline, or a cost table .json"
    )
    batch_split_argument(parser)
    tuning_arguments(parser, "build and price with an existing MetaSchedule database (its work_dir)")
    _timing_arguments(parser)
    _check_arguments(parser)
    _output_arguments(parser)


def _timing_arguments(parser: argparse.ArgumentParser) -> None:
    """How the build is timed: inferences, a stream and its inputs in flight, candidates side by side."""
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=10,
        help="timed inferences (latency; default 10, more until they took 0.25 s)",
    )
    parser.add_argument(
        "--inputs",
        type=at_least_two,
        default=16,
        help="inputs streamed (throughput and pipeline; default 16; the period is timed from "
        "the first output to the last)",
    )
    parser.add_argument(
        "--in-flight",
        type=positive_int,
        metavar="N",
        help="inputs in flight when streaming (default: as many as the stream's price asks, reported; a "
        "one-device build runs one at a time)",
    )
    parser.add_argument(
        "--candidates",
        type=non_negative_int,
        default=1,
        metavar="N",
        help="build and time the N best distinct plans by prediction, the best single-device plan "
        "and every single-device configuration (the whole CPU on all its cores too: intra-operator "
        "against model parallelism), side by side, and keep the fastest measured (default 1: the "
        "plan and the configurations; 0: run the plan as planned)",
    )


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    """What the outputs are held to, and on which inputs."""
    parser.add_argument(
        "--rtol",
        type=tolerance,
        help="largest difference from the single-device build (and the --reference framework), relative to "
        "each output's largest magnitude, that counts as equal (default: by the output's dtype, 1e-4 for float32 "
        "and float64, 10 ulps for coarser floats: float16 9.8e-3, bfloat16 7.8e-2; integers exact); NaN and "
        "infinities must fall where the reference has them; exit status 1 beyond it",
    )
    parser.add_argument(
        "--input",
        metavar="FILE",
        help="run (and check) on these inputs instead of random ones: a .npy for a model of one input, or an "
        ".npz of arrays by input name (numpy.savez); shapes and dtypes must be the model's",
    )
    parser.add_argument(
        "--reference",
        choices=sorted(FRAMEWORKS),
        help="also run MODEL in its own framework on the same inputs (torch for a .pt2 program, onnxruntime for "
        "an .onnx file) and hold the build's outputs to it, output by output, at --rtol; exit status 1 beyond it",
    )


def _output_arguments(parser: argparse.ArgumentParser) -> None:
    """Where it runs (here, or across RPC servers) and what it writes."""
    parser.add_argument(
        "--rpc",
        metavar="HOST:PORT,...",
        help="run over TVM RPC: one server address per server of "
        "the platform (e.g. --platform servers:2xcpu1), in order, or 'local' to start them on the "
        "loopback; a server is `python -m tvm_diviml.runtime.rpc_servers --host H --port P`",
    )
    parser.add_argument(
        "--rpc-timeout",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="with --rpc: seconds without progress before a server counts as hung (default 60)",
    )
    parser.add_argument(
        "--export",
        metavar="DIR",
        help="also export the kept build as a folder that tvm_diviml.load(DIR) runs anywhere with these "
        "devices: the library (one per replica or copy), its placement, the weights, the inputs' and "
        "outputs' signature and manifest.json (see docs/deploy.md); with --rpc, one library per server "
        "and servers.json besides; a PATH ending in .so writes the library and PATH.placement.json alone",
    )
    parser.add_argument("--json", metavar="PATH", help="write the plan row with its 'run' measurements as JSON")


def run(args: argparse.Namespace) -> int:
    """The run's plan as soon as it is solved, then its report; exit status 1 where the outputs differ
    from the single-device build or the framework beyond ``--rtol``."""
    from ..app import rpc_run  # TVM enters here: the flags parse, and --help answers, without it
    from ..app import run as run_job  # (TVM, as above)

    job = dict(
        load=load_options(args),
        solve=solve_options(args),
        options=run_job.RunOptions(
            repeats=args.repeats,
            stream_inputs=args.inputs,
            in_flight=args.in_flight,
            candidates=args.candidates,
            rtol=args.rtol,
            reference=args.reference,
            batch_split=args.batch_split,
        ),
        listener=ProgressLines(),
        on_planned=print_planned,
    )
    if args.rpc:
        report = rpc_run.run_rpc(args.model, args.platform, args.rpc, args.cost, timeout_s=args.rpc_timeout, **job)
    else:
        report = run_job.run_model(args.model, args.platform, args.cost, **job)
    print(report.text)
    if args.export:
        print(export_run(args.export, report.built, report.model, report.measured, report.weights))
    if args.json:
        write_json(report.row, args.json)
    return 0 if report.passed else 1


def print_planned(planned: Planned) -> None:
    print(format_row(planned.row, planned.problem.platform.device_names))
    for note in planned.notes:
        print(note)
    print_warnings(planned.warnings)
    print()
