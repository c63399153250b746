"""Measured kernel costs: end to end on a tiny model, through the cache, with absent devices
estimated, links measured, and export / import of the whole profile. Measuring returns figures
(a ``Provenance``); the cost table that plans is built from them."""

import dataclasses
import json
import logging
import re

import pytest

from tvm_diviml.app.load import load_model
from tvm_diviml.cost import RooflineCostModel, create
from tvm_diviml.cost.base import ExecutorOverheads
from tvm_diviml.cost.provenance import InContext
from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import OpGraph
from tvm_diviml.platform import Device
from tvm_diviml.presets import get_platform
from tvm_diviml.profiling import profile, timing
from tvm_diviml.profiling.cache import ProfileCache
from tvm_diviml.profiling.measured import MeasureOptions, device_present, measure, whole_model_key
from tvm_diviml.profiling.profiler import tuning_for
from tvm_diviml.profiling.timing import fitted_in_context, priced_in_context

from ..helpers import diviml

FAST = MeasureOptions(repeats=3, min_repeat_ms=1, progress=False)


@pytest.fixture(scope="module")
def tiny():
    return load_model("resnet18", {"resolution": 16, "classes": 4}).extraction


def measured(extraction, platform, cache) -> TableCostModel:
    """The table priced from ``extraction``'s kernels measured on ``platform`` (not calibrated)."""
    provenance = measure(extraction.graph, platform, extraction, cache=cache, options=FAST)
    return TableCostModel.from_provenance(extraction.graph, platform, provenance)


def test_measures_every_kernel_once_then_reads_the_cache(tiny, tmp_path):
    platform = get_platform("cpu2")
    with ProfileCache(str(tmp_path / "p.sqlite")) as cache:
        first = measured(tiny, platform, cache)
        distinct = len(set(tiny.kernel_func.values()))
        assert first.provenance.measured_now == distinct  # cpu0 and cpu1 time alike: measured once
        for kernel in tiny.graph.kernels:
            assert first.compute_s(kernel, "cpu0") > 0 and first.source(kernel, "cpu0") == "measured"
            assert first.compute_s(kernel, "cpu1") == first.compute_s(kernel, "cpu0")
        assert first.provenance.how("cpu0") == "timed" and first.provenance.cache_path == cache.path
        second = measured(tiny, platform, cache)
        assert second.provenance.measured_now == 0
        assert all(second.compute_s(k, "cpu0") == first.compute_s(k, "cpu0") for k in tiny.graph.kernels)
        executor_rows = len(ExecutorOverheads.__dataclass_fields__) - 1  # cached beside the kernels, all
        # but the co-run factor (timed in every process)
        assert cache.stats()["kernel_rows"] == distinct + executor_rows and cache.stats()["link_rows"] == 2


def test_links_between_present_devices_are_measured(tiny, tmp_path):
    with ProfileCache(str(tmp_path / "p.sqlite")) as cache:
        costs = measured(tiny, get_platform("cpu2"), cache)
    link = costs.links[("cpu0", "cpu1")]
    assert link.latency_s >= 0 and link.bandwidth_Bps > 1e8 and costs.provenance.links == costs.links
    assert costs.transfer_s(1 << 20, "cpu0", "cpu1") == pytest.approx(link.latency_s + (1 << 20) / link.bandwidth_Bps)


def test_absent_devices_are_estimated_and_said_so(tiny, tmp_path, caplog):
    platform = get_platform("paper-node")
    with ProfileCache(str(tmp_path / "p.sqlite")) as cache:
        costs = measured(tiny, platform, cache)
    assert costs.provenance.absent == ["cpu", "rtx2080ti", "gtx1080ti"]  # paper-node's CPU is another machine's
    assert "rtx2080ti" in caplog.text and "roofline" in caplog.text
    kernel = tiny.graph.topo_order[0]
    assert costs.source(kernel, "rtx2080ti") == "estimated" and costs.provenance.measured_now == 0
    assert costs.compute_s(kernel, "rtx2080ti") == RooflineCostModel(tiny.graph, platform).compute_s(
        kernel, "rtx2080ti"
    )
    assert costs.provenance.how("rtx2080ti") == "roofline estimate"
    assert costs.provenance.schedule_of(kernel, "rtx2080ti") == "-" and costs.provenance.spread_s(kernel, "cpu") is None


