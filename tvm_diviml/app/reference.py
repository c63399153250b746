"""The user's own framework as a run's first check (``diviml run --reference torch|onnxruntime``).

A run's other check holds the placed build to TVM's single-device build of the same import, so a mistake
of the importer passes it unseen. Here the model file the user gave is run by its own framework (torch for
a ``.pt2`` program, ONNX Runtime on the CPU for an ``.onnx`` file, both reading their weights from that
file, as the importers did) on the inputs the run used, and the outputs the build returns are held to it,
output by output, with the run's tolerance (``tolerances.compare_outputs``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DivimlInputError, first_line, raise_if_interrupted
from ..tolerances import OutputComparison, compare_outputs
from ..zoo import BuiltModel

log = logging.getLogger(__name__)

FRAMEWORKS = {"torch": ".pt2", "onnxruntime": ".onnx"}  # framework -> the model file it runs
FIELD = "--reference"


def check_reference(framework: str, model: str) -> None:
    """Refuse, before any work, a MODEL that ``framework`` does not run and a framework not installed."""
    suffix = FRAMEWORKS[framework]
    if not model.endswith(suffix):
        owner = next((name for name, other in FRAMEWORKS.items() if model.endswith(other)), None)
        if owner:
            why, use = f"MODEL is an {FRAMEWORKS[owner]} file", f"use --reference {owner} for it"
        elif model.endswith(".json"):
            why, use = "a graph .json holds kernels and no program to run", "give the model's .pt2 or .onnx file"
        elif os.path.sep in model or os.path.exists(model):
            why, use = "MODEL is neither a .pt2 nor an .onnx file", "give the model's .pt2 or .onnx file"
        else:
            why = "a zoo model or generator is written for TVM and has no framework of its own"
            use = "give a .pt2 or .onnx file, or drop --reference: the run still checks the single-device build"
        raise DivimlInputError(f"{framework} runs a {suffix} file; {why}", field=FIELD, hint=use)
    if importlib.util.find_spec(framework) is None:
        raise DivimlInputError(
            f"{framework} is not installed",
            field=FIELD,
            hint=f"pip install 'tvm-diviml[{framework}]'",
        )


def framework_input_names(model_file: str) -> list[str] | None:
    """The model's inputs as its framework names them, in order, where TVM's names may differ: an ONNX
    file's (TVM's importer renames ``input.1`` to ``input_1``); None for other models."""
    if not model_file.endswith(".onnx"):
        return None
    import onnx

    graph = onnx.load(model_file, load_external_data=False).graph
    weights = {initializer.name for initializer in graph.initializer}
    return [graph_input.name for graph_input in graph.input if graph_input.name not in weights]


@dataclass(frozen=True)
class FrameworkRun:
    """What the framework returned: its outputs flattened, each named as the framework names it."""

    framework: str
    model_file: str
    names: list[str]
    outputs: list[np.ndarray]


def run_framework(framework: str, model_file: str, inputs: list[np.ndarray]) -> FrameworkRun:
    """``model_file`` run once by ``framework`` on ``inputs`` (in the model's input order)."""
    began = time.perf_counter()
    try:
        names, outputs = _RUNNERS[framework](model_file, inputs)
    except DivimlInputError:
        raise
    except Exception as error:  # the frameworks raise errors of every type for a model they cannot run
        raise_if_interrupted()
        raise DivimlInputError(
            f"{framework} cannot run it on these inputs: {type(error).__name__}: {first_line(error)}",
            source=model_file,
            field=FIELD,
            hint="drop --reference to run without the framework's check",
        ) from None
    log.info("%s ran %s in %.2f s", framework, model_file, time.perf_counter() - began)
    return FrameworkRun(framework, model_file, names, outputs)


def _run_torch(model_file: str, inputs: list[np.ndarray]) -> tuple[list[str], list[np.ndarray]]:
    """The program's module called on the inputs; its tensors in the order torch.export flattens what it
    returns (and TVM's importer after it), each named by its place (``output``, ``output[0]``)."""
    import torch

    from ..frontends.importers import read_torch_program  # TVM enters here: this module loads with the workload

    module = read_torch_program(model_file).module()
    with torch.no_grad():
        returned = module(*(torch.from_numpy(array) for array in inputs))
    tensors = list(_tensors_in(returned, "output", torch.Tensor))
    return [name for name, _ in tensors], [tensor.numpy() for _, tensor in tensors]


def _tensors_in(value, name: str, tensor_type):
    """(name, tensor) for each tensor in a returned structure, as torch's pytree orders them: tuples and
    lists by position, dicts (a Hugging Face ``ModelOutput`` too) by insertion; other leaves are no output."""
    if isinstance(value, tensor_type):
        yield name, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors_in(item, f"{name}[{key!r}]", tensor_type)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _tensors_in(item, f"{name}[{index}]", tensor_type)


def _run_onnxruntime(model_file: str, inputs: list[np.ndarray]) -> tuple[list[str], list[np.ndarray]]:
    """An ONNX Runtime session on the CPU, fed by the graph's input names; outputs in the graph's order."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: its warnings about unused initializers are not ours
    session = onnxruntime.InferenceSession(model_file, options, providers=["CPUExecutionProvider"])
    feeds = {graph_input.name: array for graph_input, array in zip(session.get_inputs(), inputs, strict=True)}
    outputs = [np.asarray(output) for output in session.run(None, feeds)]
    return [output.name for output in session.get_outputs()], outputs


_RUNNERS = {"torch": _run_torch, "onnxruntime": _run_onnxruntime}


def build_outputs(built, model: BuiltModel) -> list[np.ndarray]:
    """What a build that was run returns on the run's inputs: the outputs its user gets."""
    from ..profiling.timing import open_runner  # TVM enters here: this module loads with the workload

    with open_runner(built, [weight for _, weight in model.params]) as runner:
        return runner(model.sample_inputs())


@dataclass(frozen=True)
class FrameworkCheck:
    """The build's outputs against the framework's. ``mismatch``: why they cannot be paired (a count or a
    shape differs), which fails the check; else ``comparison`` judges them at the run's tolerance."""

    run: FrameworkRun
    input_file: str | None  # None: random inputs (seed 0)
    comparison: OutputComparison | None
    mismatch: str | None = None

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [tuple(output.shape) for output in self.run.outputs]

    def passed(self, rtol: float | None) -> bool:
        return self.comparison is not None and self.comparison.equal(rtol)

    def describe(self, rtol: float | None) -> str:
        """A headline (PASS or FAIL), then a line per output: its differences, tolerance and verdict."""
        on = self.input_file or "random inputs (seed 0)"
        headline = f"outputs against {self.run.framework} ({os.path.basename(self.run.model_file)} on {on}): "
        if self.comparison is None:
            return headline + f"FAIL ({self.mismatch})"
        differences = self.comparison.outputs
        beyond = sum(not difference.equal(rtol) for difference in differences)
        lines = [headline + (f"FAIL ({beyond} of {len(differences)} outputs beyond rtol)" if beyond else "PASS")]
        for name, shape, difference in zip(self.run.names, self.shapes, differences, strict=True):
            unmatched = f", NaN or infinity unmatched at {difference.misplaced} places" if difference.misplaced else ""
            lines.append(
                f"  {name}: {difference.dtype} {shape}, max abs diff {difference.abs_diff:.3g}, max rel diff "
                f"{difference.rel_diff:.3g}{unmatched}, rtol {difference.rtol(rtol):.3g}: "
                + ("pass" if difference.equal(rtol) else "FAIL")
            )
        return "\n".join(lines)

    def to_json(self, rtol: float | None) -> dict[str, Any]:
        """The check as the run's JSON row keeps it (``reference``): no outputs where they could not be paired."""
        paired = self.comparison is not None
        differences = zip(self.run.names, self.shapes, self.comparison.outputs, strict=True) if paired else ()
        return {
            "framework": self.run.framework,
            "model": self.run.model_file,
            "inputs": self.input_file,
            "verdict": "pass" if self.passed(rtol) else "fail",
            "mismatch": self.mismatch,
            "outputs": [
                {
                    "name": name,
                    "dtype": difference.dtype,
                    "shape": list(shape),
                    "max_abs_diff": difference.abs_diff,
                    "max_rel_diff": difference.rel_diff,
                    "nonfinite_unmatched": difference.misplaced,
                    "rtol": difference.rtol(rtol),
                    "verdict": "pass" if difference.equal(rtol) else "fail",
                }
                for name, shape, difference in differences
            ],
        }


def check_against(run: FrameworkRun, ours: list[np.ndarray], input_file: str | None) -> FrameworkCheck:
    """The build's outputs ``ours`` against the framework's, paired in order."""
    if len(ours) != len(run.outputs):
        mismatch = f"{run.framework} returns {len(run.outputs)} outputs, the build {len(ours)}"
        return FrameworkCheck(run, input_file, None, mismatch)
    for name, got, want in zip(run.names, ours, run.outputs, strict=True):
        if got.shape != want.shape:
            mismatch = f"{name} has shape {tuple(got.shape)} from the build, {tuple(want.shape)} from {run.framework}"
            return FrameworkCheck(run, input_file, None, mismatch)
    return FrameworkCheck(run, input_file, compare_outputs(ours, run.outputs))
