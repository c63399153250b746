"""MetaSchedule tuning of a model's distinct PrimFuncs, and builds that apply the result.

Tuning writes a MetaSchedule JSON database (``database_workload.json`` and
``database_tuning_record.json`` in a work directory, the format MetaSchedule's own tools read); a
build is tuned only if it applies that database, and then the record's times describe it. A
workload is the PrimFunc as the only function of an IRModule under the symbol "main", without
``target``, so one record serves every binding of a PrimFunc.

The search is MetaSchedule's own: ``LocalBuilder`` builds candidates in worker processes on every
core and ``LocalRunner`` times them in another (a candidate that crashes fails its trial, not the
process), ranked by the XGBoost cost model (``pip install 'tvm-diviml[tune]'``; MetaSchedule's
random one without it). Each workload's first record is the default rules' schedule, timed here.
A CPU kernel is timed as it runs inside a model: on the target's threads, its caches flushed of
every argument but the first before each single run (the one its predecessor just wrote). A budget
is trials per kernel or minutes for the whole model (``TuningBudget``), shown on a progress bar with
the time left; searched trials are remembered in the work directory, so a run stopped or repeated
resumes. Why: docs/design.md.

The search's fastest records are optimistic: each is the luckiest of many noisy timings. After the
search the few fastest of each kernel are timed again, taking turns with the default schedule on
the same arguments, and those timings alone go to the database that builds apply (``ranked/`` in
the work directory, ``open_database``): a tuned schedule is kept only where it beats the default
one there, and a run whose search kept none says so.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import shutil
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tqdm import tqdm
from tvm import tirx
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder.local_builder import default_build, default_export
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig
from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common, run_evaluator_common
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

from ..errors import DivimlInputError, Stop, first_line, interrupts_deferred, raise_if_interrupted
from ..runtime.vm import set_threads
from ..schedules.apply import default_schedule
from ..schedules.database import (
    as_target,
    best_record,
    database_digest,
    import_tensor_intrinsics,
    is_scheduled,
    records_for,
    replay,
    threads_of,
    tuning_target,
    workload_key,
    workload_module,
)
from ..writes import write_text

log = logging.getLogger(__name__)

_MS_LOGGER = "tvm.s_tir.meta_schedule"
_SEARCHED_FILE = "searched.json"  # "workload key@threads" -> trials searched so far, for resuming
# A CPU kernel's time: 9 single runs, each after MetaSchedule's flush of every argument but the first
# from the caches (the weights are cold inside a model, the input its predecessor wrote is not), and
# their median (``median_run_seconds``). Timed hot, many runs in a row, a 1x1 convolution's best
# record said 78 us and ran 1,381 us in the model. A flush before each repeat is only worth it with
# one run per repeat: min_repeat_ms would add hot runs.
_CPU_EVALUATOR = EvaluatorConfig(number=1, repeat=9, min_repeat_ms=0, enable_cpu_cache_flush=True)
# A GPU kernel's: 3 samples of at least 20 ms each (the CPU's flush does not reach a GPU's caches).
_GPU_EVALUATOR = EvaluatorConfig(number=1, repeat=3, min_repeat_ms=20, enable_cpu_cache_flush=False)
_RERANKED = 2  # the search's fastest schedules of each kernel timed again beside the default one
_RERANK_ROUNDS = 3  # turns each of those takes, so that drift and load touch them alike
RANKED_DIR = "ranked"  # in a work_dir: the database builds apply, of timings taken side by side
_MAX_TRIALS_PER_ITER = 16  # later rounds start from the best measured candidates of earlier ones
# A smaller population than MetaSchedule's default (512, 4 genetic rounds): each round of the search
# then takes about a second on 2 cores, not ten, and a budget of minutes buys more measured trials.
_POPULATION = 128
_GENETIC_ROUNDS = 3
_BUILDS_PER_WORKER = 256  # builds before a build worker is restarted (LocalBuilder: a new pool per batch)
_UNBOUNDED_TRIALS = 100_000  # trials per kernel when only minutes bound the search


@dataclass(frozen=True)
class TuningBudget:
    """How long tuning searches: ``trials`` per kernel, ``minutes`` for the whole model, or both (the
    first reached ends it). Nothing set: no tuning."""

    trials: int = 0
    minutes: float = 0.0

    def __post_init__(self):
        if self.trials < 0 or not self.minutes >= 0 or self.minutes == float("inf"):
            raise DivimlInputError(
                f"a tuning budget needs trials >= 0 and finite minutes >= 0, not {self.trials}, {self.minutes}",
                field="--tune",
            )

    @property
    def active(self) -> bool:
        return self.trials > 0 or self.minutes > 0

    def describe(self) -> str:
        parts = ([f"{self.trials} trials per kernel"] if self.trials else []) + (
            [f"{self.minutes:g} min"] if self.minutes else []
        )
        return " or ".join(parts)


@dataclass(frozen=True)
class TuningResult:
    """What a tuning run left in ``work_dir``."""

    database: Any  # ms.database.JSONDatabase that builds apply: work_dir/ranked (``open_database``)
    work_dir: str
    workloads: int  # distinct workloads of the input that have a record now
    tuned: int  # workloads searched by this call
    reused: int  # workloads that already had enough records (resumed runs)
    seconds: float  # wall time of this call
    digest: str  # database_digest(database): the profile cache's "tuned:<digest>"
    measured: int = 0  # candidates this call built and timed
    failed: int = 0  # candidates this call could not build or time
    improved: int = 0  # workloads whose kept schedule is a tuned one, faster than the default beside it


def tune_primfuncs(
    funcs: dict[str, tirx.PrimFunc],
    target,
    budget: TuningBudget,
    work_dir: str,
    *,
    seed: int = 0,
    progress=True,
    cost_model: str = "auto",
) -> TuningResult:
    """Search schedules for each distinct PrimFunc of ``funcs`` on ``target`` within ``budget``.

    The search's records go to the JSON database in ``work_dir`` (created if absent), the records
    timed again beside the default schedules to ``work_dir/ranked`` (``TuningResult.database``, what
    builds apply: ``_rerank``), and ``work_dir/searched.json`` remembers how many trials each
    workload has had, so a repeated run searches only what is missing (a workload whose design space
    is smaller than the trials asked for never reaches that many records). MetaSchedule's logs go to
    ``work_dir/logs/tuning.log``, not to the terminal. One work_dir holds one target kind's records;
    a CPU's are searched and applied per thread count.
    ``cost_model``: "auto" (XGBoost where installed), "xgb" or "random" (the same candidates for the
    same seed; XGBoost learns from measured times, which vary from run to run).
    """
    if not budget.active:
        raise DivimlInputError("a tuning budget needs trials per kernel or minutes", field="--tune")
    target = tuning_target(target)
    started = time.perf_counter()
    os.makedirs(work_dir, exist_ok=True)
    database = _json_database(work_dir, allow_missing=True)
    _check_one_target_kind(database, target, work_dir)
    workloads = _distinct_workloads(funcs)
    defaults = {name: default_schedule(mod["main"], target)[0] for name, mod in workloads.items()}
    for name, mod in workloads.items():
        _seed_with_default_schedule(database, mod, target, name)
    wanted = budget.trials or _UNBOUNDED_TRIALS
    searched = _load_searched(work_dir)
    missing = {name: mod for name, mod in workloads.items() if searched.get(_searched_key(mod, target), 0) < wanted}
    outcome = _Outcome()
    if missing:
        log.info(
            "tuning %d of %d distinct kernels for %s within %s (logs in %s)",
            len(missing),
            len(workloads),
            target.kind.name,
            budget.describe(),
            os.path.join(work_dir, "logs"),
        )
        deadline = started + budget.minutes * 60 if budget.minutes else None
        outcome = _search(missing, target, searched, wanted, work_dir, database, seed, deadline, progress, cost_model)
    os.makedirs(os.path.join(work_dir, RANKED_DIR), exist_ok=True)
    ranked = _json_database(os.path.join(work_dir, RANKED_DIR), allow_missing=True)
    unranked = [name for name, mod in workloads.items() if name in missing or best_record(ranked, mod, target) is None]
    for name in tqdm(unranked, desc="timing the fastest again", unit="kernel", disable=not progress, leave=False):
        _rerank(database, ranked, name, workloads[name], defaults[name], target)
    improved = _report_kept(ranked, workloads, defaults, target)
    seconds = time.perf_counter() - started
    log.info(
        "tuned %d kernels (%d reused) in %.1f s: %d candidates measured, %d failed; %d tuned schedules kept",
        len(missing),
        len(workloads) - len(missing),
        seconds,
        outcome.measured,
        outcome.failed,
        improved,
    )
    return TuningResult(
        ranked,
        work_dir,
        sum(1 for mod in workloads.values() if best_record(ranked, mod, target) is not None),
        len(missing),
        len(workloads) - len(missing),
        seconds,
        database_digest(ranked),
        outcome.measured,
        outcome.failed,
        improved,
    )


def _search(
    missing: dict[str, tvm.IRModule],
    target,
    searched: dict[str, int],
    wanted: int,
    work_dir: str,
    database,
    seed: int,
    deadline: float | None,
    progress,
    cost_model: str,
) -> _Outcome:
    """One MetaSchedule run: up to ``wanted`` trials for each of ``missing`` (task name -> workload),
    less those already searched, until ``deadline`` or an interrupt; its failures reported and the
    trials each task has had saved, then an interrupt raised again (after a batch: what was measured
    stays in the database).

    Tasks take turns (round-robin: a gradient scheduler picks them by measured times, so two runs
    would differ), and the search runs on one thread, seeded."""
    with _metaschedule_logs_into(os.path.join(work_dir, "logs")):
        import_tensor_intrinsics()
        names = sorted(missing)
        already = [searched.get(_searched_key(missing[name], target), 0) for name in names]
        trials = [max(1, wanted - done) for done in already]
        contexts = [
            ms.TuneContext(
                mod=missing[name],
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
        with interrupts_deferred(
            "stopping once the candidates being measured are timed (interrupt again to stop at once)"
        ) as stop:
            watch = _Progress(len(names), sum(trials), deadline, progress, stop)
            _run_search(contexts, target, trials, work_dir, database, cost_model, seed, watch)
        watch.close()
    outcome = _Outcome(watch.measured, watch.failed, watch.first_failure)
    _report_failures(outcome, os.path.join(work_dir, "logs"))
    done = {name: before + watch.trials[index] for index, (name, before) in enumerate(zip(names, already))}
    searched.update({_searched_key(missing[name], target): trials for name, trials in done.items()})
    _save_searched(work_dir, searched)
    if stop.requested.is_set():
        log.info("tuning interrupted after %d trials; what was measured is kept in %s", sum(done.values()), work_dir)
        raise KeyboardInterrupt
    return outcome


@dataclass(frozen=True)
class _Outcome:
    """What a search measured: candidates built and timed, those that failed, the first failure."""

    measured: int = 0
    failed: int = 0
    first_failure: str = ""


def _report_failures(outcome: _Outcome, log_dir: str) -> None:
    """A warning where candidates failed: a search whose every candidate fails leaves only the default
    schedules, which a user must not take for a tuned result."""
    if not outcome.failed:
        return
    if not outcome.measured:
        log.warning(
            "tuning measured no candidate: all %d failed (the first: %s); the default schedules stand (logs in %s)",
            outcome.failed,
            outcome.first_failure,
            log_dir,
        )
    else:
        log.info("tuning: %d candidates failed (the first: %s)", outcome.failed, outcome.first_failure)


def _seed_with_default_schedule(database, mod: tvm.IRModule, target, name: str) -> None:
    """A workload without records for ``target`` (its kind and thread count) gets the default rules'
    schedule as its first, timed here as the runner times candidates: the search starts from it, and
    what it finds is judged against it."""
    if best_record(database, mod, target) is not None:
        return
    default, _ = default_schedule(mod["main"], target)
    if default is None:
        return
    try:
        (seconds,) = _time_side_by_side(mod, [default], target)
    except Exception as error:  # noqa: BLE001 (a default schedule that does not build: the search has no seed)
        raise_if_interrupted()
        log.warning("the default schedule of %s does not run (%s); tuning starts without it", name, first_line(error))
        return
    _commit_record(database, mod, default.trace, seconds, target)


def _rerank(search, ranked, name: str, mod: tvm.IRModule, default, target) -> None:
    """Kernel ``name``'s fastest few search records (``_RERANKED``) that the search found faster than
    the default schedule (``default``, None where no rule applies), timed again taking turns with it
    on the same arguments; those times go to ``ranked``, whose fastest a build applies. Without such
    a record the default's search record goes there alone."""
    records = records_for(search, mod, target)
    default_text = str(default.trace) if default is not None else None
    seeded = next((r for r in records if str(r.trace) == default_text), None)
    challengers = [
        schedule for schedule in (replay(r, mod, name) for r in _faster_than(records, seeded)) if schedule is not None
    ]
    if not challengers:
        if seeded is not None:
            _commit_record(ranked, mod, seeded.trace, _mean_seconds(seeded), target)
        return
    schedules = ([default] if default is not None else []) + challengers
    try:
        seconds = _time_side_by_side(mod, schedules, target, rounds=_RERANK_ROUNDS)
    except Exception as error:  # noqa: BLE001 (TVM raises many types; the default schedule then stands)
        raise_if_interrupted()
        log.warning(
            "%s: its tuned schedules could not be timed again (%s); the default stands", name, first_line(error)
        )
        seconds = [_mean_seconds(seeded) if s is default and seeded is not None else math.inf for s in schedules]
    for schedule, taken in zip(schedules, seconds, strict=True):
        if math.isfinite(taken):
            _commit_record(ranked, mod, schedule.trace, taken, target)
    if default is not None and math.isfinite(min(seconds[1:])):
        log.info(
            "%s: %d schedule(s) the search timed faster than the default ran %.1f us at best beside its %.1f us: %s",
            name,
            len(challengers),
            min(seconds[1:]) * 1e6,
            seconds[0] * 1e6,
            "a tuned one is kept" if min(seconds[1:]) < seconds[0] else "the default stands",
        )


