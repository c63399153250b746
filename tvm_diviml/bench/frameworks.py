"""The ``frameworks`` suite: what a user would run instead, timed in the same run on this CPU.

Each model is built once in torch from a fixed seed (nothing downloaded), then timed per inference as

* ``diviml run MODEL.pt2 --platform cpu2`` with default options (a subprocess, as a user runs it:
  profiling, planning, building and the kept plan's measured latency), and with ``--tune-minutes``;
* ``tvm.compile`` with TVM's own default CPU pipeline (its kernels unscheduled);
* torch eager on one thread and on every core; ``torch.compile`` (inductor, default mode) on every
  core, its compilation timed apart; ONNX Runtime on every core (where installed).

The models: torchvision CNNs at 224x224 (and 64x64 for ``--quick``), BERT-base at 128 tokens and a
LLaMA-style decode step, on which diviml's schedules and cost model were developed; and held-out rows,
added afterwards and never tuned for, at the sizes a user runs them: ViT-B/16 and ConvNeXt-Tiny at
224x224, a ResNet-50 FPN detection backbone at 320x320 (torchvision's low-resolution detection size;
800x800, its default, is 6 times the work in every column), GPT-2 small (12 layers, 768 hidden)
and t5-small's encoder at 128 tokens. ``diviml_peak_fraction`` is the model's FLOPs (diviml's
extraction) per diviml second over this CPU's measured peak on every core.

Ratios are taken within one run (the machine's speed drifts between runs). Each column above is timed
after the one before, and a VM's speed can drift by a fifth between them, so the kept build that
``diviml run --export`` wrote is also timed in this process beside ONNX Runtime and torch eager,
alternately in blocks (``paired_*``, ``diviml_over_best_paired``): the first call of each block is not
timed (ONNX Runtime's threads spin for a while after a call, on the cores the next one needs).
A baseline that cannot
run (no onnxruntime, an export that fails, no C++ compiler for inductor) leaves its column empty and
says why in ``notes``.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import tvm
from tvm import relax

from ..app.coverage import export_onnx, missing_packages
from ..app.load import load_model
from ..errors import DivimlInputError, first_line
from ..profiling.peak import measured_peak_flops_per_s
from ..runtime.artefact import load as load_artefact
from ..runtime.vm import allow_every_core
from .common import progress
from .suite import Row

log = logging.getLogger(__name__)

TUNE_MINUTES = 20.0  # the tuning budget per model that a tuned comparison may spend
TIME_PER_BASELINE_S = 3.0  # each framework is timed for about this long (at least 3 inferences)
PAIRED_ROUNDS = 6  # rounds of the paired timing, each a block per framework, the order reversed every other
PAIRED_BLOCK_S = 0.5  # a block of the paired timing: at least this long and 2 timed calls, after one untimed
SLOW_CALL_S = 5.0  # a configuration slower than this per call is timed once
FRAMEWORK_KEYS = ("torch_s", "torch_1_thread_s", "torch_compile_s", "onnxruntime_s")  # what best_framework_s picks from

Measured = TypeVar("Measured")


@dataclass(frozen=True)
class FrameworkModel:
    """A row of the catalogue: how to make the model and its example inputs, and whether it is held
    out (added after diviml's schedules and cost model were developed on the other rows, its speed
    never tuned for: its figures say how diviml does on a model it was not shaped around)."""

    make: Callable[[], tuple[Any, tuple]]
    held_out: bool = False


def suite_frameworks(quick: bool = False, tune_minutes: float = 0.0, models: str = "") -> Iterator[Row]:
    """One row per model: diviml (default options, and tuned for ``tune_minutes`` when given),
    ``tvm.compile``'s default, torch eager (1 thread, every core), ``torch.compile`` and ONNX Runtime,
    seconds per inference; quick: only resnet18 and mobilenet_v2 at 64x64."""
    missing = [name for name in missing_packages() if name != "onnxscript"]
    if missing:
        raise DivimlInputError(
            f"suite frameworks needs {', '.join(missing)}, which this environment lacks",
            field="--suite",
            hint="pip install 'tvm-diviml[torch]'",
        )
    chosen = _chosen(models, quick)
    bar = progress(total=len(chosen), desc="frameworks suite", unit="model")
    with tempfile.TemporaryDirectory(prefix="diviml-frameworks-") as scratch:
        for name in chosen:
            bar.set_postfix_str(name)
            yield framework_row(name, CATALOGUE[name], scratch, tune_minutes)
            bar.update()
    bar.close()


def _chosen(models: str, quick: bool) -> list[str]:
    if models:
        names = [m.strip() for m in models.split(",") if m.strip()]
        unknown = [n for n in names if n not in CATALOGUE]
        if unknown:
            raise DivimlInputError(
                f"unknown model '{unknown[0]}' for suite frameworks",
                field="--models",
                hint=f"choose from {', '.join(CATALOGUE)}",
            )
        return names
    return [name for name in CATALOGUE if name in QUICK_MODELS or not quick]


def framework_row(
    name: str,
    model: FrameworkModel,
    scratch: str,
    tune_minutes: float,
    *,
    torch_compile: bool = True,
    paired: bool = True,
) -> Row:
    """Time one model in every framework; seconds per inference, None where one could not run.
    ``torch_compile``: False skips ``torch.compile``, whose compilation takes a minute or more;
    ``paired``: False leaves out the paired timing (``paired_times``)."""
    import torch

    module, args = model.make()
    threads = os.cpu_count() or 1
    row: Row = {"suite": "frameworks", "model": name, "held_out": model.held_out, "threads": threads, "notes": ""}
    notes: list[str] = []
    program = torch.export.export(module, args)
    path = os.path.join(scratch, f"{name}.pt2")
    torch.export.save(program, path)
    export = os.path.join(scratch, f"{name}.export") if paired else None
    row.update(_diviml_runs(path, tune_minutes, notes, export))
    loaded = _guarded(lambda: load_model(program, name=name), notes, "diviml import")
    flops = sum(k.flops for k in loaded.extraction.graph.kernels.values()) if loaded else None
    row["gflops"] = flops / 1e9 if flops else None
    inputs = [a.numpy() for a in args]
    row["tvm_default_s"] = (
        _guarded(lambda: tvm_default_seconds(loaded.built, inputs), notes, "tvm.compile") if loaded else None
    )
    row.update(framework_times(module, args, scratch, name, threads, notes, torch_compile=torch_compile))
    for key in ("diviml_s", "diviml_tuned_s", "tvm_default_s"):
        ready = row[key] and row["best_framework_s"]
        row[key.replace("_s", "_over_best")] = row[key] / row["best_framework_s"] if ready else None
    if export and row["diviml_s"]:
        row.update(paired_times(export, module, args, scratch, name, threads, notes))
        if row["torch_compile_s"] and row["torch_compile_s"] == row["best_framework_s"]:
            notes.append("paired: torch.compile, the fastest framework here, is not timed in the pairs")
    row.update(_peak_columns(flops, row, threads, notes))
    row["notes"] = "; ".join(notes)
    return row


def _diviml_runs(path: str, tune_minutes: float, notes: list[str], export: str | None) -> Row:
    """diviml's columns: its default run (its kept build exported to ``export`` when given), and a tuned
    run when ``tune_minutes`` is given."""
    columns = _diviml(path, ["--export", export] if export else [], notes, "diviml").fields("diviml")
    columns["tuning_s"], columns["tuned_over_default"] = None, None
    columns.update(DivimlRun.failed().fields("diviml_tuned"))
    if tune_minutes > 0:
        began = time.perf_counter()
        tuned = _diviml(path, ["--tune-minutes", f"{tune_minutes:g}"], notes, "diviml tuned")
        columns["tuning_s"] = time.perf_counter() - began
        columns["tuned_over_default"] = _tuned_over_default(tuned.candidates)
        columns.update(tuned.fields("diviml_tuned"))
    return columns


def framework_times(
    module, args: tuple, scratch: str, name: str, threads: int, notes: list[str], *, torch_compile: bool = True
) -> Row:
    """Seconds per inference of the frameworks a user would run instead (torch eager on one thread and
    on ``threads``, ``torch.compile`` with its compile seconds, ONNX Runtime), and the best of them."""
    inductor_folder = os.path.join(scratch, f"{name}.inductor")
    times: Row = {
        "torch_1_thread_s": _guarded(lambda: _torch(module, args, 1), notes, "torch"),
        "torch_s": _guarded(lambda: _torch(module, args, threads), notes, "torch"),
    }
    compiled = (
        _guarded(lambda: _torch_compiled(module, args, threads, inductor_folder), notes, "torch.compile")
        if torch_compile
        else None
    )
    times["torch_compile_s"], times["torch_compile_build_s"] = compiled or (None, None)
    times["onnxruntime_s"] = _guarded(lambda: _onnxruntime(module, args, scratch, name), notes, "onnxruntime")
    measured = [times[key] for key in FRAMEWORK_KEYS if times[key]]
    times["best_framework_s"] = min(measured) if measured else None
    return times


def paired_times(export: str, module, args: tuple, scratch: str, name: str, threads: int, notes: list[str]) -> Row:
    """The kept build exported to ``export`` (loaded as a user loads it, numpy in and out), ONNX Runtime
    and torch eager on ``threads``, timed in this process alternately (``alternated_seconds``), and
    diviml's time over the faster of the two. torch.compile is not among them (its compilation takes
    minutes)."""
    built = _guarded(lambda: load_artefact(export), notes, "paired diviml")
    calls = {"diviml": (lambda: built(*[a.numpy() for a in args])) if built else None}
    session = _guarded(lambda: _onnxruntime_call(module, args, scratch, name), notes, "paired onnxruntime")
    calls["onnxruntime"] = session
    calls["torch"] = _torch_call(module, args)
    timed = {key: call for key, call in calls.items() if call}
    with _torch_threads(threads):
        seconds = alternated_seconds(timed) if "diviml" in timed and len(timed) > 1 else {}
    columns: Row = {f"paired_{key}_s": seconds.get(key) for key in calls}
    others = [seconds[key] for key in seconds if key != "diviml"]
    columns["diviml_over_best_paired"] = seconds["diviml"] / min(others) if others else None
    return columns


def alternated_seconds(calls: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Median seconds per call of each of ``calls``, timed in ``PAIRED_ROUNDS`` rounds of one block each
    (the order reversed every other round): the medians of the blocks' medians. A block's first call
    is not timed: another framework's threads may still hold the cores."""
    blocks: dict[str, list[float]] = {key: [] for key in calls}
    for round_index in range(PAIRED_ROUNDS):
        order = list(calls) if round_index % 2 == 0 else list(calls)[::-1]
        for key in order:
            calls[key]()
            samples: list[float] = []
            began = time.perf_counter()
            while len(samples) < 2 or time.perf_counter() - began < PAIRED_BLOCK_S:
                start = time.perf_counter()
                calls[key]()
                samples.append(time.perf_counter() - start)
            blocks[key].append(statistics.median(samples))
    return {key: statistics.median(values) for key, values in blocks.items()}