def test_a_gpu_whose_arch_differs_from_its_target_is_not_measured():
    device = Device("g", {"kind": "cuda", "arch": "sm_1000"}, "cuda:0")
    assert not device_present(device)  # no such GPU here; on a lent GPU, the arch differs
    assert device_present(Device("c", {"kind": "llvm"}, "cpu:0"))
    assert not device_present(Device("c", {"kind": "llvm"}, "cpu:0", measure=False))


def test_export_then_import_gives_the_same_costs(tiny, tmp_path):
    platform = get_platform("cpu2")
    with ProfileCache(str(tmp_path / "p.sqlite")) as cache:
        costs = measured(tiny, platform, cache)
    path = tmp_path / "profile.json"
    costs.save(str(path))
    table = TableCostModel.load(str(path), platform, tiny.graph)
    assert table.provenance is None  # the record of how stays with the process that measured
    for kernel in tiny.graph.kernels:
        for device in platform.device_names:
            assert table.compute_s(kernel, device) == costs.compute_s(kernel, device)
    assert table.transfer_s(4096, "cpu0", "cpu1") == costs.transfer_s(4096, "cpu0", "cpu1")
    exported = json.loads(path.read_text())
    assert exported == costs.to_json()
    assert exported["sources"] == {"cpu0": "measured", "cpu1": "measured"}
    assert exported["made_for"]["targets"] == {d.name: d.target for d in platform.devices}
    other = tiny.graph.to_json()  # another size of the model: its kernels keep their names
    other["kernels"][1]["attrs"]["primfunc_hash"] = "another shape"
    with pytest.raises(DivimlInputError, match=f"kernel '{other['kernels'][1]['name']}' differs"):
        TableCostModel.load(str(path), platform, OpGraph.from_json(other))


def test_in_context_calibration_makes_the_model_cost_its_whole_run(tiny, tmp_path, caplog):
    platform = get_platform("cpu2")
    graph = tiny.graph
    with ProfileCache(str(tmp_path / "p.sqlite")) as cache:
        provenance = measure(graph, platform, tiny, cache=cache, options=FAST)
    timings = provenance.timed["cpu0"]
    alone = sum(timings.seconds[k] for k in graph.kernels)

    def priced(whole_model_s: float) -> tuple[InContext, TableCostModel]:
        fitted = fitted_in_context("cpu0", timings, graph, whole_model_s)
        in_context = dataclasses.replace(provenance, in_context={"cpu0": fitted})
        return fitted, TableCostModel.from_provenance(graph, platform, in_context)

    fitted, costs = priced(alone + 1e-3)
    assert fitted.per_kernel_s == pytest.approx(1e-3 / len(graph)) and costs.provenance.how("cpu0").endswith("context")
    assert sum(costs.compute_s(k, "cpu0") for k in graph.kernels) == pytest.approx(alone + 1e-3)
    fitted, costs = priced(alone / 2)
    assert fitted.per_kernel_s == 0.0  # the kernels scaled down instead
    assert sum(costs.compute_s(k, "cpu0") for k in graph.kernels) == pytest.approx(alone / 2)
    first, second = sorted(graph.kernels)[:2]
    assert costs.compute_s(first, "cpu0") / costs.compute_s(second, "cpu0") == pytest.approx(
        timings.seconds[first] / timings.seconds[second]
    )
    with caplog.at_level(logging.WARNING):
        priced(alone * 0.999)  # said below 1.00, which it is
    assert "priced at 0.99 of its time alone" in caplog.text
    fitted, costs = priced(alone)  # a calibration that agrees scales nothing
    assert fitted == InContext(0.0, 1.0)
    assert sum(costs.compute_s(k, "cpu0") for k in graph.kernels) == pytest.approx(alone)


