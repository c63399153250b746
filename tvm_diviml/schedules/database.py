"""Builds that apply a MetaSchedule tuning database: each PrimFunc the database holds a record for
(of the build's target kind and, on a CPU, its thread count) takes that record's schedule, and the
default rules schedule the rest (``schedule_for_target``). Tuning itself is ``profiling.tuning``.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import statistics
import sys
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx

from ..errors import raise_if_interrupted
from .apply import schedule_module

log = logging.getLogger(__name__)


def schedule_for_target(mod, target, database=None):
    """The module's PrimFuncs scheduled as the heterogeneous build schedules them on ``target``: a
    tuning database's records where it has them, the default rules (``schedules/``) for the rest.
    Each carries what scheduled it (``schedules.apply.schedule_names``): a rule, or "tuned" where the
    database's best record is not that rule's own schedule."""
    default = schedule_module(mod, target)
    if database is None:
        return default
    tuned = schedule_module(apply_database(mod, target, database).mod, target)
    for gvar, func in tuned.functions_items():
        rule = default[gvar]
        if isinstance(func, tirx.PrimFunc) and tvm_ffi.structural_equal(rule.body, func.body, map_free_vars=True):
            tuned[gvar] = rule  # the database's best record is the rule's own schedule
    return tuned


@dataclass(frozen=True)
class AppliedDatabase:
    """A module with the database's schedules in place of the kernels it has records for."""

    mod: tvm.IRModule
    scheduled: int  # PrimFuncs replaced by their best record's schedule
    unscheduled: int  # PrimFuncs left as they were: no usable record, another device's,


def apply_database(mod: tvm.IRModule, target, database) -> AppliedDatabase:
    """Schedule every PrimFunc of ``mod`` that ``database`` has a ``target``-kind record for.

    Works on a module of standalone PrimFuncs and on a lowered Relax module alike (the same result as
    ``relax.transform.MetaScheduleApplyDatabase`` there, which only matches PrimFuncs without a symbol).
    A PrimFunc whose own ``target`` attribute is of another kind (a GPU kernel of a placed module) is
    left alone. The database is only read: unknown workloads are not added to it.
    """
    target = as_target(target)
    functions = dict(mod.functions_items())
    scheduled = 0
    for global_var, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
            continue
        own_target = func.attrs.get("target") if func.attrs is not None else None
        if own_target is not None and own_target.kind.name != target.kind.name:
            continue
        schedule = best_schedule(database, workload_module(func), target, global_var.name_hint)
        if schedule is not None:
            functions[global_var] = restore_attrs(schedule.mod["main"], func)
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
    target = as_target(target)
    record = best_record(database, workload_module(func), target)
    if record is None:
        return None
    return statistics.median(float(s) for s in record.run_secs)


def database_digest(database) -> str:
    """A digest of what a build applying ``database`` would run: for each workload and each target
    (a CPU's thread count apart), its best record's schedule. Records that change no best leave it as
    it is; run times do too."""
    best: dict[str, str] = {}
    for workload in {record.workload: None for record in database.get_all_tuning_records()}:
        key = workload_key(workload.mod)
        # records share their Workload object: one lookup each, fastest first
        for record in database.get_top_k(workload, 1 << 30):
            best.setdefault(f"{key}@{record.target.kind.name}{threads_of(record.target) or 0}", str(record.trace))
    text = "\n".join(f"{key}\n{best[key]}" for key in sorted(best))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tuning_target(target) -> tvm.target.Target:
    """``target`` as MetaSchedule needs it: an llvm target must state ``num-cores`` (this machine's
    core count unless given), or the search refuses it."""
    target = as_target(target)
    if target.kind.name != "llvm" or target.attrs.get("num-cores"):
        return target
    return tvm.target.Target({**target.export(), "num-cores": os.cpu_count() or 1})


def as_target(target) -> tvm.target.Target:
    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


def workload_module(func: tirx.PrimFunc) -> tvm.IRModule:
    """The IRModule a record of ``func`` is filed under (what MetaSchedule's own normalisation makes of
    a PrimFunc without a symbol, which is how a Relax build presents it)."""
    if func.attrs is not None and "target" in func.attrs:
        func = func.without_attr("target")
    func = func.with_attr("global_symbol", "main").with_attr("tirx.noalias", True)
    return tvm.IRModule({"main": func})


def workload_key(mod: tvm.IRModule) -> str:
    """A workload's process-stable structural hash, as text."""
    return f"{tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFFFFFF:016x}"


def threads_of(target: tvm.target.Target) -> int | None:
    """The threads an llvm target's schedule runs on (``tuning_target``'s rule); None for other kinds."""
    return int(tuning_target(target).attrs["num-cores"]) if target.kind.name == "llvm" else None


def records_for(database, mod: tvm.IRModule, target) -> list:
    """The measured records of ``mod`` for ``target``, fastest first: of its kind and, for a CPU, its
    thread count. A schedule tuned for one thread has no parallel loops: applied to a build on every
    core it ran resnet50 1.6x slower than the default rules (62.4 against 39.1 ms here)."""
    if not database.has_workload(mod):
        return []
    wanted = threads_of(target)
    return [
        r
        for r in database.get_top_k(database.commit_workload(mod), 1 << 30)
        if r.target.kind.name == target.kind.name and threads_of(r.target) == wanted
    ]


def best_record(database, mod: tvm.IRModule, target=None):
    """The fastest measured record of ``mod`` for ``target`` (when given, ``records_for``'s)."""
    if target is None:
        records = database.get_top_k(database.commit_workload(mod), 1) if database.has_workload(mod) else []
    else:
        records = records_for(database, mod, target)
    return records[0] if records else None


def best_schedule(database, mod: tvm.IRModule, target, name: str):
    """The best record's schedule of ``mod`` (``replay``), or None without a usable record."""
    record = best_record(database, mod, target)
    return None if record is None else replay(record, mod, name)


def replay(record, mod: tvm.IRModule, name: str):
    """``record``'s trace replayed on ``mod``: its schedule, or None where it no longer replays (a
    record from a database of another TVM version), with a warning naming kernel ``name``."""
    if any(inst.kind.name == "Tensorize" for inst in record.trace.insts):
        import_tensor_intrinsics()
    schedule = tvm.s_tir.Schedule(mod)
    try:
        record.trace.apply_to_schedule(schedule, remove_postproc=False)
    except Exception as error:  # TVM raises its own error types for every failed step
        raise_if_interrupted()
        log.warning(
            "the tuning record of %s does not apply (%s); it stays unscheduled",
            name,
            str(error).splitlines()[0] if str(error) else type(error).__name__,
        )
        return None
    return schedule


def restore_attrs(scheduled: tirx.PrimFunc, original: tirx.PrimFunc) -> tirx.PrimFunc:
    """The scheduled function with the original's symbol and target, marked as scheduled."""
    attrs = original.attrs if original.attrs is not None else {}
    scheduled = scheduled.without_attr("global_symbol")
    for key in ("global_symbol", "target"):
        if key in attrs:
            scheduled = scheduled.with_attr(key, attrs[key])
    return scheduled.with_attr("tirx.is_scheduled", True)


def is_scheduled(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))


def import_tensor_intrinsics() -> None:
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
