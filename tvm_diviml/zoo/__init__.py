"""The built-in model zoo, written with ``tvm.relax.frontend.nn``.

A zoo entry is a builder ``f(**options) -> (nn.Module, {input name: (shape, dtype)})`` registered
with ``@register``; its keyword arguments with defaults *are* the model's options (``batch``,
``resolution``, ``seq``, ``layers``, ...), so ``resnet18:resolution=64`` calls the builder with
``resolution=64``. ``build_model`` exports the module to a Relax IRModule (entry function
``forward``, inputs first, then weights as parameters) and draws deterministic weights from a seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DivimlInputError
from ..modelspec import check_counts, format_model_spec
from .registry import ZOO


@dataclass
class BuiltModel:
    """A Relax module, its weights and its inputs: everything needed to extract, build and run it."""

    name: str  # the MODEL string, options included
    mod: Any  # tvm.IRModule
    entry: str  # the Relax function to place ("forward", "main")
    inputs: list[tuple[str, tuple[int, ...], str]]  # (name, shape, dtype), in parameter order
    params: Sequence[tuple[str, np.ndarray]] = field(default_factory=list)  # weights, in parameter order
    origin: str = "a Relax IRModule"  # the importer and the versions it used
    # integer input -> [low, high) of the values it may take (input_ranges.integer_input_ranges);
    # an integer input not named here takes input_ranges.FLAG_RANGE
    input_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    # the user's own inputs (``diviml run --input``), in parameter order: every run and check reads these
    given_inputs: list[np.ndarray] | None = None

    def sample_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """The given inputs where there are some (whatever ``seed``); else deterministic random inputs:
        floats standard normal, integers (token ids, token types, masks) uniform within
        ``input_ranges``, inside every table they index."""
        if self.given_inputs is not None:
            return list(self.given_inputs)
        from .input_ranges import FLAG_RANGE  # keeps TVM out of `import tvm_diviml.zoo` (the workload's names)

        rng = np.random.default_rng(seed)
        out = []
        for name, shape, dtype in self.inputs:
            if np.issubdtype(np.dtype(dtype), np.integer):
                low, high = self.input_ranges.get(name, FLAG_RANGE)
                if high <= low and math.prod(shape):
                    raise DivimlInputError(f"integer input '{name}' indexes a table of no rows", field="MODEL")
                out.append(rng.integers(low, high, size=shape).astype(dtype))
            else:
                out.append(rng.standard_normal(shape).astype(dtype))
        return out

    def sample_stream(self, count: int, distinct: int) -> CyclicInputs:
        """``count`` inputs for a stream: the sample inputs of seeds 0 .. ``distinct`` - 1 (the given
        inputs each time, where there are some), taken in turn. A stream holds at most ``distinct``
        inputs however long it is (``--inputs 100000000`` drew every input before the first inference)."""
        return CyclicInputs([self.sample_inputs(seed) for seed in range(min(count, distinct))], count)


class CyclicInputs(Sequence):
    """``count`` items that cycle through ``pool``: what a stream reads, one item at a time."""

    def __init__(self, pool: list, count: int):
        self.pool, self.count = pool, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if not -self.count <= index < self.count:
            raise IndexError(index)
        return self.pool[index % self.count % len(self.pool)]


class LazyWeights(Sequence):
    """The zoo's weights, drawn when first read: planning needs only the module, and a large model's
    weights take gigabytes (``llama:layers=32,hidden=4096,intermediate=11008`` draws 26 GB)."""

    def __init__(self, named_shapes: list[tuple[str, tuple[int, ...], str]], seed: int):
        self._shapes, self._seed = named_shapes, seed
        self._drawn: list[tuple[str, np.ndarray]] | None = None

    def __len__(self) -> int:
        return len(self._shapes)

    def __getitem__(self, index):
        if self._drawn is None:
            self._drawn = init_weights(self._shapes, self._seed)
        return self._drawn[index]


def init_weights(named_shapes: list[tuple[str, tuple[int, ...], str]], seed: int) -> list[tuple[str, np.ndarray]]:
    """Deterministic weights that keep activations bounded through deep networks: fan-in scaled
    normals for matrices and kernels, ones for 1-D scales (names ending in weight/gamma/scale),
    small normals for biases."""
    rng = np.random.default_rng(seed)
    out = []
    for name, shape, dtype in named_shapes:
        draw = rng.standard_normal(shape, dtype=np.float32)  # float32 draws: twice as fast as float64
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[1:])) or 1
            value = draw / np.float32(np.sqrt(fan_in))
        elif name.rsplit(".", 1)[-1] in ("weight", "gamma", "scale"):
            value = 1.0 + 0.1 * draw
        else:
            value = 0.01 * draw
        out.append((name, value.astype(dtype)))
    return out


# Sizes at which each model runs in seconds on this project's CPUs (TVM 0.27 leaves CPU kernels
# unscheduled, see docs/design.md#tvm-027-traps): what tests and the cost benchmark execute.
SMALL_OPTIONS: dict[str, dict[str, int]] = {
    "resnet18": {"resolution": 32, "classes": 10},
    "resnet50": {"resolution": 32, "classes": 10},
    "mobilenet_v2": {"resolution": 32, "classes": 10},
    "inception_v3": {"resolution": 75, "classes": 10},
    "randwire_ws": {"nodes": 8, "channels": 8, "stages": 2, "resolution": 32, "classes": 10},
    "randwire_er": {"nodes": 8, "channels": 8, "stages": 2, "resolution": 32, "classes": 10},
    "randwire_ba": {"nodes": 8, "channels": 8, "stages": 2, "resolution": 32, "classes": 10},
    "bert_base": {"layers": 2, "seq": 16, "hidden": 64, "heads": 4, "intermediate": 128, "vocab": 1000},
    "gpt2": {"layers": 2, "seq": 16, "hidden": 64, "heads": 4, "vocab": 1000},
    "vit_b16": {"resolution": 32, "patch": 16, "layers": 2, "hidden": 64, "heads": 4, "mlp": 128, "classes": 10},
    "twin_branch": {"depth": 2, "hidden": 64, "batch": 4},
    "llama": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": 1000, "seq": 16},
}


def zoo_names() -> list[str]:
    _load_all()
    return sorted(ZOO)


def check_zoo_name(name: str) -> None:
    """Refuse a name no zoo model has, before TVM is imported (5 s here): every zoo model has its
    SMALL_OPTIONS (tests/passes/test_apply_plan.py holds the two to the same names)."""
    if name not in SMALL_OPTIONS:
        raise DivimlInputError(
            f"unknown model '{name}'",
            field="MODEL",
            hint=f"zoo models: {', '.join(sorted(SMALL_OPTIONS))}; or an .onnx or .json file",
        )


def build_model(name: str, options: dict[str, Any] | None = None, *, seed: int = 0) -> BuiltModel:
    """Export zoo model ``name`` with ``options`` to Relax; weights drawn from ``seed`` (or the
    ``seed`` option)."""
    import tvm
    from tvm.relax.frontend import nn

    from .input_ranges import integer_input_ranges  # TVM enters here: `import tvm_diviml.zoo` loads none

    check_zoo_name(name)
    _load_all()
    options = dict(options or {})
    entry = ZOO[name]
    allowed = entry.defaults()
    seed = int(options.get("seed", seed))  # weights; a generator's own seed option is passed on too
    if "seed" not in allowed:
        options.pop("seed", None)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise DivimlInputError(
            f"model '{name}' has no option '{unknown[0]}'",
            field="MODEL",
            hint=f"options: {', '.join(f'{k}={v}' for k, v in allowed.items())}",
        )
    check_counts(name, options, allowed)
    try:
        module, inputs = entry.builder(**options)
    except (TypeError, ValueError) as error:
        raise DivimlInputError(f"bad options for '{name}': {error}", field="MODEL") from None
    spec = {"forward": {k: nn.spec.Tensor(list(shape), dtype) for k, (shape, dtype) in inputs.items()}}
    mod, named_params = module.export_tvm(spec)
    shapes = [(n, tuple(int(s) for s in p.shape), str(p.dtype)) for n, p in named_params]
    label = format_model_spec(name, options)
    if seed and "seed" not in allowed:
        label += f"{',' if options else ':'}seed={seed}"
    named_inputs = [(k, tuple(s), d) for k, (s, d) in inputs.items()]
    return BuiltModel(
        label,
        mod,
        "forward",
        named_inputs,
        LazyWeights(shapes, seed),
        origin=f"the zoo (tvm.relax.frontend.nn, TVM {tvm.__version__})",
        input_ranges=integer_input_ranges(mod, "forward", named_inputs),
    )


def _load_all() -> None:
    """Import the modules that register zoo entries (they import TVM, so only on demand)."""
    from . import branches, cnn, llama, randwire, transformers  # noqa: F401 (TVM enters here, and only here)