def test_calibration_is_measured_once_then_read_from_the_cache_and_exported(tmp_path, monkeypatch):
    platform = get_platform("cpu2")
    loaded = load_model("twin_branch", {"depth": 2, "hidden": 16, "batch": 2})
    graph, extraction = loaded.extraction.graph, loaded.extraction
    with ProfileCache(str(tmp_path / "p.sqlite")) as cache:

        def calibrated(model, **options):
            provenance = measure(graph, platform, extraction, cache=cache, options=FAST)
            return priced_in_context(provenance, platform, model, extraction, cache=cache, **options)

        first = calibrated(loaded.built, repeats=3)
        figures = {device: fitted.per_kernel_s for device, fitted in first.in_context.items()}
        assert set(figures) == {"cpu0", "cpu1"} and figures["cpu0"] == figures["cpu1"] >= 0
        assert first.prediction_error >= 0
        second = calibrated(None)  # no model needed: the cache answers
        assert second.in_context == first.in_context and second.prediction_error == first.prediction_error
        key = whole_model_key(graph, platform.device("cpu0"), {})
        before = cache.get_many([key])[key]
        second = calibrated(loaded.built, repeats=3, fresh=True)  # timed again
        assert cache.get_many([key])[key] != before
        before = cache.get_many([key])[key]
        monkeypatch.setattr(timing, "CALIBRATION_MAX_AGE_S", 0.0)  # every cached timing now too old
        second = calibrated(loaded.built, repeats=3)  # timed again, not read
        assert cache.get_many([key])[key] != before
        overheads = first.machine_overheads
        assert overheads.run_s > 0 and overheads.segment_s >= 0 and overheads.handoff_s >= 0
        # the machine's figures from the cache, not timed again; only the co-run factor is timed in every process
        assert (
            dataclasses.replace(second.machine_overheads, corun_factor=1.0)
            == dataclasses.replace(overheads, corun_factor=1.0)
            and second.machine_overheads.corun_factor >= 1
        )
        # the model's own timings in context only raise them: a segment call in a stream, the co-run factor
        for provenance in (first, second):
            assert provenance.executor_overheads.segment_s >= provenance.machine_overheads.segment_s
            assert provenance.executor_overheads.corun_factor >= provenance.machine_overheads.corun_factor
        assert first.links[("cpu0", "cpu1")].latency_s >= overheads.handoff_s
    path = tmp_path / "costs.json"
    costs = TableCostModel.from_provenance(graph, platform, first)
    assert costs.executor_segments and costs.prediction_error == first.prediction_error
    costs.save(str(path))
    table = TableCostModel.load(str(path), platform, graph)
    assert table.executor_segments and table.prediction_error == first.prediction_error
    priced = first.executor_overheads  # the table carries what priced the model: its figures in context
    assert (
        table.executor_overheads.run_s,
        table.executor_overheads.segment_s,
        table.executor_overheads.corun_factor,
    ) == (priced.run_s, priced.segment_s, priced.corun_factor) and priced.corun_factor >= 1


def test_the_executors_calibration_compares_timings_within_each_round():
    """The machine 1.4x slower in the second round: compared across rounds, the stream would read
    0.45 s of excess and "beside" 1.4x; within each, 0.05 s and 1.1x."""
    rounds = [
        {"alone": 1.0, "stream": 1.05, "beside": 1.1},
        {"alone": 1.4, "stream": 1.45, "beside": 1.54},
        {"alone": 1.0, "stream": 1.05, "beside": 1.1},
    ]
    out = timing.within_rounds(rounds)
    assert out["alone"] == 1.0 and out["stream"] == pytest.approx(1.05) and out["beside"] == pytest.approx(1.1)
    assert "beside" not in timing.within_rounds([{"alone": 1.0, "stream": 1.2}])