def _peak_columns(flops: float | None, row: Row, threads: int, notes: list[str]) -> Row:
    """This CPU's measured peak on ``threads`` and the share of it diviml's runs reached."""
    peak = _guarded(lambda: measured_peak_flops_per_s(threads), notes, "peak") if flops else None
    return {
        "peak_gflops_per_s": peak / 1e9 if peak else None,
        "diviml_peak_fraction": peak_fraction(flops, row["diviml_s"], peak),
        "diviml_tuned_peak_fraction": peak_fraction(flops, row["diviml_tuned_s"], peak),
    }


def peak_fraction(flops: float | None, seconds: float | None, peak_flops_per_s: float | None) -> float | None:
    """The share of the CPU's peak that an inference of ``flops`` in ``seconds`` reached; None where
    any figure is missing (a run or a measurement that failed)."""
    if not (flops and seconds and peak_flops_per_s):
        return None
    return flops / seconds / peak_flops_per_s


def _guarded(measure: Callable[[], Measured], notes: list[str], what: str) -> Measured | None:
    try:
        return measure()
    except Exception as error:  # noqa: BLE001 (a framework that cannot run this model: a note, not a crash)
        notes.append(f"{what}: {type(error).__name__}: {first_line(error)}")
        return None


def _tuned_over_default(candidates: list[dict]) -> float | None:
    """The fastest tuned build's time over the fastest build with the default schedules, both timed
    side by side in the tuned run (a ratio across two processes here strayed by up to 1.8x)."""
    tuned = [c["measured_s"] for c in candidates if not c.get("default_schedules") and len(c["devices"]) == 1]
    default = [c["measured_s"] for c in candidates if c.get("default_schedules")]
    return min(tuned) / min(default) if tuned and default else None


