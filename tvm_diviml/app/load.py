"""MODEL strings that need TVM: zoo names with options, .onnx files and .pt2 programs
(``torch.export.save``), extracted to an OpGraph."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.zoo import BuiltModel, build_model

from ..frontends import load as load_file
from ..passes.extract import Extraction, extract

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    built: BuiltModel
    extraction: Extraction
    extract_s: float


def load_model(
    name: str, options: dict, *, shapes: dict[str, int] | None = None, fused: bool = True, path: str | None = None
) -> LoadedModel:
    """Build (zoo) or import (ONNX or a torch.export program at ``path``) a model, then extract its
    kernel graph."""
    began = time.perf_counter()
    if path is not None:
        built = load_file(path, shapes)
    else:
        if shapes:
            raise DivimlInputError(
                "--shape applies to imported models; zoo models take options",
                field="--shape",
                hint=f"e.g. {name}:batch=2",
            )
        built = build_model(name, options)
    extraction = extract(built.mod, built.entry, fused=fused, name=built.name)
    elapsed = time.perf_counter() - began
    log.info("%s: %d kernels extracted in %.2f s", built.name, len(extraction.graph), elapsed)
    return LoadedModel(built, extraction, elapsed)