def _faster_than(records: list, seeded) -> list:
    """The fastest ``_RERANKED`` distinct schedules of ``records`` (fastest first) that are not the
    default's record ``seeded`` and were timed faster than it (any, without it)."""
    bar = _mean_seconds(seeded) if seeded is not None else math.inf
    seen = {str(seeded.trace)} if seeded is not None else set()
    fastest = []
    for record in records:
        if _mean_seconds(record) >= bar or len(fastest) == _RERANKED:
            break
        if str(record.trace) not in seen:
            seen.add(str(record.trace))
            fastest.append(record)
    return fastest


def _report_kept(ranked, workloads: dict[str, tvm.IRModule], defaults: dict, target) -> int:
    """How many workloads a build gives a tuned schedule (one faster than the default beside it); a
    warning where none, so that a tuned run that found nothing does not pass for a tuned one."""
    improved = 0
    for name, mod in workloads.items():
        kept = best_record(ranked, mod, target)
        default = defaults[name]
        improved += kept is not None and (default is None or str(kept.trace) != str(default.trace))
    if workloads and not improved:
        threads = threads_of(target)
        log.warning(
            "tuning found no schedule faster than the defaults for any of the %d kernels (%s%s): "
            "the builds use the default schedules",
            len(workloads),
            target.kind.name,
            f", {threads} thread{'s' * (threads != 1)}" if threads else "",
        )
    return improved


