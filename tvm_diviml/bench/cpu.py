"""The ``cpu`` suite: what fraction of this CPU's attainable peak whole models reach as tvm-diviml
builds them, the figure the presets' CPU ``efficiency`` comes from.

Per zoo model: its FLOPs over the measured latency of the single-device build on one thread (every
kernel scheduled by the default rules, as ``diviml run`` builds it), divided by the attainable peak
of one core: a cache-resident 256 x 256 x 256 matmul scheduled by the same rules (register-tiled
multiply-adds: what the FMA units sustain at the clock the machine runs under load, so the ratio
needs no datasheet). Each row also gives the fraction of the FMA peak (``of_fma_peak``: independent
vector FMA chains, ``profiling.peak``), the measured counterpart of the datasheet peak that a preset's
efficiency multiplies.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator

import numpy as np
import tvm
from tvm import te

from ..app.load import load_model
from ..modelspec import format_model_spec
from ..presets import get_platform
from ..profiling.peak import measured_peak_flops_per_s
from ..profiling.timing import time_single_devices
from ..runtime.vm import set_threads
from ..schedules.apply import apply_rules, rules_for
from ..schedules.target import device_target
from .common import geomean, progress
from .suite import Row

MODELS = {"resnet50": {}, "mobilenet_v2": {}, "bert_base": {"seq": 128}, "inception_v3": {}}
PEAK_SIZE = 256


def suite_cpu(models: str = "") -> Iterator[Row]:
    """One row per model (its build on one thread), then the geometric mean of their efficiency."""
    names = [m.strip() for m in models.split(",") if m.strip()] or list(MODELS)
    peak, fma_peak = attainable_peak_flops(), measured_peak_flops_per_s(1)
    efficiencies = []
    for name in progress(names, desc="cpu suite", unit="model"):
        row = model_row(name, MODELS.get(name, {}), peak, fma_peak)
        efficiencies.append(row["efficiency"])
        yield row
    yield {"suite": "cpu", "model": f"geomean of {len(efficiencies)} models", "efficiency": geomean(efficiencies)}


def model_row(name: str, options: dict, peak_flops: float, fma_peak_flops: float) -> Row:
    loaded = load_model(name, options)
    graph, built = loaded.extraction.graph, loaded.built
    flops = sum(kernel.flops for kernel in graph.kernels.values())
    platform = get_platform("cpu1")
    config = {"one thread": (platform.devices[0], 1)}
    seconds = time_single_devices(built, loaded.extraction, platform, built.sample_inputs(), 5, None, config)
    scheduled_s = seconds["one thread"]
    return {
        "suite": "cpu",
        "model": format_model_spec(name, options),
        "gflop": flops / 1e9,
        "scheduled_s": scheduled_s,
        "gflops": flops / scheduled_s / 1e9,
        "peak_gflops": peak_flops / 1e9,
        "efficiency": flops / scheduled_s / peak_flops,
        "fma_peak_gflops": fma_peak_flops / 1e9,
        "of_fma_peak": flops / scheduled_s / fma_peak_flops,
    }


def attainable_peak_flops() -> float:
    """FLOP/s of a cache-resident matmul (``PEAK_SIZE`` cubed) scheduled by the default rules, on one
    thread of this machine's CPU: the best median of five runs."""
    n = PEAK_SIZE
    a, b = te.placeholder((n, n), name="a"), te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    target = device_target(get_platform("cpu1").devices[0])
    func, _ = apply_rules(te.create_prim_func([a, b, c]).with_attr("global_symbol", "main"), target, rules_for(target))
    library = tvm.tirx.build(tvm.IRModule({"main": func}), target=target)
    device = tvm.cpu()
    args = [tvm.runtime.tensor(np.random.default_rng(0).standard_normal((n, n)).astype("float32")) for _ in range(3)]
    set_threads(1)
    timer = library.time_evaluator("main", device, number=20, repeat=5, min_repeat_ms=50)
    best = min(statistics.median(timer(*args).results) for _ in range(3))
    return 2 * n**3 / best
