"""MetaSchedule tuning of a model's distinct PrimFuncs, and builds that apply the result.

TVM's default llvm pipeline leaves conv and matmul kernels unscheduled (scalar, one thread), so a
measured CPU cost describes an untuned build. Tuning writes a MetaSchedule JSON database
(``database_workload.json`` and ``database_tuning_record.json`` in a work directory, the format
MetaSchedule's own tools read); a build is tuned only if it applies that database, and then the
record's times describe it. A workload is the PrimFunc as the only function of an IRModule under
the symbol "main", without ``target``, so one record serves every binding of a PrimFunc.

Candidates are built and timed in the calling process (MetaSchedule's ``LocalBuilder`` and
``LocalRunner`` need ``cloudpickle``), ranked by MetaSchedule's random cost model seeded by ``seed``
so that a run is reproducible. Why: docs/design.md#tvm-027-traps.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, PyRunner, RunnerFuture, RunnerInput, RunnerResult
from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common, run_evaluator_common
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

from ..errors import DivimlInputError

log = logging.getLogger(__name__)

_MS_LOGGER = "tvm.s_tir.meta_schedule"
_SEARCHED_FILE = "searched.json"  # workload key -> trials searched so far, for resuming
# One candidate's time: 3 samples of at least 50 ms each, so a record's median is worth keeping.
_EVALUATOR = EvaluatorConfig(number=1, repeat=3, min_repeat_ms=50, enable_cpu_cache_flush=False)
_MAX_TRIALS_PER_ITER = 16  # later rounds start from the best measured candidates of earlier ones
# MetaSchedule's default population (512, 4 genetic rounds) ranks candidates by a cost model; ours is
# random, so a large population only costs time (seconds per round on 2 cores).
_POPULATION = 64
_GENETIC_ROUNDS = 2


@dataclass(frozen=True)
class TuningResult:
    """What a tuning run left in ``work_dir``."""

    database: Any  # ms.database.JSONDatabase over work_dir
    work_dir: str
    workloads: int  # distinct workloads of the input that have a record now
    tuned: int  # workloads searched by this call
    reused: int  # workloads that already had enough records (resumed runs)
    seconds: float  # wall time of this call
    digest: str  # database_digest(database): the profile cache's "tuned:<digest>"


@dataclass(frozen=True)
class AppliedDatabase:
    """A module with the database's schedules in place of the kernels it has records for."""

    mod: tvm.IRModule
    scheduled: int  # PrimFuncs replaced by their best record's schedule
    unscheduled: int  # PrimFuncs left as they were: no usable record, another device's,
    # or scheduled already


def tune_primfuncs(
    funcs: dict[str, tirx.PrimFunc], target, trials_per_func: int, work_dir: str, *, seed: int = 0
) -> TuningResult:
    """Search ``trials_per_func`` schedules for each distinct PrimFunc of ``funcs`` on ``target``.

    Records go to the JSON database in ``work_dir`` (created if absent), and ``work_dir/searched.json``
    remembers how many trials each workload has had, so a repeated run searches only what is missing
    (a workload whose design space is smaller than the trials asked for never reaches that many
    records). MetaSchedule's logs go to ``work_dir/logs/tuning.log``, not to the terminal. One
    work_dir holds one target's records: a build takes a workload's best record whatever its target.
    """
    if trials_per_func < 1:
        raise DivimlInputError(f"trials per kernel must be at least 1, not {trials_per_func}", field="trials")
    target = tuning_target(target)
    started = time.perf_counter()
    os.makedirs(work_dir, exist_ok=True)
    database = ms.database.JSONDatabase(work_dir=work_dir)
    _check_one_target_kind(database, target, work_dir)
    searched = _load_searched(work_dir)
    workloads = _distinct_workloads(funcs)
    missing: dict[int, dict[str, tvm.IRModule]] = {}  # trials still to run -> {task name: workload}
    for name, mod in workloads.items():
        done = max(searched.get(_workload_key(mod), 0), _record_count(database, mod))
        if done < trials_per_func:
            missing.setdefault(trials_per_func - done, {})[name] = mod
    tuned = sum(len(group) for group in missing.values())
    if tuned:
        log.info(
            "tuning %d of %d distinct kernels for %s, up to %d trials each (logs in %s)",
            tuned,
            len(workloads),
            target.kind.name,
            max(missing),
            os.path.join(work_dir, "logs"),
        )
        with _metaschedule_logs_into(os.path.join(work_dir, "logs")):
            for trials, group in sorted(missing.items()):
                _tune(group, target, trials, work_dir, database, seed)
                searched.update({_workload_key(mod): trials_per_func for mod in group.values()})
                _save_searched(work_dir, searched)
    recorded = sum(1 for mod in workloads.values() if _best_record(database, mod) is not None)
    seconds = time.perf_counter() - started
    log.info("tuned %d kernels (%d reused) in %.1f s", tuned, len(workloads) - tuned, seconds)
    return TuningResult(database, work_dir, recorded, tuned, len(workloads) - tuned, seconds, database_digest(database))