def _mean_seconds(record) -> float:
    """A record's time as MetaSchedule ranks records: the mean of its run times."""
    return statistics.fmean(float(s) for s in record.run_secs)


def _commit_record(database, mod: tvm.IRModule, trace, seconds: float, target) -> None:
    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    workload = database.commit_workload(mod)
    database.commit_tuning_record(ms.database.TuningRecord(trace, workload, [seconds], target, args_info))


def _time_side_by_side(mod: tvm.IRModule, schedules: list, target, rounds: int = 1) -> list[float]:
    """Seconds of each of ``schedules`` (of workload ``mod``), timed as the runner times candidates
    (``median_run_seconds``, the runner's arguments, the target's threads) on the same arguments
    (one set per parameter layout: a default schedule may read its weights packed), taking turns
    ``rounds`` times: the median of each one's timings."""
    modules = [tvm.tirx.build(schedule.mod, target=target) for schedule in schedules]
    device = tvm.cpu(0) if target.kind.name == "llvm" else tvm.device(target.kind.name, 0)
    if target.kind.name == "llvm":
        set_threads(threads_of(target))
    by_layout: dict[str, list] = {}
    arguments = []
    for schedule in schedules:
        args_info = [info.as_json() for info in ms.arg_info.ArgInfo.from_prim_func(schedule.mod["main"])]
        key = json.dumps(args_info, default=str)
        if key not in by_layout:
            by_layout[key] = alloc_arguments(device, args_info, 1)
        arguments.append(by_layout[key])
    samples: list[list[float]] = [[] for _ in modules]
    for _ in range(rounds):
        for module, given, taken in zip(modules, arguments, samples, strict=True):
            taken.extend(median_run_seconds(module, device, _evaluator(target), given))
    return [statistics.median(taken) for taken in samples]


