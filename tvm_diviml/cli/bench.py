"""``diviml bench``: one benchmark suite run, its rows printed as they come (and written as JSON or
Markdown). Its flags are every flag a suite declares (``tvm_diviml.bench.SUITES``)."""

from __future__ import annotations

import argparse

from ..bench import SUITES, offers_by_flag
from ..bench.common import row_line, write_markdown
from ..errors import DivimlInputError
from .arguments import flag_dest, positive_float, positive_int
from .output import write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The output files, then every flag a suite declares, unset by default so that each suite's own
    default applies."""
    listing = "\n".join(f"  {name:<11} {suite.description}" for name, suite in SUITES.items())
    parser.epilog = f"suites:\n{listing}"
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--suite",
        choices=sorted(SUITES),
        default="simulator",
        help="the suite to run (default simulator; see the list below)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the rows as a JSON list")
    parser.add_argument("--markdown", metavar="PATH", help="write the rows as a Markdown table")
    for flag, offers in offers_by_flag(SUITES.values()).items():
        option = offers[0][1]
        takers = ", ".join(suite.name for suite, _ in offers)
        if option.type is bool:
            parser.add_argument(
                flag, dest=flag_dest(flag), action="store_true", default=None, help=f"{option.help} (suites {takers})"
            )
            continue
        defaults = ", ".join(f"{suite.name} {_shown(taken.default)}" for suite, taken in offers)
        parser.add_argument(
            flag,
            dest=flag_dest(flag),
            type=_flag_type(option.type),
            metavar=option.metavar,
            help=f"{option.help} (default per suite: {defaults})",
        )


def _shown(default) -> str:
    return f"{default:g}" if isinstance(default, int | float) else str(default or "none")


def _flag_type(kind: type):
    """How a suite option's value is read from the command line: every number a suite takes there is
    positive (time limits, counts)."""
    return {float: positive_float, int: positive_int, str: str}[kind]


def run(args: argparse.Namespace) -> int:
    suite = SUITES[args.suite]
    offers = offers_by_flag(SUITES.values())
    given = {flag: getattr(args, flag_dest(flag)) for flag in offers}
    given = {flag: value for flag, value in given.items() if value is not None}
    taken = suite.flag_options()
    refused = [flag for flag in given if flag not in taken]
    if refused:
        takers = [taker.name for taker, _ in offers[refused[0]]]
        raise DivimlInputError(
            f"suite '{suite.name}' takes no {' or '.join(refused)}",
            field="--suite",
            hint=f"drop the option; {refused[0]} applies to suite {' or '.join(takers)}",
        )
    rows = []
    for row in suite.run(**{taken[flag].name: value for flag, value in given.items()}):
        rows.append(row)
        print(row_line(row), flush=True)
    if args.json:
        write_json(rows, args.json)
    if args.markdown:
        write_markdown(rows, args.markdown)
    return 0