def open_database(work_dir: str):
    """An existing MetaSchedule JSON database (``database_workload.json`` and
    ``database_tuning_record.json`` in ``work_dir``), for builds that apply a user's tuning."""
    paths = [os.path.join(work_dir, f"database_{table}.json") for table in ("workload", "tuning_record")]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise DivimlInputError(
            f"no MetaSchedule database: {missing[0]} does not exist",
            source=work_dir,
            hint="give the work_dir that MetaSchedule tuning wrote",
        )
    return ms.database.JSONDatabase(work_dir=work_dir, allow_missing=False)


def apply_database(mod: tvm.IRModule, target, database) -> AppliedDatabase:
    """Schedule every PrimFunc of ``mod`` that ``database`` has a ``target``-kind record for.

    Works on a module of standalone PrimFuncs and on a lowered Relax module alike (the same result as
    ``relax.transform.MetaScheduleApplyDatabase`` there, which only matches PrimFuncs without a symbol).
    A PrimFunc whose own ``target`` attribute is of another kind (a GPU kernel of a placed module) is
    left alone. The database is only read: unknown workloads are not added to it.
    """
    target = _as_target(target)
    functions = dict(mod.functions_items())
    scheduled = 0
    for global_var, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or _is_scheduled(func):
            continue
        own_target = func.attrs.get("target") if func.attrs is not None else None
        if own_target is not None and own_target.kind.name != target.kind.name:
            continue
        schedule = _best_schedule(database, _workload_module(func), target, global_var.name_hint)
        if schedule is not None:
            functions[global_var] = _restore_attrs(schedule.mod["main"], func)
            scheduled += 1
    unscheduled = sum(isinstance(f, tirx.PrimFunc) for f in functions.values()) - scheduled
    log.debug("applied tuning records to %d PrimFuncs, %d left unscheduled", scheduled, unscheduled)
    if not scheduled:
        return AppliedDatabase(mod, 0, unscheduled)
    return AppliedDatabase(
        tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos), scheduled, unscheduled
    )


def tuned_seconds(database, func: tirx.PrimFunc, target) -> float | None:
    """The median run time of the best record for ``func`` on ``target``'s kind, or None without one."""
    target = _as_target(target)
    record = _best_record(database, _workload_module(func), target)
    if record is None:
        return None
    return statistics.median(float(s) for s in record.run_secs)


def database_digest(database) -> str:
    """A digest of what a build applying ``database`` would run: for each workload, its best record's
    schedule and target. Records that change no workload's best leave it as it is; run times do too."""
    best: dict[str, str] = {}
    for workload in {record.workload: None for record in database.get_all_tuning_records()}:
        top = database.get_top_k(workload, 1)  # records share their Workload object: one lookup each
        if top:
            best[_workload_key(workload.mod)] = f"{_canonical_target(top[0].target)}\n{top[0].trace}"
    text = "\n".join(f"{key}\n{best[key]}" for key in sorted(best))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tuning_target(target) -> tvm.target.Target:
    """``target`` as MetaSchedule needs it: an llvm target must state ``num-cores`` (this machine's
    core count unless given), or the search refuses it."""
    target = _as_target(target)
    if target.kind.name != "llvm" or target.attrs.get("num-cores"):
        return target
    return tvm.target.Target({**target.export(), "num-cores": os.cpu_count() or 1})


def _canonical_target(target: tvm.target.Target) -> str:
    """A target as text that does not depend on the order its attributes were given in."""
    return json.dumps(dict(target.export()), sort_keys=True, default=str)


def _as_target(target) -> tvm.target.Target:
    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