def _evaluator(target) -> EvaluatorConfig:
    return _CPU_EVALUATOR if target.kind.name == "llvm" else _GPU_EVALUATOR


def median_run_seconds(rt_mod, device, evaluator_config: EvaluatorConfig, repeated_args: list) -> list[float]:
    """A candidate's time, as the runner reports it: MetaSchedule's timing (``run_evaluator_common``)
    reduced to its median. MetaSchedule ranks records by the mean of their times, which one run
    the busy machine preempted would move."""
    return [statistics.median(run_evaluator_common(rt_mod, device, evaluator_config, repeated_args))]


DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")  # MetaSchedule's JSON database


def open_database(work_dir: str):
    """The MetaSchedule JSON database (``database_workload.json`` and ``database_tuning_record.json``)
    that builds apply: in ``work_dir/ranked`` where tuning here ranked its records, else in ``work_dir``
    itself (a database MetaSchedule's own tools wrote)."""
    ranked = os.path.join(work_dir, RANKED_DIR)
    if all(os.path.isfile(os.path.join(ranked, name)) for name in DATABASE_FILES):
        return _json_database(ranked, allow_missing=False)
    paths = [os.path.join(work_dir, name) for name in DATABASE_FILES]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise DivimlInputError(
            f"no MetaSchedule database: {missing[0]} does not exist",
            source=work_dir,
            hint="give the work_dir that MetaSchedule tuning wrote",
        )
    return _json_database(work_dir, allow_missing=False)