@dataclass(frozen=True)
class DivimlRun:
    """What one ``diviml run`` reported: the kept plan's measured latency, what it placed, every
    candidate timed, and the held-out checks: measured over predicted, kept over the best single
    device timed in the same rounds."""

    seconds: float | None
    placed: str | None
    candidates: list
    measured_over_predicted: float | None
    kept_over_best_single: float | None

    @classmethod
    def failed(cls) -> DivimlRun:
        return cls(None, None, [], None, None)

    def fields(self, prefix: str) -> Row:
        return {
            f"{prefix}_s": self.seconds,
            f"{prefix}_plan": self.placed,
            f"{prefix}_measured_over_predicted": self.measured_over_predicted,
            f"{prefix}_kept_over_best_single": self.kept_over_best_single,
        }


def _diviml(path: str, extra: list[str], notes: list[str], what: str) -> DivimlRun:
    """``diviml run PATH --platform cpu2`` in a subprocess, as a user runs it; "placed" is a device
    or how many devices, with "default schedules" where a tuned run kept those."""
    out = path + f".{what.replace(' ', '_')}.json"
    command = [sys.executable, "-m", "tvm_diviml.cli", "run", path, "--platform", "cpu2", *extra, "--json", out]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        notes.append(f"{what}: exit {done.returncode}: {lines[-1] if lines else 'no output'}")
        return DivimlRun.failed()
    with open(out) as file:
        row = json.load(file)
    used = sorted(set(row.get("kept_assignment", row["assignment"]).values()))
    chosen = row.get("candidates")
    kept = [c for c in chosen["candidates"] if c["label"] == chosen["winner"]] if chosen else []
    threads = kept[0]["threads"] if kept else None
    placed = used[0] if len(used) == 1 else f"{len(used)} devices"
    placed += f" ({threads} threads)" if threads else ""
    placed += ", default schedules" if kept and kept[0].get("default_schedules") else ""
    run = row["run"]
    return DivimlRun(
        seconds=float(run["measured_s"]),
        placed=placed,
        candidates=chosen["candidates"] if chosen else [],
        measured_over_predicted=run.get("measured_over_predicted"),
        kept_over_best_single=1 / run["speedup_over_best_single_device"],
    )


