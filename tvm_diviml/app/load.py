"""A model that TVM builds, in one call: a zoo name with options, a model file (.onnx, or a .pt2 program
saved with ``torch.export.save``) or a model object, built and extracted to an OpGraph."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.modelspec import parse_model_spec
from tvm_diviml.zoo import BuiltModel, build_model

from ..frontends import SUFFIXES
from ..frontends import load as load_file
from ..passes.extract import Extraction, extract

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    built: BuiltModel
    extraction: Extraction
    extract_s: float


def load_model(
    model: Any,
    options: dict[str, Any] | None = None,
    *,
    shapes: dict[str, int] | None = None,
    fused: bool = True,
    path: str | None = None,
    **import_options: Any,
) -> LoadedModel:
    """Build or import ``model``, then extract its kernel graph (``fused``: one node per fused kernel, else
    per operator). ``model``: a zoo name, with ``options`` or as a MODEL string (``resnet18:resolution=64``;
    ``options`` add to those), a model file (.onnx, .pt2; or at ``path``) whose symbolic dimensions
    ``shapes`` binds, or an object: a Relax IRModule (``import_options``: ``entry``, ``params``, ``name``)
    or a torch ``ExportedProgram`` (``name``)."""
    began = time.perf_counter()
    if path is not None or not isinstance(model, str) or model.endswith(SUFFIXES):
        built = load_file(path or model, shapes, **import_options)
    else:
        built = _zoo_model(model, options, shapes)
    extraction = extract(built.mod, built.entry, fused=fused, name=built.name)
    elapsed = time.perf_counter() - began
    log.info("%s: %d kernels extracted in %.2f s", built.name, len(extraction.graph), elapsed)
    return LoadedModel(built, extraction, elapsed)


def _zoo_model(spec: str, options: dict[str, Any] | None, shapes: dict[str, int] | None) -> BuiltModel:
    name, given = parse_model_spec(spec)
    if shapes:
        raise DivimlInputError(
            "--shape applies to imported models; zoo models take options",
            field="--shape",
            hint=f"e.g. {name}:batch=2",
        )
    return build_model(name, {**given, **(options or {})})