def _json_database(work_dir: str, *, allow_missing: bool):
    """MetaSchedule's JSON database over ``work_dir``, its damaged lines healed first (``heal_database``).
    A database TVM still cannot read is refused in one line, never a traceback."""
    heal_database(work_dir)
    try:
        return ms.database.JSONDatabase(work_dir=work_dir, allow_missing=allow_missing)
    except Exception as error:  # TVM raises its own error types for a file it cannot parse
        raise_if_interrupted()
        raise DivimlInputError(
            f"TVM cannot read this MetaSchedule database ({first_line(error)})",
            source=work_dir,
            hint="move the folder aside to start a new database (diviml cache clear does it for the cache's own)",
        ) from None


def heal_database(work_dir: str) -> None:
    """Drop the lines of a MetaSchedule database that an interrupted write or a damaged disk left
    unreadable (MetaSchedule fails on the first with "Unexpected EOF", and every later tuning run with
    it): any damaged record line, a damaged last workload line, and the records that name a workload
    past the end. The file as it was is kept beside it (``.damaged``), with a warning. A damaged
    workload line before the last cannot be dropped (records name workloads by line): refused, saying how to
    start again."""
    workloads_path, records_path = (os.path.join(work_dir, name) for name in DATABASE_FILES)
    workloads = _lines(workloads_path)
    damaged = [i for i, line in enumerate(workloads) if not _is_workload_line(line)]
    if damaged and damaged != [len(workloads) - 1]:
        raise DivimlInputError(
            f"line {damaged[0] + 1} of {DATABASE_FILES[0]} is damaged, and records name the workloads after it "
            "by their line",
            source=work_dir,
            hint="move the folder aside to start a new database (diviml cache clear does it for the cache's own)",
        )
    kept_workloads = workloads[: len(workloads) - len(damaged)]
    records = _lines(records_path)
    kept_records = [line for line in records if _is_record_line(line, len(kept_workloads))]
    for path, lines, kept in ((workloads_path, workloads, kept_workloads), (records_path, records, kept_records)):
        if len(kept) == len(lines):
            continue
        shutil.copyfile(path, path + ".damaged")
        write_text(path, "".join(line + "\n" for line in kept), "the healed tuning database")
        log.warning(
            "%s: dropped %d damaged line(s) (an interrupted write?); the file as it was is kept as %s.damaged",
            path,
            len(lines) - len(kept),
            os.path.basename(path),
        )