def test_profile_is_the_catalogs_measured_entry_and_a_table_like_a_files(tmp_path):
    """``cost.create("measured", ...)`` makes what the measuring factory passed to it makes: ``profile``'s
    table, calibrated inside the model, which saved and read back is a table of the same prices."""
    platform = get_platform("cpu2")
    loaded = load_model("twin_branch", {"depth": 2, "hidden": 16, "batch": 2})
    graph = loaded.extraction.graph
    with ProfileCache(str(tmp_path / "p.sqlite")) as cache:

        def measure_here(graph, platform):
            return profile(graph, platform, loaded.built, loaded.extraction, cache=cache, options=FAST)

        costs = create("measured", graph, platform, measure=measure_here)
    assert isinstance(costs, TableCostModel) and set(costs.provenance.in_context) == {"cpu0", "cpu1"}
    assert costs.provenance.how("cpu1") == "timed, priced in context"
    path = tmp_path / "costs.json"
    costs.save(str(path))
    table = create(str(path), graph, platform)
    assert isinstance(table, TableCostModel) and table.compute == costs.compute and table.links == costs.links
    assert isinstance(create("roofline", graph, platform), RooflineCostModel)
    with pytest.raises(DivimlInputError, match="measured costs need a model that TVM builds"):
        create("measured", graph, platform)  # no measuring factory given
    with pytest.raises(DivimlInputError, match="measured costs need a model that TVM builds"):
        profile(graph, platform)  # no extraction to measure


@pytest.mark.parametrize(
    "executor",
    [
        [],
        {"segments": "yes"},
        {"prediction_error": -0.1},
        {"prediction_error": float("nan")},
        {"run_s": -1e-6},
        {"segment_s": "fast"},
        {"segment_s": float("inf")},
        {"corun_factor": 0.5},
        {"corun_factor": "2"},
    ],
)
def test_a_cost_table_with_a_bad_executor_field_is_refused(executor):
    with pytest.raises(DivimlInputError, match="executor"):
        TableCostModel.from_json({"kernels": {}, "executor": executor}, get_platform("cpu2"))


