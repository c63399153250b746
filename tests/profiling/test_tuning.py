"""MetaSchedule tuning: records for each distinct kernel, builds that apply them, resuming, the digest.

One small tuning run (a matmul and ResNet-18's stem convolution, 2 trials each) is shared by the
module (about a minute on 2 cores: the worker processes import TVM); searches of their own are slow.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import types

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, te
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.passes.apply_plan import packed_params
from tvm_diviml.presets import cpu2
from tvm_diviml.profiling import measured, profiler, tuning
from tvm_diviml.profiling.timing import single_device_configurations
from tvm_diviml.runtime.packing import pack_array
from tvm_diviml.schedules import database as schedules_database
from tvm_diviml.schedules.apply import default_schedule
from tvm_diviml.schedules.target import device_target

from ..helpers import HANG_GUARD_S, wait_until

TRIALS = 2


def matmul(n: int):
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return te.create_prim_func([a, b, c])


@pytest.fixture(scope="module")
def resnet():
    from tvm_diviml.passes.extract import extract
    from tvm_diviml.zoo import build_model

    extraction = extract(build_model("resnet18", {"resolution": 32, "classes": 10}).mod)
    stem = next(f for f in extraction.kernel_func.values() if f.startswith("fused_conv2d"))  # after the NHWC input
    return extraction.mod, stem


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, resnet):
    mod, stem = resnet
    funcs = {"mm": matmul(64), "mm_again": matmul(64), stem: mod[stem]}
    work_dir = str(tmp_path_factory.mktemp("tuning"))
    return tuning.tune_primfuncs(funcs, "llvm", tuning.TuningBudget(TRIALS), work_dir, seed=0, progress=False), funcs


def run_kernel(func, args: list[np.ndarray], out_shape, dtype="float32") -> np.ndarray:
    """Compile one PrimFunc for llvm and run it on ``args``; returns its (last) output."""
    executable = tvm.compile(tvm.IRModule({"kernel": func.with_attr("global_symbol", "kernel")}), target="llvm")
    device = tvm.cpu()
    out = tvm.runtime.empty(out_shape, dtype, device)
    executable["kernel"](*[tvm.runtime.tensor(a, device) for a in args], out)
    return out.numpy()


def random_args(func, seed=0) -> tuple[list[np.ndarray], tuple[int, ...]]:
    """Random inputs for every buffer but the last (the output), and the output's shape."""
    rng = np.random.default_rng(seed)
    shapes = [tuple(int(d) for d in info.shape) for info in ms.arg_info.ArgInfo.from_prim_func(func)]
    return [rng.standard_normal(s).astype("float32") for s in shapes[:-1]], shapes[-1]


def search_database(work_dir):
    """The search's own records (``TuningResult.database`` holds those timed again beside the defaults)."""
    return ms.database.JSONDatabase(work_dir=str(work_dir), allow_missing=False)


def records_of(database, func) -> list:
    """The database's records for ``func`` (filed under the symbol "main")."""
    workload = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    return [r for r in database.get_all_tuning_records() if tvm_ffi.structural_equal(r.workload.mod, workload)]


def test_a_search_builds_and_times_its_candidates(tmp_path):
    """Each candidate builds and runs in the worker processes and becomes a record beside the default
    schedule's. (Build workers that imported TVM's tensor intrinsics the slow way, a pool per batch,
    timed out on every candidate, and the search left the default schedule alone.)"""
    func = matmul(16)
    work_dir = str(tmp_path / "search")
    result = tuning.tune_primfuncs(
        {"mm": func}, "llvm", tuning.TuningBudget(TRIALS), work_dir, seed=0, progress=False, cost_model="random"
    )
    assert (result.measured, result.failed) == (TRIALS, 0)
    assert len(records_of(search_database(work_dir), func)) == TRIALS + 1
    assert result.workloads == 1 and records_of(result.database, func)  # ranked: what builds apply