def _parsed(line: str):
    """A database line's JSON, or None where it is not JSON (cut short)."""
    try:
        return json.loads(line)
    except ValueError:
        return None


def _lines(path: str) -> list[str]:
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as file:
        return [line.rstrip("\n") for line in file if line.strip()]


def _is_workload_line(line: str) -> bool:
    """``[structural hash, serialized module]``, as MetaSchedule writes a workload."""
    entry = _parsed(line)
    return isinstance(entry, list) and len(entry) == 2 and all(isinstance(part, str) for part in entry)


def _is_record_line(line: str, workloads: int) -> bool:
    """``[workload line, [trace, run_secs, target, args_info]]`` naming one of the ``workloads`` kept."""
    entry = _parsed(line)
    return (
        isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], int)
        and 0 <= entry[0] < workloads
        and isinstance(entry[1], list)
        and len(entry[1]) == 4
    )


def check_database_covers(database, funcs: dict[str, tirx.PrimFunc], targets: list, source: str) -> None:
    """A user's database (``--tuning-db``) must hold records for this model's kernels on these targets
    (each of its kind and CPU thread count): one made for another model, another size of it, or
    another thread count matches none and would leave every kernel on the default schedules without a
    word; refused, naming the first kernel. One that covers some kernels is used, with a warning."""
    targets = [as_target(t) for t in targets]
    workloads = {name: workload_module(func) for name, func in sorted(funcs.items())}
    missing = [
        (name, target)
        for name, mod in workloads.items()
        for target in targets
        if best_record(database, mod, target) is None
    ]
    if not workloads or not targets or not missing:
        return
    covered = len(workloads) * len(targets) - len(missing)
    name, target = missing[0]
    where = f"{target.kind.name}" + (f" on {threads_of(target)} thread(s)" if threads_of(target) else "")
    if not covered:
        raise DivimlInputError(
            f"the tuning database has no record for any kernel of this model (the first: '{name}' for {where}): "
            "it was made for another model, another size of it or another thread count",
            source=source,
            hint="tune this model (--tune or --tune-minutes), or give the database tuned for it",
        )
    log.warning(
        "the tuning database %s has records for %d of %d kernel and target pairs (none for '%s' for %s): "
        "the others keep the default schedules",
        source,
        covered,
        covered + len(missing),
        name,
        where,
    )


