"""The ``diviml`` command line: the top parser and the dispatch to one module per command.

Each command's module (``tvm_diviml.cli.NAME``, named in ``COMMANDS``) adds its flags
(``add_arguments(parser)``) and runs the command (``run(args)``: the exit status); it parses and
prints, and leaves the job to ``tvm_diviml.app``. Only the module of the command given is imported,
so that ``diviml`` starts at once and ``diviml --help`` lists every command without loading any.
Bad input: one line naming what is wrong, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import threading
from dataclasses import dataclass
from types import ModuleType

from .. import __version__
from ..app.files import check_files
from ..errors import (
    DivimlInputError,
    ServerFailure,
    answer_interrupts,
    forget_interrupt,
    interrupted,
    raise_if_interrupted,
)
from ..stderr_filter import unactionable_warnings_filtered
from .command_files import command_files
from .output import report_on_stderr_beside_json


@dataclass(frozen=True)
class Command:
    """A command: its module under ``tvm_diviml.cli`` and the line ``diviml --help`` gives it."""

    module: str
    help: str


# In the order `diviml --help` lists them.
COMMANDS = {
    "demo": Command("demo", "the main job on built-in defaults"),
    "platforms": Command("platforms", "list the platform presets, or describe this machine"),
    "models": Command("models", "list the model zoo and the synthetic generators"),
    "graph": Command("graph", "extract a model's kernel graph: a summary, or the OpGraph JSON"),
    "plan": Command("plan", "place a model's kernels and report value, bound and gap"),
    "run": Command("run", "plan, build and execute on this machine's devices; measured vs predicted"),
    "profile": Command("profile", "time every kernel on the platform's present devices"),
    "cache": Command("cache", "the persistent profile cache: info, or clear it"),
    "bench": Command("bench", "run a benchmark suite and print (or write) its rows"),
}


def command_module(name: str) -> ModuleType:
    """The module of command ``name``, imported the first time it is asked for."""
    return importlib.import_module(f".{COMMANDS[name].module}", __name__)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top parser, every command listed; only ``command``'s module is loaded, to add its flags."""
    parser = argparse.ArgumentParser(
        prog="diviml",
        description="Place a model's kernels across heterogeneous "
        "devices, with lower bounds that say how close to optimal the placement is.",
    )
    parser.add_argument("--version", action="version", version=f"tvm-diviml {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, entry in COMMANDS.items():
        subparser = commands.add_parser(name, help=entry.help)
        if name == command:
            command_module(name).add_arguments(subparser)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed with the flags of the command it names: its first word that is not an option (the
    top parser's own options take no value)."""
    named = next((word for word in argv if not word.startswith("-")), None)
    args = build_parser(named if named in COMMANDS else None).parse_args(argv)
    if getattr(args, "shape", None) is not None:
        args.shape = dict(args.shape)
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)  # loads the command's module: seconds for TVM's
    except KeyboardInterrupt:
        return _interrupted_exit()
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    # SIGTERM and SIGHUP unwind like Ctrl-C, so that subprocesses (CP-SAT, RPC servers) are stopped on the way
    # out; each is remembered, so that one TVM turned into another error still ends the command (exit 130)
    forget_interrupt()
    answer_interrupts()
    try:
        check_files(*command_files(args))
        with report_on_stderr_beside_json(args):
            code = command_module(args.command).run(args)
        raise_if_interrupted()
        return code
    except KeyboardInterrupt:
        return _interrupted_exit()
    except BrokenPipeError:  # output piped into head or a closed pager: not an error
        sys.stdout = open(os.devnull, "w")
        return 0
    except (DivimlInputError, ServerFailure) as error:  # with --rpc, the other servers were released on the way out
        if interrupted():
            return _interrupted_exit()
        if args.debug:
            raise
        print(f"diviml: error: {error}", file=sys.stderr)
        return 2 if isinstance(error, DivimlInputError) else 3
    except Exception:  # an interrupt that TVM turned into its own error on the way up (a pass's callback)
        if not interrupted():
            raise
        return _interrupted_exit()


def _interrupted_exit() -> int:
    print("diviml: interrupted", file=sys.stderr)
    return 130


def entry() -> None:
    """The ``diviml`` command. A thread left inside a TVM call (an upload cut short by Ctrl-C, a server
    that stopped answering) aborts the interpreter's shutdown when it returns ("terminate called without
    an active exception"). With any thread but this one left (alive or not: a join cut short by Ctrl-C
    marks a running thread stopped), everything is already cleaned up: exit at once. So too after an
    interrupt: one that arrived while an import ran C code (TVM's, torch's) leaves CPython's "unhandled
    KeyboardInterrupt" mark set, and its own exit then kills the process with SIGINT (exit -2, not 130)."""
    with unactionable_warnings_filtered(enabled="--debug" not in sys.argv[1:]):
        code = main()
    if code == 130 or threading.active_count() > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
