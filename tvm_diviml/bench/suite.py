"""What a benchmark suite declares: its name, a one-line description and the options it takes.

``diviml bench`` builds its flags from these declarations, so a suite's options are listed once, here
beside its function, and the command line refuses a flag the chosen suite does not take.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

Row = dict


@dataclass(frozen=True)
class Option:
    """One keyword argument of a suite function. ``flag`` names it on the command line (several suites
    may share one flag, each with its own default); None keeps it for Python callers only."""

    name: str
    type: type
    default: Any
    help: str
    flag: str | None = None
    metavar: str | None = None


@dataclass(frozen=True)
class Suite:
    """A benchmark suite: ``run(**options)`` yields its rows. ``runner`` names its function as
    ``module:function`` in ``tvm_diviml.bench``: the module is imported when the suite runs."""

    name: str
    description: str
    runner: str
    options: tuple[Option, ...] = ()

    @property
    def run(self) -> Callable[..., Iterator[Row]]:
        """The suite's function, its module imported now (TVM and torch with some)."""
        module, function = self.runner.split(":")
        return getattr(importlib.import_module(f".{module}", __package__), function)

    def flag_options(self) -> dict[str, Option]:
        """The options this suite takes on the command line, by flag."""
        return {option.flag: option for option in self.options if option.flag}


QUICK = Option("quick", bool, False, "only a few small rows", flag="--quick")


def time_limit(default: float, help: str = "solver time limit in seconds") -> Option:
    """The ``--time-limit`` option, whose default each suite sets for its own solves."""
    return Option("time_limit_s", float, default, help, flag="--time-limit", metavar="S")


def offers_by_flag(suites: Iterable[Suite]) -> dict[str, list[tuple[Suite, Option]]]:
    """Every command-line flag of the suites, in the order first declared, with each suite that takes it."""
    offers: dict[str, list[tuple[Suite, Option]]] = {}
    for suite in suites:
        for flag, option in suite.flag_options().items():
            offers.setdefault(flag, []).append((suite, option))
    return offers