# ---------------------------------------------------------------------- search
def _run_search(
    contexts, target, trials: list[int], work_dir: str, database, cost_model: str, seed: int, watch
) -> None:
    """MetaSchedule's search over ``contexts``, candidates built and run in worker processes, which
    are stopped when it ends, however it ends. The runner's process runs a CPU's candidates on the
    target's threads (it would have every core's: ``TVM_NUM_THREADS``)."""
    builder = _PooledBuilder(max_workers=os.cpu_count() or 1, initializer=import_tensor_intrinsics)
    runner = ms.runner.LocalRunner(
        evaluator_config=_evaluator(target),
        f_alloc_argument=alloc_arguments,
        f_run_evaluator=median_run_seconds,
        initializer=functools.partial(set_threads, threads_of(target)) if target.kind.name == "llvm" else None,
    )
    try:
        ms.tune_tasks(
            tasks=contexts,
            task_weights=[1.0] * len(contexts),
            work_dir=work_dir,
            max_trials_global=sum(trials),
            max_trials_per_task=max(trials),
            num_trials_per_iter=min(max(trials), _MAX_TRIALS_PER_ITER),
            builder=builder,
            runner=runner,
            database=database,
            cost_model=_cost_model(cost_model, seed),
            measure_callbacks=[
                ms.measure_callback.AddToDatabase(),
                ms.measure_callback.RemoveBuildArtifact(),
                ms.measure_callback.UpdateCostModel(),
                watch,
            ],
            task_scheduler="round-robin",
        )
    finally:
        builder.close()
        runner.pool.shutdown()


@derived_object
class _PooledBuilder(ms.builder.LocalBuilder._cls):
    """MetaSchedule's ``LocalBuilder`` with one pool of worker processes (on every core) for the whole
    search. ``LocalBuilder`` starts a pool for every batch of candidates, against a leak in long-lived
    workers, and a worker's first build imports TVM's tensor intrinsics (36-51 s here, past the 30 s
    timeout: every candidate failed). These workers start with ``import_tensor_intrinsics`` (the
    initializer ``_run_search`` gives) and are restarted after ``_BUILDS_PER_WORKER`` builds."""

    def _sanity_check(self) -> None:
        # LocalBuilder checks its build and export functions in a pool of its own (5 s); these are
        # always its defaults (``_build_candidate``), so the pool is only made here.
        self._pool = PopenPoolExecutor(
            max_workers=self.max_workers,
            timeout=self.timeout_sec,
            initializer=self.initializer,
            maximum_process_uses=_BUILDS_PER_WORKER,
        )

    def build(self, build_inputs: list) -> list:
        jobs = [(b.mod, b.target) for b in build_inputs]  # TIR candidates carry no params
        return [self._result(done) for done in self._pool.map_with_error_catching(_build_candidate, jobs)]

    def _result(self, done) -> ms.builder.BuilderResult:
        if done.status == StatusKind.COMPLETE:
            return ms.builder.BuilderResult(done.value, None)
        if done.status == StatusKind.TIMEOUT:
            return ms.builder.BuilderResult(None, f"LocalBuilder: Timeout, killed after {self.timeout_sec} seconds")
        return ms.builder.BuilderResult(None, f"LocalBuilder: An exception occurred\n{done.value}")

    def close(self) -> None:
        self._pool.shutdown()


def _cost_model(kind: str, seed: int):
    """MetaSchedule's XGBoost cost model ("xgb"; "auto": where xgboost is installed) or its random one."""
    import importlib.util

    if kind == "auto" and importlib.util.find_spec("xgboost") is None:
        log.warning("xgboost is not installed: tuning ranks candidates at random (pip install 'tvm-diviml[tune]')")
        kind = "random"
    if kind == "random":
        return ms.CostModel.create("random", seed=seed)
    return ms.CostModel.create("xgb", num_tuning_cores=os.cpu_count() or 1)