def _seconds_per_call(call: Callable[[], Any]) -> float:
    """Median seconds of ``call`` after a warm-up: at least 3 calls and ``TIME_PER_BASELINE_S``, or one
    call when it alone takes longer than ``SLOW_CALL_S``."""
    began = time.perf_counter()
    call()
    first = time.perf_counter() - began
    if first > SLOW_CALL_S:
        return first
    samples = []
    while len(samples) < 3 or sum(samples) < TIME_PER_BASELINE_S:
        began = time.perf_counter()
        call()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


@contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _torch(module, args, threads: int) -> float:
    with _torch_threads(threads):
        return _seconds_per_call(_torch_call(module, args))


def _torch_call(module, args) -> Callable[[], Any]:
    """One inference of ``module`` in torch eager, without autograd."""
    import torch

    def call():
        with torch.no_grad():
            return module(*args)

    return call


def _torch_compiled(module, args, threads: int, cache_folder: str) -> tuple[float, float]:
    """Seconds per inference of ``torch.compile(module)`` (inductor, default mode) on ``threads``, and the
    seconds of its first call, which compiles: a cost a user pays once, kept out of the timing. The
    compile is cold (inductor's on-disk cache in the empty ``cache_folder``, not one an earlier process
    filled), and its code is dropped afterwards, not to pile up over the suite's models."""
    import torch

    with _torch_threads(threads), torch.no_grad(), _inductor_cache(cache_folder):
        try:
            compiled = torch.compile(module)
            began = time.perf_counter()
            compiled(*args)
            compile_s = time.perf_counter() - began
            return _seconds_per_call(lambda: compiled(*args)), compile_s
        finally:
            torch.compiler.reset()