def test_a_cpu_candidate_is_timed_cold_one_run_per_repeat_and_keeps_the_median():
    """Inside a model a kernel's weights are not in the cache: each timed run follows a flush of every
    argument but the first (the input its predecessor just wrote), so each repeat is one run."""
    calls = []

    class Kernel:
        entry_name = "main"

        def time_evaluator(self, **settings):
            calls.append(settings)
            return lambda *args: types.SimpleNamespace(results=[3e-6, 1e-6, 2e-6])

    cpu = tuning._evaluator(schedules_database.tuning_target("llvm"))
    assert tuning.median_run_seconds(Kernel(), tvm.cpu(), cpu, [[]]) == [2e-6]
    (settings,) = calls
    assert settings["f_preproc"] == "cache_flush_cpu_non_first_arg"
    assert (settings["number"], settings["min_repeat_ms"]) == (1, 0) and settings["repeat"] >= 5
    assert not tuning._evaluator(tvm.target.Target({"kind": "cuda", "arch": "sm_80"})).enable_cpu_cache_flush


def naive(mod) -> tvm.s_tir.Schedule:
    """The matmul's loops as written: a schedule of one step (MetaSchedule's database ignores an empty trace)."""
    schedule = tvm.s_tir.Schedule(mod)
    schedule.get_loops(schedule.get_sblock("C"))
    return schedule


def search_finding(trace_of, monkeypatch):
    """A search (monkeypatched) that records, for each kernel, the schedule ``trace_of(mod)`` as timed
    in 1 ns: faster than anything, as the search's luckiest timing can claim."""

    def search(missing, target, searched, wanted, work_dir, database, *rest):
        for mod in missing.values():
            tuning._commit_record(database, mod, trace_of(mod), 1e-9, target)
        return tuning._Outcome(measured=len(missing))

    monkeypatch.setattr(tuning, "_search", search)


def cold_timings(monkeypatch) -> list:
    """The evaluator settings of every timing taken in this process (the default's and the re-ranking's)."""
    settings = []

    def spy(rt_mod, device, evaluator_config, repeated_args):
        settings.append(evaluator_config)
        return run_evaluator_common(rt_mod, device, evaluator_config, repeated_args)

    monkeypatch.setattr(tuning, "run_evaluator_common", spy)
    return settings


def test_a_search_record_slower_beside_the_default_is_not_kept_and_the_run_says_so(tmp_path, monkeypatch, caplog):
    """The search's record claims 1 ns, but the unscheduled loop it holds runs slower than the default
    schedule when the two take turns: the default stands, and tuning says it found nothing."""
    func = matmul(64)
    search_finding(lambda mod: naive(mod).trace, monkeypatch)
    timings = cold_timings(monkeypatch)
    with caplog.at_level(logging.INFO, logger="tvm_diviml.profiling.tuning"):
        result = tuning.tune_primfuncs({"mm": func}, "llvm", tuning.TuningBudget(1), str(tmp_path), progress=False)
    assert (result.workloads, result.improved) == (1, 0)
    assert "tuning found no schedule faster than the defaults for any of the 1 kernels" in caplog.text
    assert "the default stands" in caplog.text
    target = schedules_database.tuning_target("llvm")
    default, _ = default_schedule(func.with_attr("global_symbol", "main"), target)
    kept = schedules_database.best_record(result.database, schedules_database.workload_module(func), target)
    assert str(kept.trace) == str(default.trace)
    assert timings and all(config.enable_cpu_cache_flush and config.number == 1 for config in timings)
    assert tuning.open_database(str(tmp_path)).get_all_tuning_records()  # --tuning-db reads the ranked ones