@derived_object
class _Progress(PyMeasureCallback):
    """A progress bar: over the budget's seconds (with the trials measured so far) when minutes bound
    the search, else over its trials; at ``deadline`` or once ``stop`` is requested every task ends."""

    def __init__(self, tasks: int, total_trials: int, deadline: float | None, show, stop: Stop):
        super().__init__()
        self.trials = [0] * tasks
        self.measured = self.failed = 0
        self.first_failure = ""
        self.deadline, self.started, self.stop = deadline, time.perf_counter(), stop
        if deadline is None:
            self.bar = tqdm(total=total_trials, desc=f"tuning {tasks} kernels", unit="trial", disable=not show)
        else:
            seconds = max(0.0, deadline - self.started)
            self.bar = tqdm(total=round(seconds), desc=f"tuning {tasks} kernels", unit="s", disable=not show)

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        self.trials[task_id] += len(measure_candidates)
        for built, ran in zip(builder_results, runner_results):
            error = built.error_msg or ran.error_msg
            self.measured += not error
            self.failed += bool(error)
            self.first_failure = self.first_failure or (_failure_summary(error) if error else "")
        now = time.perf_counter()
        if self.deadline is None:
            self.bar.update(len(measure_candidates))
        else:
            self.bar.update(min(round(now - self.started), self.bar.total) - self.bar.n)
            self.bar.set_postfix_str(f"{sum(self.trials)} trials")
        if self.stop.requested.is_set() or (self.deadline is not None and now >= self.deadline):
            for index in range(len(self.trials)):
                task_scheduler.terminate_task(index)

    def close(self) -> None:
        self.bar.close()


def _build_candidate(job: tuple) -> str:
    """In a build worker: one candidate built and exported as ``LocalBuilder`` does by default; the
    exported file's path."""
    mod, target = job
    return default_export(default_build(mod, target, None))


def _failure_summary(error: str) -> str:
    """A candidate's error in one line: MetaSchedule's heading and the cause under it (the rest is the
    candidate's whole TVMScript)."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    return " ".join(lines[:2])[:300]


def alloc_arguments(device, args_info, alloc_repeat: int) -> list:
    """The runner's arguments for a candidate: random floats (MetaSchedule's), integer buffers all
    zero. Integer buffers are indices (a gather's token ids): random ones run out of bounds, and TVM's
    gathers do not check (a segfault, seen with BERT's embedding). Zeros are always in bounds."""
    random_fill = tvm.get_global_func("tvm.contrib.random.random_fill_for_measure")
    arg_sets = alloc_argument_common(random_fill, device, args_info, alloc_repeat)
    for arguments in arg_sets:
        for tensor in arguments:
            if np.issubdtype(np.dtype(str(tensor.dtype)), np.integer):
                tensor.copyfrom(np.zeros(tuple(tensor.shape), dtype=str(tensor.dtype)))
    return arg_sets


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


def _distinct_workloads(funcs: dict[str, tirx.PrimFunc]) -> dict[str, tvm.IRModule]:
    """One workload per structurally distinct PrimFunc, named after the first name (sorted) it has."""
    workloads: dict[str, tvm.IRModule] = {}
    seen: set[str] = set()
    for name in sorted(funcs):
        mod = workload_module(funcs[name])
        key = workload_key(mod)
        if key not in seen and not is_scheduled(funcs[name]):
            seen.add(key)
            workloads[name] = mod
    return workloads


def _searched_key(mod: tvm.IRModule, target: tvm.target.Target) -> str:
    """What ``searched.json`` counts trials under: the workload, and the threads its records are for."""
    return f"{workload_key(mod)}@{threads_of(target) or 0}"


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
    text = json.dumps({"trials": dict(sorted(searched.items()))}, indent=1)
    write_text(os.path.join(work_dir, _SEARCHED_FILE), text, "the tuning progress")


def _check_one_target_kind(database, target, work_dir: str) -> None:
    kinds = {record.target.kind.name for record in database.get_all_tuning_records()}
    if kinds - {target.kind.name}:
        raise DivimlInputError(
            f"the tuning database holds {', '.join(sorted(kinds))} records, not {target.kind.name} ones",
            source=work_dir,
            hint="use one work_dir per target",
        )
