"""The ``costs`` suite: how well the cost models predict a whole-model run on this machine's CPU."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import numpy as np

from ..app.load import load_model
from ..cost.fit import fit_costs
from ..cost.table import TableCostModel
from ..modelspec import format_model_spec
from ..presets import get_platform
from ..profiling.cache import ProfileCache
from ..profiling.measured import MeasureOptions, measure, tune_for_devices
from ..profiling.timing import bare_vm_call, priced_in_context, runner_overhead_s
from ..profiling.tuning import TuningBudget
from ..zoo import SMALL_OPTIONS
from .suite import Row

TUNE_MODELS = ("resnet18", "bert_base")  # also timed after MetaSchedule tuning (minutes each)
TUNE_TRIALS = 32
PLATFORM = "cpu2"


def suite_costs(
    models: list[str] | None = None, tune_models: tuple[str, ...] = TUNE_MODELS, tune_trials: int = TUNE_TRIALS
) -> Iterator[Row]:
    """Cost-model accuracy on this machine's CPU, per zoo model at a small size: the sum of the
    measured kernel times, alone and as calibrated inside the model (``priced_in_context``: the
    placed single-device build timed whole, a separate run, less the runner's Python work around the
    call, ``runner_overhead_s``), against the measured whole-model run (the placed single-device build's
    VM call by ``time_evaluator``), the roofline's
    per-kernel error after fitting it to those measurements, and untuned against tuned times."""
    platform = get_platform(PLATFORM)
    device = platform.devices[0]
    options = MeasureOptions(progress=False)
    with tempfile.TemporaryDirectory() as scratch:
        for name in models or sorted(SMALL_OPTIONS):
            loaded = load_model(name, SMALL_OPTIONS[name])
            extraction, built = loaded.extraction, loaded.built
            graph = extraction.graph
            with ProfileCache(f"{scratch}/{name}.sqlite") as cache:
                provenance = measure(graph, platform, extraction, cache=cache, options=options)
                alone = TableCostModel.from_provenance(graph, platform, provenance)
                kernel_s = np.array([alone.compute_s(k, device.name) for k in graph.kernels])
                provenance = priced_in_context(provenance, platform, built, extraction, cache=cache)
                costs = TableCostModel.from_provenance(graph, platform, provenance)
                in_context_s = sum(costs.compute_s(k, device.name) for k in graph.kernels)
            runner_s = runner_overhead_s(built, extraction, platform, device)
            whole = bare_vm_call(built, extraction, platform, device, options)
            row = {
                "suite": "costs",
                "model": format_model_spec(name, SMALL_OPTIONS[name]),
                "kernels": len(graph),
                "sum_kernels_s": float(kernel_s.sum()),
                "whole_model_s": whole.median_s,
                "sum_over_whole": float(kernel_s.sum()) / whole.median_s,
                "runner_overhead_s": runner_s,
                "in_context_over_whole": (in_context_s - runner_s) / whole.median_s,
            }
            row.update(_roofline_fit_columns(graph, costs, device.name))
            if name in tune_models:
                funcs = {f: extraction.mod[f] for f in sorted(set(extraction.kernel_func.values()))}
                budget = TuningBudget(tune_trials)
                tuned = tune_for_devices(funcs, [device], budget, f"{scratch}/{name}-ms", progress=False)[device.name]
                tuned_whole = bare_vm_call(built, extraction, platform, device, options, tuned.database)
                row.update(
                    tune_trials=tune_trials,
                    tuned_whole_model_s=tuned_whole.median_s,
                    tuning_speedup=whole.median_s / tuned_whole.median_s,
                    tuning_s=tuned.seconds,
                )
            yield row


def _roofline_fit_columns(graph, costs, device: str) -> Row:
    """The roofline fitted to the measured kernels and its per-kernel error; or why it could not be fitted."""
    try:
        fit = fit_costs(graph, costs, device)
    except ValueError as error:
        return {"roofline_fit": str(error)}
    return {
        "fit_gflops": fit.peak_flops / 1e9,
        "fit_gbps": fit.bandwidth_Bps / 1e9,
        "fit_overhead_us": fit.overhead_s * 1e6,
        "roofline_median_err": fit.median_rel_error,
        "roofline_p90_err": fit.p90_rel_error,
    }