def test_a_search_record_faster_beside_the_default_is_kept(tmp_path, monkeypatch, caplog):
    """The other way round: a default that is the unscheduled loop, and a search that found the rules'
    schedule. Timed taking turns, the found one is faster and kept, and nothing is reported missing."""
    func = matmul(64)
    target = schedules_database.tuning_target("llvm")
    rules, _ = default_schedule(func.with_attr("global_symbol", "main"), target)
    monkeypatch.setattr(tuning, "default_schedule", lambda func, target: (naive(func), "Unscheduled"))
    search_finding(lambda mod: rules.trace, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tvm_diviml.profiling.tuning"):
        result = tuning.tune_primfuncs({"mm": func}, "llvm", tuning.TuningBudget(1), str(tmp_path), progress=False)
    assert result.improved == 1 and "found no schedule" not in caplog.text
    kept = schedules_database.best_record(result.database, schedules_database.workload_module(func), target)
    assert str(kept.trace) == str(rules.trace) and kept.run_secs[0] > 1e-9  # its time is the one taken again


def test_tuning_searches_for_the_target_the_kept_whole_cpu_build_has(monkeypatch, tmp_path):
    """cpu2 usually keeps the whole CPU as one device (every core's threads): its build's target is
    one tuning searches, and a record of that search applies to that build."""
    searched = []
    monkeypatch.setenv("DIVIML_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(measured, "tune_primfuncs", lambda funcs, target, *args, **kwargs: searched.append(target))
    platform = cpu2()
    extraction = types.SimpleNamespace(mod=tvm.IRModule({"mm": matmul(16)}), kernel_func={"matmul": "mm"})
    profiler.tuning_for(platform, extraction, tune=tuning.TuningBudget(1), progress=False)
    device, threads = max(single_device_configurations(platform).values(), key=lambda kept: kept[1] or 0)
    kept = device_target(platform.with_threads(device.name, threads).device(device.name))
    assert any(target.export() == kept.export() for target in searched), [t.export() for t in searched]
    one_record_database(tmp_path / "db", target=kept)
    database = tuning.open_database(str(tmp_path / "db"))
    assert schedules_database.apply_database(tvm.IRModule({"mm": matmul(16)}), kept, database).scheduled == 1


@pytest.mark.slow  # shares the module's search (about 2 minutes on 2 cores)
def test_tuning_records_each_distinct_kernel_once(tuned):
    result, funcs = tuned
    assert (result.workloads, result.tuned, result.reused) == (2, 2, 0)  # mm_again is mm
    assert os.path.isfile(os.path.join(result.work_dir, "database_tuning_record.json"))
    for func in funcs.values():
        seconds = schedules_database.tuned_seconds(result.database, func, "llvm")
        assert seconds is not None and 0 < seconds < 1
    assert len(result.database.get_all_tuning_records()) <= 2 * (TRIALS + 1)  # + the default schedule's
    assert schedules_database.tuned_seconds(result.database, matmul(32), "llvm") is None


@pytest.mark.slow  # shares the module's search (about 2 minutes on 2 cores)
def test_metaschedule_logs_go_to_the_work_dir(tuned):
    result, _ = tuned
    with open(os.path.join(result.work_dir, "logs", "tuning.log")) as file:
        assert "Trial #1" in file.read()
    assert logging.getLogger("tvm.s_tir.meta_schedule").propagate


@pytest.mark.slow  # shares the module's search (about 2 minutes on 2 cores)
def test_applied_schedule_changes_the_kernel_not_its_numbers(tuned):
    result, funcs = tuned
    mod = tvm.IRModule({"mm": funcs["mm"]})
    applied = schedules_database.apply_database(mod, "llvm", result.database)
    assert (applied.scheduled, applied.unscheduled) == (1, 0)
    scheduled = applied.mod["mm"]
    assert not tvm_ffi.structural_equal(scheduled, mod["mm"])
    assert scheduled.attrs["tirx.is_scheduled"] and scheduled.attrs["global_symbol"] == "main"
    args, out_shape = random_args(mod["mm"])
    np.testing.assert_allclose(
        run_kernel(scheduled, args, out_shape), run_kernel(mod["mm"], args, out_shape), rtol=1e-5, atol=1e-5
    )


@pytest.mark.slow  # shares the module's search (about 2 minutes on 2 cores)
def test_fused_kernel_matches_its_record_under_another_name(tuned, resnet):
    result, _ = tuned
    mod, stem = resnet
    renamed = mod[stem].with_attr("global_symbol", "stem_conv_on_cpu")
    applied = schedules_database.apply_database(tvm.IRModule({"stem_conv_on_cpu": renamed}), "llvm", result.database)
    assert applied.scheduled == 1
    assert applied.mod["stem_conv_on_cpu"].attrs["global_symbol"] == "stem_conv_on_cpu"
    assert schedules_database.tuned_seconds(result.database, renamed, "llvm") == schedules_database.tuned_seconds(
        result.database, mod[stem], "llvm"
    )
    args, out_shape = random_args(renamed)
    scheduled = applied.mod["stem_conv_on_cpu"]
    packed = packed_params(renamed, scheduled)  # the stem's weights, read packed as the runtime uploads them
    given = [pack_array(a, packed[i]) if i in packed else a for i, a in enumerate(args)]
    np.testing.assert_allclose(
        run_kernel(scheduled, given, out_shape),
        run_kernel(renamed, args, out_shape),
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.slow  # shares the module's search (about 2 minutes on 2 cores)
def test_on_a_lowered_relax_module_it_does_what_metaschedule_does(tuned, resnet):
    result, _ = tuned
    mod, stem = resnet
    ours = schedules_database.apply_database(mod, "llvm", result.database)
    with tvm.target.Target("llvm"), result.database:
        theirs = relax.transform.MetaScheduleApplyDatabase()(mod)
    assert ours.scheduled == 1 and ours.unscheduled > 10
    assert not tvm_ffi.structural_equal(ours.mod[stem], mod[stem])
    assert tvm_ffi.structural_equal(ours.mod, theirs)


@pytest.mark.slow  # shares the module's search (about 2 minutes on 2 cores)
def test_kernels_without_a_record_or_for_another_device_are_left_alone(tuned):
    result, funcs = tuned
    workloads = os.path.join(result.work_dir, "database_workload.json")
    size = os.path.getsize(workloads)
    gpu_mm = funcs["mm"].with_attr("target", tvm.target.Target({"kind": "cuda", "arch": "sm_80"}))
    mod = tvm.IRModule({"small": matmul(32), "gpu_mm": gpu_mm})
    applied = schedules_database.apply_database(mod, "llvm", result.database)
    assert (applied.scheduled, applied.unscheduled) == (0, 2)
    assert tvm_ffi.structural_equal(applied.mod, mod)
    assert os.path.getsize(workloads) == size  # looking up adds no workload


@pytest.mark.slow  # shares the module's search (about 2 minutes on 2 cores)
def test_a_record_tuned_for_one_thread_count_is_not_applied_on_another(tuned):
    result, funcs = tuned
    mod = tvm.IRModule({"mm": funcs["mm"]})
    threads = os.cpu_count() or 1  # the fixture tuned for "llvm": every core
    other = tvm.target.Target({"kind": "llvm", "num-cores": threads + 1})
    assert schedules_database.apply_database(mod, other, result.database).scheduled == 0
    assert schedules_database.tuned_seconds(result.database, funcs["mm"], other) is None
    same = tvm.target.Target({"kind": "llvm", "num-cores": threads})
    assert schedules_database.apply_database(mod, same, result.database).scheduled == 1
    assert schedules_database.tuned_seconds(result.database, funcs["mm"], same) > 0


@pytest.mark.slow  # shares the module's search, and a search of one thread (about 1 minute)
def test_another_thread_count_is_searched_beside_the_first_in_one_work_dir(tuned, tmp_path):
    """The whole CPU and its one-thread cores are tuned apart: a second thread count starts from its
    own default schedule, its records apply to its builds only, and the first's stay as they were."""
    result, funcs = tuned
    work_dir = str(tmp_path / "both")
    shutil.copytree(result.work_dir, work_dir)
    one = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    every = schedules_database.tuning_target("llvm")
    mm = {"mm": funcs["mm"]}
    again = tuning.tune_primfuncs(mm, one, tuning.TuningBudget(TRIALS), work_dir, seed=0, progress=False)
    assert (again.tuned, again.reused) == (1, 0)
    assert again.digest != result.digest
    for target in (one, every):
        assert schedules_database.tuned_seconds(again.database, funcs["mm"], target) > 0
    resumed = tuning.tune_primfuncs(mm, one, tuning.TuningBudget(TRIALS), work_dir, seed=0, progress=False)
    assert (resumed.tuned, resumed.digest) == (0, again.digest)


@pytest.mark.slow  # shares the module's search (about 2 minutes on 2 cores)
def test_a_placed_cpu_kernel_keeps_its_target(tuned):
    result, funcs = tuned
    cpu = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    mod = tvm.IRModule({"mm": funcs["mm"].with_attr("target", cpu)})
    applied = schedules_database.apply_database(mod, "llvm", result.database)
    assert applied.scheduled == 1
    assert applied.mod["mm"].attrs["target"].kind.name == "llvm"


@pytest.mark.slow  # shares the module's search (about 2 minutes on 2 cores)
def test_resuming_does_not_search_again(tuned):
    result, funcs = tuned
    records = len(result.database.get_all_tuning_records())
    again = tuning.tune_primfuncs(funcs, "llvm", tuning.TuningBudget(TRIALS), result.work_dir, seed=0, progress=False)
    assert (again.tuned, again.reused, again.workloads) == (0, 2, 2)
    assert len(again.database.get_all_tuning_records()) == records
    assert again.digest == result.digest
    assert again.seconds < result.seconds  # nothing searched: reading the records back beats tuning


@pytest.mark.slow  # shares the module's search (about 2 minutes on 2 cores)
def test_digest_changes_with_the_best_record_only(tuned, tmp_path):
    result, funcs = tuned
    work_dir = str(tmp_path / "copy")
    shutil.copytree(result.work_dir, work_dir)
    database = tuning.open_database(work_dir)
    assert schedules_database.database_digest(database) == result.digest
    best = database.get_top_k(records_of(database, funcs["mm"])[0].workload, 1)[0]
    other = next(r for r in records_of(search_database(work_dir), funcs["mm"]) if str(r.trace) != str(best.trace))

    def commit(seconds):
        database.commit_tuning_record(
            ms.database.TuningRecord(other.trace, best.workload, [seconds], other.target, other.args_info)
        )

    commit(1.0)  # not the best: a build stays the same
    assert schedules_database.database_digest(database) == result.digest
    commit(1e-9)
    assert schedules_database.database_digest(database) != result.digest
    assert schedules_database.tuned_seconds(database, funcs["mm"], "llvm") == pytest.approx(1e-9)


@pytest.mark.slow  # shares the module's search (about 2 minutes on 2 cores)
def test_a_record_that_does_not_replay_leaves_the_kernel_unscheduled(tuned, resnet, tmp_path, caplog):
    result, funcs = tuned
    mod, stem = resnet
    work_dir = str(tmp_path / "copy")
    shutil.copytree(result.work_dir, work_dir)
    database = tuning.open_database(work_dir)
    conv_trace = records_of(database, mod[stem])[0].trace
    mm = records_of(database, funcs["mm"])[0]
    database.commit_tuning_record(ms.database.TuningRecord(conv_trace, mm.workload, [1e-9], mm.target, mm.args_info))
    with caplog.at_level(logging.WARNING, logger="tvm_diviml.profiling.tuning"):
        applied = schedules_database.apply_database(tvm.IRModule({"mm": funcs["mm"]}), "llvm", database)
    assert (applied.scheduled, applied.unscheduled) == (0, 1)
    assert "does not apply" in caplog.text


@pytest.mark.slow  # a search of its own: about 2 minutes on 2 cores
def test_same_seed_same_candidates_and_logs_stay_off_the_terminal(tmp_path, capfd):
    traces = []
    for run in range(2):
        result = tuning.tune_primfuncs(
            {"mm": matmul(32)},
            "llvm",
            tuning.TuningBudget(3),
            str(tmp_path / f"run{run}"),
            seed=7,
            progress=False,
            cost_model="random",
        )
        traces.append(sorted(str(r.trace) for r in search_database(result.work_dir).get_all_tuning_records()))
    assert traces[0] == traces[1] and len(traces[0]) == 3 + 1  # three trials and the default schedule
    out, err = capfd.readouterr()
    assert "Trial" not in out + err


def test_open_database_needs_an_existing_database(tmp_path):
    with pytest.raises(DivimlInputError, match="no MetaSchedule database"):
        tuning.open_database(str(tmp_path))


@pytest.mark.slow  # shares the module's search (about 2 minutes on 2 cores)
def test_one_work_dir_holds_one_target_kind(tuned):
    result, funcs = tuned
    with pytest.raises(DivimlInputError, match="one work_dir per target"):
        tuning.tune_primfuncs(funcs, {"kind": "cuda", "arch": "sm_80"}, tuning.TuningBudget(TRIALS), result.work_dir)


def test_tuning_target_states_the_core_count():
    assert int(schedules_database.tuning_target("llvm").attrs["num-cores"]) == (os.cpu_count() or 1)
    assert int(schedules_database.tuning_target({"kind": "llvm", "num-cores": 4}).attrs["num-cores"]) == 4
    assert "num-cores" not in schedules_database.tuning_target({"kind": "cuda", "arch": "sm_80"}).attrs


@pytest.mark.slow  # a search of its own: about 2 minutes on 2 cores
def test_gathers_are_tuned_with_in_bounds_indices(tmp_path):
    """Random integer arguments index out of bounds, and TVM's gathers do not check: tuning an
    embedding lookup used to crash the process (seen with BERT)."""
    table = te.placeholder((8, 4), name="table")
    ids = te.placeholder((64,), name="ids", dtype="int32")
    out = te.compute((64, 4), lambda i, j: table[ids[i], j], name="rows")
    result = tuning.tune_primfuncs(
        {"lookup": te.create_prim_func([table, ids, out])},
        "llvm",
        tuning.TuningBudget(2),
        str(tmp_path),
        progress=False,
    )
    assert result.workloads == 1


@pytest.mark.slow  # shares the module's search (about 2 minutes on 2 cores)
def test_the_default_schedule_is_the_searchs_first_record(tuned):
    """A tuned kernel is never slower than the default one: the rules' schedule is a record."""
    result, funcs = tuned
    target = schedules_database.tuning_target("llvm")
    search = search_database(result.work_dir)
    for func in funcs.values():
        schedule, _ = default_schedule(func.with_attr("global_symbol", "main"), target)
        workload = search.commit_workload(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))
        traces = [str(r.trace) for r in search.get_top_k(workload, 1000)]
        assert str(schedule.trace) in traces


@pytest.mark.slow  # a search of its own: about 2 minutes on 2 cores
def test_a_minutes_budget_ends_the_search(tmp_path):
    """Minutes alone bound the trials (unbounded otherwise); what was searched is kept for a resume."""
    result = tuning.tune_primfuncs(
        {"mm": matmul(48)}, "llvm", tuning.TuningBudget(minutes=0.25), str(tmp_path), progress=False
    )
    (searched,) = json.loads((tmp_path / "searched.json").read_text())["trials"].values()
    assert result.workloads == 1 and 0 < searched < 1000
    with pytest.raises(DivimlInputError, match="finite minutes"):
        tuning.TuningBudget(minutes=float("inf"))


def test_an_interrupt_inside_a_deferred_section_is_remembered_not_raised():
    """The tuning search runs with interrupts deferred: Ctrl-C unwinding MetaSchedule's C++ loop at a
    random point crashed the process (exit -11) or left tracebacks."""
    import signal

    from tvm_diviml.errors import forget_interrupt, interrupted, interrupts_deferred, on_interrupt

    previous = signal.signal(signal.SIGINT, on_interrupt)  # as the CLI installs it
    try:
        forget_interrupt()
        with interrupts_deferred() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.requested.is_set() and not interrupted()
        assert interrupted()  # the CLI's handler remembers it once the section ends
        assert signal.getsignal(signal.SIGINT) is on_interrupt
        with pytest.raises(KeyboardInterrupt), interrupts_deferred():  # a second Ctrl-C stops at once
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
        forget_interrupt()


@pytest.mark.slow  # a search of its own: about 2 minutes on 2 cores
def test_ctrl_c_during_tuning_stops_after_a_batch_and_keeps_the_database(tmp_path):
    """Ctrl-C once the search has recorded a measured candidate (it goes on with the next batch): exit 130,
    no traceback, and the records measured until then kept. The moments are the files the search writes:
    its logs (the default schedules are recorded by then) and a record more in its database."""
    import signal
    import subprocess
    import sys

    cache = tmp_path / "cache"
    driver = subprocess.Popen(
        [sys.executable, "-m", "tvm_diviml.cli", "profile", "twin_branch", "--platform", "cpu2", "--tune", "64"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DIVIML_CACHE_DIR": str(cache)},
        # a background job (CI) inherits SIGINT ignored, and Python then keeps it so: restore the default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )

    def running(found):
        assert driver.poll() is None, driver.communicate()  # it did not end before the moment came
        return found

    def records(work_dir) -> int:
        path = work_dir / "database_tuning_record.json"
        return path.read_text().count("\n") if path.exists() else 0

    try:
        (logs,) = wait_until(lambda: running(list(cache.glob("**/logs"))), "the search's start", every_s=0.5)
        seeded = records(logs.parent)
        wait_until(lambda: running(records(logs.parent) > seeded), "a measured candidate's record", every_s=0.5)
        measured = records(logs.parent)
        driver.send_signal(signal.SIGINT)
        _, err = driver.communicate(timeout=HANG_GUARD_S)
    finally:
        driver.kill()
    assert driver.returncode == 130 and err.strip().endswith("diviml: interrupted"), err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    database = tuning.open_database(str(logs.parent))
    assert len(database) >= measured > seeded  # the records measured before the interrupt were kept


# ---------------------------------------------------------------------- a database made for another model
def test_a_database_without_records_for_the_model_is_refused_naming_a_kernel(tuned, caplog):
    result, funcs = tuned
    tuning.check_database_covers(result.database, funcs, ["llvm"], "db")  # the model it was tuned for
    with pytest.raises(DivimlInputError, match="no record for any kernel of this model .*'other'"):
        tuning.check_database_covers(result.database, {"other": matmul(32)}, ["llvm"], "db")
    with pytest.raises(DivimlInputError, match="on 1 thread"):  # tuned for every core, not one
        tuning.check_database_covers(result.database, funcs, [{"kind": "llvm", "num-cores": 1}], "db")
    with caplog.at_level(logging.WARNING):
        tuning.check_database_covers(result.database, {**funcs, "other": matmul(32)}, ["llvm"], "db")
    assert "records for 3 of 4 kernel and target pairs (none for 'other'" in caplog.text


# ---------------------------------------------------------------------- damaged databases heal
def one_record_database(work_dir, target=None) -> None:
    """A MetaSchedule database of one workload and one record (for one thread unless ``target``), as
    a tuning run writes it."""
    func = matmul(16).with_attr("global_symbol", "main")
    os.makedirs(work_dir, exist_ok=True)
    database = ms.database.JSONDatabase(work_dir=str(work_dir))
    workload = database.commit_workload(tvm.IRModule({"main": func}))
    trace = naive(tvm.IRModule({"main": func})).trace
    target = target or tvm.target.Target({"kind": "llvm", "num-cores": 1})
    args = ms.arg_info.ArgInfo.from_prim_func(func)
    database.commit_tuning_record(ms.database.TuningRecord(trace, workload, [1e-3], target, args))


def test_a_truncated_record_line_is_dropped_and_the_file_kept_aside(tmp_path, caplog):
    one_record_database(tmp_path)
    records = tmp_path / "database_tuning_record.json"
    damaged = records.read_text() * 2
    records.write_text(damaged[: len(damaged) - 40])  # the second record cut short: an interrupted append
    with caplog.at_level(logging.WARNING):
        database = tuning.open_database(str(tmp_path))
    assert len(database.get_all_tuning_records()) == 1
    assert (tmp_path / "database_tuning_record.json.damaged").read_text() == damaged[: len(damaged) - 40]
    assert "dropped 1 damaged line" in caplog.text
    assert len(tuning.open_database(str(tmp_path)).get_all_tuning_records()) == 1  # healed for good


def test_a_truncated_last_workload_goes_with_the_records_that_name_it(tmp_path):
    one_record_database(tmp_path)
    workloads, records = tmp_path / "database_workload.json", tmp_path / "database_tuning_record.json"
    line = workloads.read_text()
    workloads.write_text(line + line[:30])  # a second workload, cut short
    records.write_text(records.read_text() + records.read_text().replace("[0,", "[1,", 1))
    database = tuning.open_database(str(tmp_path))
    assert len(database.get_all_tuning_records()) == 1 and workloads.read_text() == line


def test_a_damaged_workload_before_the_last_is_refused_saying_how_to_start_again(tmp_path):
    one_record_database(tmp_path)
    workloads = tmp_path / "database_workload.json"
    workloads.write_text('["cut short\n' + workloads.read_text())
    with pytest.raises(DivimlInputError, match="line 1 of database_workload.json is damaged.*move the folder aside"):
        tuning.open_database(str(tmp_path))


def test_cache_clear_removes_the_tuning_databases_too(tmp_path, monkeypatch, capsys):
    from tvm_diviml.cli import main

    monkeypatch.setenv("DIVIML_CACHE_DIR", str(tmp_path))
    damaged = tmp_path / "metaschedule" / "llvm-0123"
    damaged.mkdir(parents=True)
    (damaged / "database_workload.json").write_text('["cut short\n')
    assert main(["cache", "clear"]) == 0
    assert "removed 1 tuning database(s)" in capsys.readouterr().out and not (tmp_path / "metaschedule").exists()
