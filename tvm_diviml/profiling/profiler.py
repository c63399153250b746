"""``profile``: a model's costs measured on this machine, as the cost table that plans with them.

Measuring is one step after another, each returning figures: the schedules (as built, tuned now
within a budget, or a user's MetaSchedule database), the kernels, links and executor overheads timed
(``measured.measure``), the kernels priced inside the whole model (``timing.priced_in_context``); the
table is built from those figures (``TableCostModel.from_provenance``), so that ``--cost measured``
and ``--cost costs.json`` plan with the same kind of object, the first with its provenance beside it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..cost.provenance import MeasureOptions
from ..cost.table import TableCostModel
from ..errors import DivimlInputError
from ..graph import OpGraph
from ..passes.extract import Extraction
from ..platform import Platform
from ..zoo import BuiltModel
from .cache import ProfileCache, tuning_cache_dir
from .measured import device_present, existing_tuning, measure, tune_for_devices
from .timing import priced_in_context, single_device_configurations
from .tuning import TuningBudget


def profile(
    graph: OpGraph,
    platform: Platform,
    model: BuiltModel | None = None,
    extraction: Extraction | None = None,
    *,
    cache: ProfileCache | None = None,
    options: MeasureOptions | None = None,
    tune: TuningBudget | None = None,
    tuning_db: str | None = None,
    calibrate: bool = True,
    fresh: bool = False,
) -> TableCostModel:
    """``graph``'s kernel costs timed with TVM on ``platform``'s present devices (``extraction``: the
    lowered module they come from), through the profile cache (``cache``; None: the default one):
    as built, after MetaSchedule tuning within ``tune``, or with a user's MetaSchedule database
    (``tuning_db``, a work_dir) applied. ``calibrate``: price each kernel as it runs inside the model
    (``model`` timed whole once per present device, ``timing.priced_in_context``; ``fresh``: timed now,
    not read from the profile cache)."""
    if extraction is None:
        raise DivimlInputError(
            "measured costs need a model that TVM builds",
            field="--cost",
            hint="give a zoo name, an .onnx file or a .pt2 program, or use --cost roofline or a cost FILE",
        )
    options = options or MeasureOptions()
    tuning = tuning_for(platform, extraction, tune=tune, tuning_db=tuning_db, progress=options.progress)
    cache = cache if cache is not None else ProfileCache()
    provenance = measure(graph, platform, extraction, cache=cache, options=options, tuning=tuning)
    if calibrate and provenance.timed:
        databases = [t.database for t in tuning.values()]
        database = databases[0] if databases else None
        provenance = priced_in_context(
            provenance, platform, model, extraction, cache=cache, database=database, fresh=fresh
        )
    return TableCostModel.from_provenance(graph, platform, provenance)


def tuning_for(
    platform: Platform,
    extraction: Extraction,
    *,
    tune: TuningBudget | None = None,
    tuning_db: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Device name -> the TuningResult whose MetaSchedule database schedules its kernels: a user's
    (``tuning_db``), or searched now within ``tune`` for the platform's present devices and the whole
    CPU that a kept plan may run on; empty with neither."""
    tune = tune if tune is not None and tune.active else None
    if tuning_db and tune:
        raise DivimlInputError(
            "--tune and --tuning-db both choose the schedules", field="--tuning-db", hint="give one of them"
        )
    funcs = {name: extraction.mod[name] for name in sorted(set(extraction.kernel_func.values()))}
    if tuning_db:
        return existing_tuning(tuning_db, platform.devices, funcs)
    if not tune:
        return {}
    present = any(device_present(device) for device in platform.devices)  # else: nothing to tune
    configurations = [
        device if threads == device.num_threads else replace(device, num_threads=threads)
        for device, threads in (single_device_configurations(platform).values() if present else [])
    ]
    return tune_for_devices(funcs, [*platform.devices, *configurations], tune, tuning_cache_dir(), progress=progress)