# ---------------------------------------------------------------------- search
def _tune(pending: dict[str, tvm.IRModule], target, trials: int, work_dir: str, database, seed: int) -> None:
    """One MetaSchedule run of ``trials`` trials for each of ``pending`` (task name -> workload).

    Reproducible for a seed: the search runs on one thread (with several, which thread samples which
    candidate, each with its own random state, varies from run to run), the cost model is random and
    seeded, and tasks take turns (a gradient scheduler would pick them by measured times).
    """
    _import_tensor_intrinsics()
    names = sorted(pending)
    contexts = [
        ms.TuneContext(
            mod=pending[name],
            target=target,
            space_generator="post-order-apply",
            search_strategy=ms.search_strategy.EvolutionarySearch(
                population_size=_POPULATION, genetic_num_iters=_GENETIC_ROUNDS
            ),
            task_name=name,
            rand_state=rand_state,
            num_threads=1,
            logger=logging.getLogger(f"{_MS_LOGGER}.task.{name}"),
        ).clone()
        for name, rand_state in zip(names, ms.utils.fork_seed(seed, n=len(names)))
    ]
    artifacts = _ArtifactStore()
    ms.tune_tasks(
        tasks=contexts,
        task_weights=[1.0] * len(contexts),
        work_dir=work_dir,
        max_trials_global=trials * len(contexts),
        max_trials_per_task=trials,
        num_trials_per_iter=min(trials, _MAX_TRIALS_PER_ITER),
        builder=_InProcessBuilder(artifacts),
        runner=_InProcessRunner(artifacts, _EVALUATOR),
        database=database,
        cost_model=ms.CostModel.create("random", seed=seed),
        # The default callbacks would also delete each artifact's folder; ours are in memory.
        measure_callbacks=[ms.measure_callback.AddToDatabase(), ms.measure_callback.UpdateCostModel()],
        task_scheduler="round-robin",
    )


def _import_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (MetaSchedule does on every TuneContext), minutes faster.

    Its ~250 TVMScript intrinsics each call ``inspect.stack()``, and for every frame whose code comes
    from a frozen module (importlib's, and runpy's under ``python -m``) ``inspect.getmodule`` scans
    all of ``sys.modules``: 2000 of them once tvm_ffi has imported torch, 76 s here (plus 15 s under
    pytest). Telling inspect's file -> module cache which module each frozen file is (which is true)
    makes the same import take 8–12 s.
    """
    frozen = {"importlib._bootstrap", "importlib._bootstrap_external"}
    frame = sys._getframe()
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith("<frozen ") and filename.endswith(">"):
            frozen.add(filename[len("<frozen ") : -1])
        frame = frame.f_back
    for name in frozen:
        inspect.modulesbyfile.setdefault(f"<frozen {name}>", name)
    import tvm.s_tir.tensor_intrin  # noqa: F401  (registers the intrinsics schedules may tensorize with)


class _ArtifactStore:
    """Built candidates by token: the builder's 'artifact path' names a module held in memory."""

    def __init__(self):
        self.modules: dict[str, Any] = {}
        self.count = 0

    def put(self, module) -> str:
        self.count += 1
        token = f"in-process:{self.count}"
        self.modules[token] = module
        return token

    def take(self, token: str):
        return self.modules.pop(token)


@derived_object
class _InProcessBuilder(PyBuilder):
    """Builds candidates as MetaSchedule's LocalBuilder does, without its worker processes."""

    def __init__(self, artifacts: _ArtifactStore):
        super().__init__()
        self.artifacts = artifacts

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        results = []
        for build_input in build_inputs:
            try:
                # What LocalBuilder's default_build does, without its deprecated tvm.build call.
                mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(build_input.mod)
                module = tvm.tirx.build(mod, target=build_input.target)
                results.append(BuilderResult(self.artifacts.put(module), None))
            except Exception as error:  # a candidate that does not compile is a failed trial
                results.append(BuilderResult(None, f"in-process build failed: {error}"))
        return results


@derived_object
class _InProcessRunner(PyRunner):
    """Times candidates the way MetaSchedule's LocalRunner does (random inputs, time_evaluator)."""

    def __init__(self, artifacts: _ArtifactStore, evaluator: EvaluatorConfig):
        super().__init__()
        self.artifacts = artifacts
        self.evaluator = evaluator
        self.random_fill = tvm.get_global_func("tvm.contrib.random.random_fill_for_measure")

    def run(self, runner_inputs: list[RunnerInput]) -> list[RunnerFuture]:
        futures = []
        for runner_input in runner_inputs:
            result = self._run_one(runner_input)
            futures.append(RunnerFuture(f_done=lambda: True, f_result=lambda result=result: result))
        return futures

    def _run_one(self, runner_input: RunnerInput) -> RunnerResult:
        try:
            module = self.artifacts.take(str(runner_input.artifact_path))
            device = tvm.runtime.device(str(runner_input.device_type), 0)
            args_info = [info.as_json() for info in runner_input.args_info]
            args = alloc_argument_common(self.random_fill, device, args_info, 1)
            _zero_integer_arguments(args)
            return RunnerResult(run_evaluator_common(module, device, self.evaluator, args), None)
        except Exception as error:  # a candidate that fails at run time is a failed trial
            return RunnerResult(None, f"in-process run failed: {error}")


def _zero_integer_arguments(arg_sets: list[list]) -> None:
    """Integer buffers are indices (a gather's token ids): random ones run out of bounds, and
    TVM's gathers do not check (a segfault, seen with BERT's embedding). Zeros are always in bounds."""
    import numpy as np

    for arguments in arg_sets:
        for tensor in arguments:
            if np.issubdtype(np.dtype(str(tensor.dtype)), np.integer):
                tensor.copyfrom(np.zeros(tuple(tensor.shape), dtype=str(tensor.dtype)))


