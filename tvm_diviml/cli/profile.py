"""``diviml profile``: every kernel timed on the platform's present devices, and how far to trust it."""

from __future__ import annotations

import argparse

from .arguments import load_options, model_arguments, tuning_arguments
from .output import print_warnings, write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model_arguments(parser)
    parser.add_argument(
        "--platform", help="a preset, local (this machine, detected) or platform .json (default cpu2, this machine)"
    )
    tuning_arguments(parser, "apply an existing MetaSchedule database (its work_dir)")
    parser.add_argument(
        "--json", metavar="PATH", help="write the per-kernel rows and the per-class FLOP/s (kernels, classes) as JSON"
    )
    parser.add_argument(
        "--export", metavar="PATH", help="write all costs (kernels and links) as a cost table that --cost PATH reads"
    )


def run(args: argparse.Namespace) -> int:
    from ..app.profile import profile_report  # TVM enters here: the flags parse, and --help answers, without it

    report = profile_report(args.model, args.platform, load=load_options(args))
    print(report.text)
    print_warnings(report.warnings)
    if args.json:
        write_json(report.to_json(), args.json)
    if args.export:
        print(report.export(args.export))
    return 0
