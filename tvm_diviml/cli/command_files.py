"""Every file a command will read and write, from its flags, so that ``app.files.check_files`` refuses a
missing input or an unwritable output before any work starts."""

from __future__ import annotations

import argparse
import os

from ..app.export import export_writes
from ..app.files import Read, Written
from ..app.workload import is_model_file, platform_files
from ..presets import get_platform
from ..profiling.cache import FILE_NAME, default_cache_dir
from ..servers import server_devices


def command_files(args: argparse.Namespace) -> tuple[list[Read], list[Written]]:
    """What the command will read (MODEL, platform, cost and tuning files, the profile cache) and write
    (every output option, with the files an export writes beside its library)."""
    reads = [Read(args.model, "MODEL")] if is_model_file(getattr(args, "model", "")) else []
    reads += [Read(path, "--platform") for path in platform_files(getattr(args, "platform", None))]
    cost = getattr(args, "cost", None)
    if cost not in (None, "roofline", "measured"):
        reads.append(Read(cost, "--cost"))
    if getattr(args, "tuning_db", None):
        reads.append(Read(args.tuning_db, "--tuning-db", folder=True))
    if getattr(args, "input", None):
        reads.append(Read(args.input, "--input"))
    if args.command in ("run", "profile") or cost == "measured":
        reads.append(Read(os.path.join(default_cache_dir(), FILE_NAME), "the profile cache"))
    writes = [
        Written(getattr(args, flag), f"--{flag}")
        for flag in ("json", "gantt", "markdown")
        if getattr(args, flag, None) and getattr(args, flag) != "-" and args.command != "platforms"  # NAME there
    ]
    if args.command == "platforms" and args.output:
        writes.append(Written(args.output, "--output"))
        reads += [Read(path, "--json") for path in platform_files(args.json)]
    export = getattr(args, "export", None)
    if export and args.command == "run":
        writes += export_writes(export, server_devices(get_platform(args.platform)) if args.rpc else None)
    elif export:
        writes.append(Written(export, "--export"))
    return reads, writes
