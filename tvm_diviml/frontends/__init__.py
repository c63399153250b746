"""Model importers: a model file or object into a Relax module with its weights (a ``BuiltModel``).

One catalog, keyed by file suffix, says which importer reads which file; ``load`` takes a path or an
object (an IRModule, a ``torch.export.ExportedProgram``). Reading the catalog imports no TVM: the
importer's module is loaded when a model is.

  ``importers``       ONNX, torch.export programs and a user's Relax module, checked and rewritten
  ``rewrites``        operators TVM imports but cannot compile, rewritten where a sound rewrite exists
  ``program_checks``  refusals of training programs and graphs that are not inference
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from ..errors import DivimlInputError


@dataclass(frozen=True)
class Frontend:
    """An importer of one kind of model file: ``function`` of ``module`` (in this package), called as
    ``function(path, shapes)``; ``extra`` is the pip extra that installs what it needs."""

    suffix: str
    module: str
    function: str
    extra: str
    describe: str

    def importer(self):
        return getattr(importlib.import_module(f".{self.module}", __name__), self.function)


FRONTENDS: dict[str, Frontend] = {
    frontend.suffix: frontend
    for frontend in (
        Frontend(".onnx", "importers", "load_onnx", "onnx", "an ONNX model"),
        Frontend(".pt2", "importers", "load_torch_program", "torch", "a program saved with torch.export.save"),
    )
}
SUFFIXES = tuple(FRONTENDS)


def frontend_of(path: str) -> Frontend:
    """The importer of ``path``, by its suffix; refused naming the suffixes there are."""
    for suffix, frontend in FRONTENDS.items():
        if path.endswith(suffix):
            return frontend
    raise DivimlInputError(
        "no importer reads this file",
        source=path,
        hint="give " + ", ".join(f"{f.describe} ({suffix})" for suffix, f in FRONTENDS.items()),
    )


def load(model: Any, shapes: dict[str, int] | None = None, **options):
    """A model as a ``BuiltModel``: a file path (by suffix), a Relax IRModule (``options``:
    ``entry``, ``params``, ``name``) or a torch ``ExportedProgram`` (``options``: ``name``)."""
    if isinstance(model, str):
        return frontend_of(model).importer()(model, shapes)
    importers = importlib.import_module(".importers", __name__)
    if type(model).__name__ == "ExportedProgram":
        return importers.from_torch_export(model, shapes, **options)
    if type(model).__name__ == "IRModule":
        return importers.from_relax(model, shapes=shapes, **options)
    raise DivimlInputError(
        f"cannot import a {type(model).__name__}",
        field="model",
        hint="give a model file (" + ", ".join(SUFFIXES) + "), a Relax IRModule or a torch.export ExportedProgram",
    )