@contextmanager
def _metaschedule_logs_into(log_dir: str):
    """Send MetaSchedule's (very verbose) logs to ``log_dir/tuning.log`` for the duration."""
    os.makedirs(log_dir, exist_ok=True)
    logger = logging.getLogger(_MS_LOGGER)
    handler = logging.FileHandler(os.path.join(log_dir, "tuning.log"))
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(name)s: %(message)s"))
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


# ---------------------------------------------------------------------- records
def _workload_module(func: tirx.PrimFunc) -> tvm.IRModule:
    """The IRModule a record of ``func`` is filed under (what MetaSchedule's own normalisation makes of
    a PrimFunc without a symbol, which is how a Relax build presents it)."""
    if func.attrs is not None and "target" in func.attrs:
        func = func.without_attr("target")
    func = func.with_attr("global_symbol", "main").with_attr("tirx.noalias", True)
    return tvm.IRModule({"main": func})


def _distinct_workloads(funcs: dict[str, tirx.PrimFunc]) -> dict[str, tvm.IRModule]:
    """One workload per structurally distinct PrimFunc, named after the first name (sorted) it has."""
    workloads: dict[str, tvm.IRModule] = {}
    seen: set[str] = set()
    for name in sorted(funcs):
        mod = _workload_module(funcs[name])
        key = _workload_key(mod)
        if key not in seen and not _is_scheduled(funcs[name]):
            seen.add(key)
            workloads[name] = mod
    return workloads


def _workload_key(mod: tvm.IRModule) -> str:
    """A workload's process-stable structural hash, as text."""
    return f"{tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFFFFFF:016x}"


def _load_searched(work_dir: str) -> dict[str, int]:
    path = os.path.join(work_dir, _SEARCHED_FILE)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as file:
            return {str(k): int(v) for k, v in json.load(file)["trials"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise DivimlInputError(
            f"unreadable tuning progress ({error})",
            source=path,
            hint="delete the file to count trials from the database's records",
        ) from None


def _save_searched(work_dir: str, searched: dict[str, int]) -> None:
    path = os.path.join(work_dir, _SEARCHED_FILE)
    with open(path + ".tmp", "w") as file:
        json.dump({"trials": dict(sorted(searched.items()))}, file, indent=1)
    os.replace(path + ".tmp", path)


def _check_one_target_kind(database, target, work_dir: str) -> None:
    kinds = {record.target.kind.name for record in database.get_all_tuning_records()}
    if kinds - {target.kind.name}:
        raise DivimlInputError(
            f"the tuning database holds {', '.join(sorted(kinds))} records, not {target.kind.name} ones",
            source=work_dir,
            hint="use one work_dir per target",
        )


def _record_count(database, mod: tvm.IRModule) -> int:
    """How many measured records ``database`` holds for the workload ``mod`` (without adding it)."""
    if not database.has_workload(mod):
        return 0
    return len(database.get_top_k(database.commit_workload(mod), 1 << 30))


def _best_record(database, mod: tvm.IRModule, target=None):
    """The fastest measured record of ``mod``, if it was measured on ``target``'s kind (when given)."""
    if not database.has_workload(mod):
        return None
    top = database.get_top_k(database.commit_workload(mod), 1)
    if not top or (target is not None and top[0].target.kind.name != target.kind.name):
        return None
    return top[0]


def _best_schedule(database, mod: tvm.IRModule, target, name: str):
    """The best record's trace replayed on ``mod``: its schedule, or None without a usable record
    (a trace that no longer replays, from a database of another TVM version, counts as none)."""
    record = _best_record(database, mod, target)
    if record is None:
        return None
    if any(inst.kind.name == "Tensorize" for inst in record.trace.insts):
        _import_tensor_intrinsics()
    schedule = tvm.s_tir.Schedule(mod)
    try:
        record.trace.apply_to_schedule(schedule, remove_postproc=False)
    except Exception as error:  # TVM raises its own error types for every failed step
        log.warning(
            "the tuning record of %s does not apply (%s); it stays unscheduled",
            name,
            str(error).splitlines()[0] if str(error) else type(error).__name__,
        )
        return None
    return schedule


def _restore_attrs(scheduled: tirx.PrimFunc, original: tirx.PrimFunc) -> tirx.PrimFunc:
    """The scheduled function with the original's symbol and target, marked as scheduled."""
    attrs = original.attrs if original.attrs is not None else {}
    scheduled = scheduled.without_attr("global_symbol")
    for key in ("global_symbol", "target"):
        if key in attrs:
            scheduled = scheduled.with_attr(key, attrs[key])
    return scheduled.with_attr("tirx.is_scheduled", True)


def _is_scheduled(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))
