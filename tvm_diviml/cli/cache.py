"""``diviml cache``: the persistent profile cache and tuning databases, described or emptied."""

from __future__ import annotations

import argparse
import os
import shutil

from ..errors import DivimlInputError
from ..profiling.cache import ProfileCache, tuning_cache_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["info", "clear"])


def run(args: argparse.Namespace) -> int:
    """``info``: the profile cache's rows and the tuning databases; ``clear``: empty both (a damaged tuning
    database is removed with the rest)."""
    tuning = tuning_cache_dir()
    databases = sorted(os.listdir(tuning)) if os.path.isdir(tuning) else []
    with ProfileCache() as cache:
        if args.action == "clear":
            print(f"removed {cache.clear()} entries from {cache.path}")
            try:
                if databases:
                    shutil.rmtree(tuning)
            except OSError as error:
                raise DivimlInputError(f"cannot remove: {error}", source=tuning, hint="remove it by hand") from None
            print(f"removed {len(databases)} tuning database(s) from {tuning}")
        else:
            for key, value in cache.stats().items():
                print(f"{key}: {value}")
            print(f"tuning databases: {len(databases)} in {tuning}")
    return 0