@contextmanager
def _inductor_cache(folder: str) -> Iterator[None]:
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved


def _onnxruntime(module, args, scratch: str, name: str) -> float:
    return _seconds_per_call(_onnxruntime_call(module, args, scratch, name))


def _onnxruntime_call(module, args, scratch: str, name: str) -> Callable[[], Any]:
    """One inference of ``module`` in ONNX Runtime on every core, exported to ``scratch`` (once)."""
    import onnxruntime

    path = os.path.join(scratch, f"{name}.onnx")
    if not os.path.exists(path):
        export_onnx(module, args, path)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=False)}
    return lambda: session.run(None, feeds)


def tvm_default_seconds(built, inputs) -> float:
    """Seconds per inference of ``built`` (a BuiltModel) through ``tvm.compile`` with TVM's own
    default CPU pipeline, its thread pool on every core: what a TVM user gets without tvm-diviml."""
    allow_every_core()
    target = tvm.target.Target({"kind": "llvm", "num-cores": os.cpu_count() or 1})
    executable = tvm.compile(built.mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    device = tvm.cpu()
    vm = relax.VirtualMachine(executable, device)
    weights = [w for _, w in built.params]
    arguments = [tvm.runtime.tensor(a, device) for a in [*inputs, *weights]]
    return _seconds_per_call(lambda: vm[built.entry](*arguments))


# ---------------------------------------------------------------------- the models
def _vision(name: str, resolution: int) -> Callable[[], tuple[Any, tuple]]:
    def make():
        import torch
        import torchvision

        torch.manual_seed(0)
        return getattr(torchvision.models, name)(weights=None).eval(), (torch.randn(1, 3, resolution, resolution),)

    return make


def _text(model: str, config: str, tokens: int, **options: Any) -> Callable[[], tuple[Any, tuple]]:
    """A Hugging Face ``model`` class from its ``config`` class (defaults, with ``options``) over a
    sequence of ``tokens`` random token ids."""

    def make():
        import torch
        import transformers as hf

        torch.manual_seed(0)
        settings = getattr(hf, config)(**options)
        return getattr(hf, model)(settings).eval(), (torch.randint(0, settings.vocab_size, (1, tokens)),)

    return make


def _detection_backbone() -> tuple[Any, tuple]:
    """torchvision's ResNet-50 FPN backbone, as Faster and Mask R-CNN use it: five feature maps."""
    import torch
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    torch.manual_seed(0)
    return resnet_fpn_backbone(backbone_name="resnet50", weights=None).eval(), (torch.randn(1, 3, 320, 320),)


def _llama_decode() -> tuple[Any, tuple]:
    import torch

    from .llama_step import LlamaDecodeStep  # torch enters here: the torch extra is optional

    torch.manual_seed(0)
    model = LlamaDecodeStep().eval()
    return model, model.example_inputs()


CATALOGUE: dict[str, FrameworkModel] = {
    "resnet18_64": FrameworkModel(_vision("resnet18", 64)),
    "mobilenet_v2_64": FrameworkModel(_vision("mobilenet_v2", 64)),
    "resnet18": FrameworkModel(_vision("resnet18", 224)),
    "resnet50": FrameworkModel(_vision("resnet50", 224)),
    "mobilenet_v2": FrameworkModel(_vision("mobilenet_v2", 224)),
    "efficientnet_b0": FrameworkModel(_vision("efficientnet_b0", 224)),
    "bert_base_128": FrameworkModel(_text("BertModel", "BertConfig", 128)),
    "llama_decode": FrameworkModel(_llama_decode),
    "vit_b_16": FrameworkModel(_vision("vit_b_16", 224), held_out=True),
    "convnext_tiny": FrameworkModel(_vision("convnext_tiny", 224), held_out=True),
    "resnet50_fpn_320": FrameworkModel(_detection_backbone, held_out=True),
    "gpt2_128": FrameworkModel(_text("GPT2Model", "GPT2Config", 128, use_cache=False), held_out=True),
    "t5_small_encoder_128": FrameworkModel(_text("T5EncoderModel", "T5Config", 128), held_out=True),
}
QUICK_MODELS = ("resnet18_64", "mobilenet_v2_64")