def test_profile_command_and_measured_plan(tmp_path):
    env = {"DIVIML_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}

    def run(*args):
        return diviml(*args, env=env, timeout=300)

    model = "resnet18:resolution=16,classes=4"
    profile = run("profile", model, "--platform", "cpu2", "--export", str(tmp_path / "costs.json"))
    assert profile.returncode == 0, profile.stderr
    assert "link cpu0 -> cpu1" in profile.stdout and "kernels timed now" in profile.stdout
    # The calibration adds to each kernel, or scales it down where the kernels were timed on a busier
    # machine than the whole model (seen under `make test` beside another worker): either is reported.
    assert re.search(r"inside the model, cpu0( adds|'s kernels take 0\.\d\d of)", profile.stdout)
    assert "a timing of the whole model strays by" in profile.stdout
    assert "the concurrent executor adds" in profile.stdout and "per segment call" in profile.stdout
    plan = run("plan", model, "--platform", "cpu2", "--cost", "measured", "--json", "-")
    assert plan.returncode == 0, plan.stderr
    row = json.loads(plan.stdout)
    assert row["cost_source"] == "measured" and row["value_s"] > 0
    again = run("plan", model, "--platform", "cpu2", "--cost", str(tmp_path / "costs.json"), "--json", "-")
    assert json.loads(again.stdout)["value_s"] == pytest.approx(row["value_s"])
    info = run("cache", "info")
    assert "kernel_rows" in info.stdout
    cleared = run("cache", "clear")
    assert cleared.returncode == 0 and "removed" in cleared.stdout
    not_tvm = run("plan", "random", "--cost", "measured")
    assert not_tvm.returncode == 2 and "measured costs need a model that TVM builds" in not_tvm.stderr


@pytest.mark.slow  # about two minutes: MetaSchedule on every kernel of a small ResNet-18
def test_tuned_profile_applies_its_database(tmp_path):
    env = {"DIVIML_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    result = diviml(
        "profile",
        "resnet18:resolution=16,classes=4",
        "--tune",
        "2",
        "--json",
        tmp_path / "rows.json",
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads((tmp_path / "rows.json").read_text())["kernels"]
    assert {r["source"] for r in rows if r["device"] == "cpu0"} == {"tuned"}
    (database,) = (tmp_path / "cache" / "metaschedule").iterdir()
    reuse = diviml(
        "plan",
        "resnet18:resolution=16,classes=4",
        "--platform",
        "cpu2",
        "--tuning-db",
        database,
        "--json",
        "-",
        env=env,
        timeout=600,
    )
    assert reuse.returncode == 0, reuse.stderr
    assert json.loads(reuse.stdout)["cost_sources"] == {"cpu0": "tuned", "cpu1": "tuned"}
    missing = diviml(
        "plan", "resnet18:resolution=16,classes=4", "--platform", "cpu2", "--tuning-db", tmp_path, env=env, timeout=600
    )
    assert missing.returncode == 2 and "no MetaSchedule database" in missing.stderr


def test_tuning_searches_each_thread_count_a_plan_may_build_for(tiny, monkeypatch, tmp_path):
    """cpu2's cores (one thread each) and the whole CPU (every thread) are two searches sharing the
    minutes and one database; every device, the whole CPU's too, gets the database's latest result."""
    import os

    from tvm_diviml.profiling import measured, tuning

    searched = []

    def fake_tune(funcs, target, budget, work_dir, progress=True):
        searched.append((int(target.attrs["num-cores"]), budget, work_dir))
        return f"result {len(searched)}"

    monkeypatch.setattr(measured, "tune_primfuncs", fake_tune)
    monkeypatch.setenv("DIVIML_CACHE_DIR", str(tmp_path))

    def tune_on(platform: str):
        return tuning_for(get_platform(platform), tiny, tune=tuning.TuningBudget(trials=3, minutes=4), progress=False)

    assert tune_on("paper-node") == {} and searched == []  # nothing here to tune: roofline, no error
    applied = tune_on("cpu2")
    cores = os.cpu_count() or 1
    assert [threads for threads, _, _ in searched] == ([1, cores] if cores > 1 else [1])
    assert {budget for _, budget, _ in searched} == {tuning.TuningBudget(trials=3, minutes=4 / len(searched))}
    assert len({work_dir for _, _, work_dir in searched}) == 1
    assert applied == {"cpu0": f"result {len(searched)}", "cpu1": f"result {len(searched)}"}
    with pytest.raises(DivimlInputError, match="both choose the schedules"):
        tuning_for(get_platform("cpu2"), tiny, tune=tuning.TuningBudget(trials=3), tuning_db=str(tmp_path))


@pytest.mark.parametrize(
    "target, says",
    [("llvmm", 'Target kind "llvmm" is not defined'), ({"kind": "llvm", "num_cores": 2}, "num_cores")],
)
def test_a_target_tvm_rejects_is_named_when_the_platform_loads(tmp_path, capsys, target, says):
    """``run`` and ``profile`` name the device and TVM's reason in one line, before the model is read."""
    from tvm_diviml.cli import main

    platform = get_platform("cpu2").to_json()
    platform["devices"][1]["target"] = target
    path = tmp_path / "platform.json"
    path.write_text(json.dumps(platform))
    for command in ("run", "profile"):
        assert main([command, "no-such-model-is-read.onnx", "--platform", str(path)]) == 2
        err = capsys.readouterr().err
        assert "devices[cpu1].target" in err and says in err and err.count("\n") == 1, err
