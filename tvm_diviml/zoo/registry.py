"""The zoo's registry: a builder per model name, registered with ``@register`` where it is defined.

A builder is ``f(**options) -> (nn.Module, {input name: (shape, dtype)})``; its keyword arguments with
defaults are the model's options.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Builder = Callable[..., tuple[Any, dict[str, tuple[tuple[int, ...], str]]]]


@dataclass(frozen=True)
class ZooEntry:
    name: str
    description: str
    builder: Builder

    def defaults(self) -> dict[str, Any]:
        return {
            p.name: p.default
            for p in inspect.signature(self.builder).parameters.values()
            if p.default is not inspect.Parameter.empty
        }


ZOO: dict[str, ZooEntry] = {}


def register(name: str, description: str) -> Callable[[Builder], Builder]:
    def wrap(builder: Builder) -> Builder:
        ZOO[name] = ZooEntry(name, description, builder)
        return builder

    return wrap
