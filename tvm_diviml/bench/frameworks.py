"""The ``frameworks`` suite: what a user would run instead, timed in the same run on this CPU.

Each model (torchvision CNNs at 224x224, BERT-base at 128 tokens, a LLaMA-style decode step against
a KV cache) is built once in torch from a fixed seed, then timed per inference as

* ``diviml run MODEL.pt2 --platform cpu2`` with default options (a subprocess, as a user runs it:
  profiling, planning, building and the kept plan's measured latency), and with ``--tune-minutes``;
* ``tvm.compile`` with TVM's own default CPU pipeline (its kernels unscheduled);
* torch eager on one thread and on every core; ONNX Runtime on every core (where installed).

Ratios are taken within one run (the machine's speed drifts between runs). A baseline that cannot
run (no onnxruntime, an export that fails) leaves its column empty and says why in ``notes``.
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
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from ..app.coverage import export_onnx, missing_packages
from ..errors import DivimlInputError, first_line
from ..frontends.importers import from_torch_export
from ..runtime.vm import allow_every_core
from .common import progress
from .suite import Row

log = logging.getLogger(__name__)

TUNE_MINUTES = 20.0  # the tuning budget per model that a tuned comparison may spend
TIME_PER_BASELINE_S = 3.0  # each framework is timed for about this long (at least 3 inferences)
SLOW_CALL_S = 5.0  # a configuration slower than this per call is timed once


def suite_frameworks(quick: bool = False, tune_minutes: float = 0.0, models: str = "") -> Iterator[Row]:
    """One row per model: diviml (default options, and tuned for ``tune_minutes`` when given),
    ``tvm.compile``'s default, torch eager (1 thread, every core) and ONNX Runtime, seconds per
    inference; quick: only resnet18 and mobilenet_v2 at 64x64."""
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


def framework_row(name: str, make: Callable[[], tuple[Any, tuple]], scratch: str, tune_minutes: float) -> Row:
    """Time one model in every framework; seconds per inference, None where one could not run."""
    import torch

    module, args = make()
    row: Row = {"suite": "frameworks", "model": name, "threads": os.cpu_count() or 1, "notes": ""}
    notes = []
    path = os.path.join(scratch, f"{name}.pt2")
    torch.export.save(torch.export.export(module, args), path)
    row.update(_diviml(path, [], notes, "diviml").fields("diviml"))
    row["tuning_s"], row["tuned_over_default"] = None, None
    row.update(DivimlRun.failed().fields("diviml_tuned"))
    if tune_minutes > 0:
        began = time.perf_counter()
        tuned = _diviml(path, ["--tune-minutes", f"{tune_minutes:g}"], notes, "diviml tuned")
        row["tuning_s"] = time.perf_counter() - began
        row["tuned_over_default"] = _tuned_over_default(tuned.candidates)
        row.update(tuned.fields("diviml_tuned"))
    row["tvm_default_s"] = _guarded(lambda: _tvm_default(module, args), notes, "tvm.compile")
    row["torch_1_thread_s"] = _guarded(lambda: _torch(module, args, 1), notes, "torch")
    row["torch_s"] = _guarded(lambda: _torch(module, args, os.cpu_count() or 1), notes, "torch")
    row["onnxruntime_s"] = _guarded(lambda: _onnxruntime(module, args, scratch, name), notes, "onnxruntime")
    frameworks = [row[key] for key in ("torch_s", "torch_1_thread_s", "onnxruntime_s") if row[key]]
    row["best_framework_s"] = min(frameworks) if frameworks else None
    for key in ("diviml_s", "diviml_tuned_s", "tvm_default_s"):
        ready = row[key] and row["best_framework_s"]
        row[key.replace("_s", "_over_best")] = row[key] / row["best_framework_s"] if ready else None
    row["notes"] = "; ".join(notes)
    return row


def _guarded(measure: Callable[[], float], notes: list[str], what: str) -> float | None:
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
    out = path + f".{len(extra)}.json"
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


def _torch(module, args, threads: int) -> float:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            return _seconds_per_call(lambda: module(*args))
    finally:
        torch.set_num_threads(saved)


def _onnxruntime(module, args, scratch: str, name: str) -> float:
    import onnxruntime

    path = os.path.join(scratch, f"{name}.onnx")
    export_onnx(module, args, path)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=False)}
    return _seconds_per_call(lambda: session.run(None, feeds))


def _tvm_default(module, args) -> float:
    import torch

    return tvm_default_seconds(from_torch_export(torch.export.export(module, args)), [a.numpy() for a in args])


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


def _bert_base() -> tuple[Any, tuple]:
    import torch
    import transformers as hf

    torch.manual_seed(0)
    return hf.BertModel(hf.BertConfig()).eval(), (torch.randint(0, 30522, (1, 128)),)


def _llama_decode() -> tuple[Any, tuple]:
    import torch

    from .llama_step import LlamaDecodeStep  # torch enters here: the torch extra is optional

    torch.manual_seed(0)
    model = LlamaDecodeStep().eval()
    return model, model.example_inputs()


CATALOGUE: dict[str, Callable[[], tuple[Any, tuple]]] = {
    "resnet18_64": _vision("resnet18", 64),
    "mobilenet_v2_64": _vision("mobilenet_v2", 64),
    "resnet18": _vision("resnet18", 224),
    "resnet50": _vision("resnet50", 224),
    "mobilenet_v2": _vision("mobilenet_v2", 224),
    "efficientnet_b0": _vision("efficientnet_b0", 224),
    "bert_base_128": _bert_base,
    "llama_decode": _llama_decode,
}
QUICK_MODELS = ("resnet18_64", "mobilenet_v2_64")
