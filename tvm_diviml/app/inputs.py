"""A model's inputs from the user's own file (``diviml run --input``): a ``.npy`` for a model of one input,
an ``.npz`` of arrays by input name. Random inputs can hide what real data shows (a range a kernel
mishandles, a NaN), so a run and its checks can take the data the model is meant for.

The file is data, never code: arrays of Python objects (pickles) are refused. Every array must have its
input's shape and dtype exactly; a silent cast or broadcast would check another input than the one given.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
from dataclasses import dataclass

import numpy as np

from ..errors import DivimlInputError, first_line
from ..host_memory import available_memory_bytes
from ..jsonio import check_regular_file
from ..zoo import BuiltModel

ARRAY_SUFFIXES = (".npy", ".npz")
MAX_INPUT_BYTES = 1 << 40  # where the machine does not say how much memory it has free
FIELD = "--input"


@dataclass(frozen=True)
class InputFile:
    """The arrays of an ``--input`` file: by name (``.npz``), or the one array of a ``.npy`` (name None)."""

    path: str
    arrays: dict[str | None, np.ndarray]

    def fed_to(self, model: BuiltModel, framework_names: list[str] | None = None) -> BuiltModel:
        """``model`` with these arrays as its inputs, each matched to its input by name (ours, or the
        framework's own at the same place: TVM renames ONNX's ``input.1`` to ``input_1``)."""
        if None in self.arrays:
            if len(model.inputs) != 1:
                raise self._error(
                    f"a .npy file holds one array, and the model has {len(model.inputs)} inputs "
                    f"({_listing(model.inputs)})",
                    "save them by name in an .npz: numpy.savez(path, **{name: array})",
                )
            arrays = [self._checked(model.inputs[0], self.arrays[None], model)]
        else:
            framework_names = framework_names or [name for name, _, _ in model.inputs]
            arrays, used = [], set()
            for expected, other in zip(model.inputs, framework_names, strict=True):
                key = next((k for k in (expected[0], other) if k in self.arrays), None)
                if key is None:
                    raise self._error(
                        f"no array for input '{expected[0]}'"
                        + (f" ('{other}' in the model file)" if other != expected[0] else "")
                        + f" ({expected[2]} {tuple(expected[1])})",
                        f"the model's inputs: {_listing(model.inputs)}",
                    )
                used.add(key)
                arrays.append(self._checked(expected, self.arrays[key], model))
            extra = sorted(set(self.arrays) - used)
            if extra:
                raise self._error(
                    f"array '{extra[0]}' is no input of the model", f"the model's inputs: {_listing(model.inputs)}"
                )
        return dataclasses.replace(model, given_inputs=arrays)

    def _checked(self, expected: tuple[str, tuple[int, ...], str], array: np.ndarray, model: BuiltModel):
        name, shape, dtype = expected
        if array.shape != tuple(shape):
            raise self._error(
                f"input '{name}' has shape {array.shape}, the model expects {tuple(shape)} ({dtype})",
                "give an array of that shape; an imported model's symbolic dimensions are bound with --shape",
            )
        if array.dtype != np.dtype(dtype):
            raise self._error(
                f"input '{name}' is {array.dtype}, the model expects {dtype} {tuple(shape)}",
                f"save it as {dtype}: array.astype('{dtype}')",
            )
        if name in model.input_ranges and array.size:
            low, high = model.input_ranges[name]
            smallest, largest = int(array.min()), int(array.max())
            if smallest < low or largest >= high:
                raise self._error(
                    f"input '{name}' holds {smallest if smallest < low else largest}, outside the "
                    f"[{low}, {high}) of the table it indexes",
                    "a kernel would read outside the table: give indices inside it",
                )
        return array

    def _error(self, message: str, hint: str) -> DivimlInputError:
        return DivimlInputError(message, source=self.path, field=FIELD, hint=hint)


def read_input_file(path: str) -> InputFile:
    """The arrays of ``path`` (.npy or .npz), refused in one line when missing or not such a file."""
    if not path.endswith(ARRAY_SUFFIXES):
        raise DivimlInputError(
            "is neither a .npy nor an .npz file",
            source=path,
            field=FIELD,
            hint="numpy.save(path.npy, array) for a model of one input, numpy.savez(path.npz, name=array) by name",
        )
    if not os.path.exists(path):
        raise DivimlInputError("no such file", source=path, field=FIELD, hint="check the path")
    check_regular_file(path, os.stat(path), int(available_memory_bytes() or MAX_INPUT_BYTES))
    try:
        if path.endswith(".npy"):
            return InputFile(path, {None: np.load(path, allow_pickle=False)})
        with np.load(path, allow_pickle=False) as archive:
            return InputFile(path, {name: archive[name] for name in archive.files})
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:  # numpy's errors for a bad file
        raise DivimlInputError(
            f"not a readable {os.path.splitext(path)[1]} file ({type(error).__name__}: {first_line(error)})",
            source=path,
            field=FIELD,
            hint="write it with numpy.save or numpy.savez (arrays of numbers, no Python objects)",
        ) from None


def _listing(inputs: list[tuple[str, tuple[int, ...], str]]) -> str:
    """The model's inputs as an error names them: ``'x' (float32 (1, 3, 32, 32)), ...``."""
    return ", ".join(f"'{name}' ({dtype} {tuple(shape)})" for name, shape, dtype in inputs)
