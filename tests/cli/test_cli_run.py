"""``diviml run`` end to end on a tiny zoo model (roofline costs: no kernel timing): it reports
outputs, measured against predicted time and the single-device configurations, writes its JSON row
and the build, and refuses models and platforms it cannot run with one line and exit status 2.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics

import pytest

from tvm_diviml.cli import main
from tvm_diviml.runtime.vm import PlacedExecutable

from ..helpers import HANG_GUARD_S, Lines, graph_of

MODEL = "twin_branch:depth=2,hidden=32,batch=2"
# --candidates 0: the plan as planned (tests of --candidates give their own count, which wins)
FAST = ["--platform", "cpu2", "--cost", "roofline", "--repeats", "2", "--inputs", "4", "--time-limit", "5"]
FAST += ["--candidates", "0"]


def diviml_run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["run", MODEL, *FAST, *args])
    out, err = capsys.readouterr()
    return code, out, err


def printed_speedup(out: str, what: str) -> tuple[str, float]:
    match = re.search(rf"^speed-up over {what} \((.+)\): ([0-9.]+)x$", out, re.MULTILINE)
    assert match, out
    return match.group(1), float(match.group(2))


def test_latency_run_reports_outputs_times_and_speedups(tmp_path, capsys):
    code, out, err = diviml_run(
        capsys, "--objective", "latency", "--json", str(tmp_path / "row.json"), "--export", str(tmp_path / "placed.so")
    )
    assert code == 0, err
    assert re.search(r"^outputs against the single-device build: .*: equal$", out, re.MULTILINE), out
    timed = re.search(
        r"^latency: measured .* \(median of (\d+), concurrent executor\), predicted .*: "
        r"measured/predicted [0-9.]+$",
        out,
        re.MULTILINE,
    )
    assert timed, out
    run = json.loads((tmp_path / "row.json").read_text())["run"]
    assert "single-device configurations, measured now" in out
    for name in run["single_device_s"]:
        assert re.search(rf"^  {re.escape(name)} +\S+ \S+", out, re.MULTILINE), (name, out)
    best, best_speedup = printed_speedup(out, "the best single-device configuration")
    one_worker, worker_speedup = printed_speedup(out, "one worker")
    assert best == min(run["single_device_s"], key=run["single_device_s"].get) == run["best_single_device"]
    assert one_worker == run["one_worker"]
    assert best_speedup == pytest.approx(run["speedup_over_best_single_device"], abs=0.006)
    assert worker_speedup == pytest.approx(run["speedup_over_one_worker"], abs=0.006)

    # the JSON row's run: the median of the timed samples (--repeats 2, more until they took SETTLE_S),
    # consistent ratios, outputs within --rtol
    assert len(run["samples_s"]) == int(timed.group(1)) >= 2 and run["measured_s"] == pytest.approx(
        statistics.median(run["samples_s"])
    )
    assert run["predicted_s"] > 0 and run["measured_s"] > 0
    assert 0 <= run["max_rel_diff"] <= 1e-4
    assert run["speedup_over_best_single_device"] == pytest.approx(
        min(run["single_device_s"].values()) / run["measured_s"]
    )
    assert run["measured_over_predicted"] == pytest.approx(run["measured_s"] / run["predicted_s"])

    # the exported build loads with its placement, which is the plan that was run
    row = json.loads((tmp_path / "row.json").read_text())
    assert run["predicted_s"] == pytest.approx(row["value_s"])
    loaded = PlacedExecutable.load(str(tmp_path / "placed.so"))
    assert (tmp_path / "placed.so.placement.json").is_file()
    assert loaded.placement.assignment == row["assignment"]


def test_candidates_are_timed_side_by_side_and_the_fastest_measured_is_kept(tmp_path, capsys):
    code, out, err = diviml_run(
        capsys, "--candidates", "2", "--json", str(tmp_path / "row.json"), "--export", str(tmp_path / "kept.so")
    )
    assert code == 0, err
    row = json.loads((tmp_path / "row.json").read_text())
    chosen = row["candidates"]
    labels = [c["label"] for c in chosen["candidates"]]
    measured = [c["measured_s"] for c in chosen["candidates"]]
    assert chosen["winner"] == labels[0] and measured == sorted(measured)
    if (os.cpu_count() or 1) > 1:  # cpu2 gives each device one thread
        whole = f"cpu0 ({os.cpu_count()} threads, the whole CPU)"
        assert whole in labels
        # no platform device describes it: predicted by the same kind of costs for that configuration
        assert chosen["candidates"][labels.index(whole)]["predicted_s"] > 0
    assert any(len(c["devices"]) == 1 for c in chosen["candidates"])  # the best single device is there
    assert re.search(rf"^  {re.escape(chosen['winner'])} .*<- kept$", out, re.MULTILINE), out
    # what was run, reported and exported is the kept candidate
    winner = chosen["candidates"][0]
    assert row["run"]["predicted_s"] == winner["predicted_s"]
    assert sorted(set(row["kept_assignment"].values())) == sorted(winner["devices"])
    assert PlacedExecutable.load(str(tmp_path / "kept.so")).placement.assignment == row["kept_assignment"]


def test_candidates_are_refused_across_rpc_servers(capsys):
    assert_one_line_error(
        capsys, ["run", MODEL, *FAST, "--candidates", "2", "--rpc", "local"], "--candidates times plans on this machine"
    )


@pytest.mark.parametrize(
    "objective, extra, in_flight",
    [
        ("throughput", [], None),  # default: as many as the stream's price asks
        ("pipeline", ["--stages", "2", "--in-flight", "3"], 3),
    ],
)
def test_stream_objectives_report_throughput(capsys, tmp_path, objective, extra, in_flight):
    code, out, err = diviml_run(capsys, "--objective", objective, *extra, "--json", str(tmp_path / "row.json"))
    assert code == 0, err
    if in_flight is None:
        in_flight = int(re.search(r"([0-9]+) in flight\)", out).group(1))
        assert 1 <= in_flight <= 8
    assert re.search(
        rf"^throughput: measured [0-9.]+ /s \(.* per inference, {in_flight} in flight\), "
        r"predicted [0-9.]+ /s \(period .*\): measured/predicted [0-9.]+$",
        out,
        re.MULTILINE,
    ), out
    run = json.loads((tmp_path / "row.json").read_text())["run"]
    assert run["objective"] == objective and run["in_flight"] == in_flight and run["measured_s"] > 0


def assert_one_line_error(capsys, argv: list[str], *fragments: str) -> None:
    """Exit 2 and one line of error on stderr (beside the solve's progress lines, which a loaded machine
    can make last past the first second)."""
    assert main(argv) == 2
    _, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if not re.match(r"\[ *[0-9.]+ s\] best plan ", line)]
    assert len(lines) == 1 and lines[0].startswith("diviml: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err


def test_an_opgraph_file_has_no_kernels_to_run(tmp_path, capsys):
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(graph_of([("a", "b", 4.0), ("b", "c", 4.0)]).to_json()))
    assert_one_line_error(capsys, ["run", str(path), *FAST], "run needs a model that TVM builds")


def test_a_synthetic_graph_has_no_kernels_to_run(capsys):
    assert_one_line_error(capsys, ["run", "random:kernels=5", *FAST], "run needs a model that TVM builds")


def test_a_platform_whose_gpu_is_absent_is_refused_naming_it(tmp_path, capsys):
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("this machine has a GPU")
    platform = tmp_path / "cpu-gpu.json"
    platform.write_text(
        json.dumps(
            {
                "name": "cpu-and-gpu",
                "default_link": {"latency_s": 1e-5, "bandwidth_Bps": 1e10},
                "devices": [
                    {
                        "name": "host",
                        "target": {"kind": "llvm"},
                        "device": "cpu:0",
                        "peak_flops": 1e6,
                        "bandwidth_Bps": 1e6,
                    },  # so slow that the plan takes the GPU
                    {
                        "name": "gpu",
                        "target": {"kind": "cuda", "arch": "sm_75"},
                        "device": "cuda:0",
                        "peak_flops": 1e14,
                        "bandwidth_Bps": 1e12,
                    },
                ],
            }
        )
    )
    argv = ["run", MODEL, *FAST, "--platform", str(platform)]
    assert_one_line_error(capsys, argv, "cuda:0")


@pytest.mark.parametrize("rtol", ["-1", "abc"])
def test_bad_rtol_is_an_argument_error(capsys, rtol):
    with pytest.raises(SystemExit) as exit_:
        main(["run", MODEL, *FAST, "--rtol", rtol])
    assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "--rtol" in errors[0], errors


def test_outputs_beyond_rtol_are_called_different_and_exit_1(capsys, monkeypatch):
    """A reference 1% off: the run reports the outputs DIFFERENT and exits 1; a looser --rtol accepts them."""
    from tvm_diviml.app import run as run_module

    real = run_module.run_reference
    monkeypatch.setattr(run_module, "run_reference", lambda *a, **k: [x * 1.01 for x in real(*a, **k)])
    code, out, err = diviml_run(capsys, "--objective", "latency")
    assert code == 1, out + err
    assert re.search(
        r"^outputs against the single-device build: .*DIFFERENT \(beyond rtol 0.0001\)$", out, re.MULTILINE
    ), out
    code, out, err = diviml_run(capsys, "--objective", "latency", "--rtol", "0.02")
    assert code == 0 and ": equal" in out, out + err


@pytest.mark.parametrize(
    "signum, at",
    [(signal.SIGINT, "timing kernels"), (signal.SIGINT, "built for"), (signal.SIGHUP, "timing kernels")],
)
def test_an_interrupt_during_a_run_exits_130_at_once(tmp_path, signum, at):
    """TVM turns a KeyboardInterrupt raised inside its calls into a RuntimeError, which a handler for a
    kernel that does not build would take for one: the run then went on and exited 0. It stops now, from
    Ctrl-C or a closed terminal (SIGHUP), while kernels are timed or while the candidates run (the moment
    is an event the run prints, never a time: a loaded machine is slower)."""
    import subprocess
    import sys

    driver = subprocess.Popen(
        # 20,000 timed inferences keep the candidates running for a minute: exit 0 there means ignored
        [sys.executable, "-m", "tvm_diviml", "run", "twin_branch", "--platform", "cpu2", "--repeats", "20000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # a fresh cache: the kernels are timed, then built and run
        env={**os.environ, "DIVIML_CACHE_DIR": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"},
        # a background job (CI) inherits SIGINT ignored, and Python then keeps it so: restore the default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        output = Lines(driver.stdout)
        output.wait_for(at)
        assert driver.poll() is None, output.tail()
        driver.send_signal(signum)
        rest = output.rest()
        driver.wait(timeout=HANG_GUARD_S)
    finally:
        driver.kill()
    assert driver.returncode == 130 and rest.strip().endswith("diviml: interrupted"), rest[-2000:]
    assert "Traceback" not in rest, rest[-2000:]


def test_run_model_is_the_command_without_its_parsing_and_printing(tmp_path, capsys):
    """The library call reports what `diviml run` prints and writes; the plan is handed over before it
    is built; nothing reaches stdout."""
    from tvm_diviml import RunOptions, SolveOptions, run_model

    planned = []
    report = run_model(
        MODEL,
        "cpu2",
        "roofline",
        solve=SolveOptions(time_limit_s=5),
        options=RunOptions(repeats=2, stream_inputs=4, candidates=0),
        on_planned=planned.append,
        progress=lambda line: None,
    )
    assert report.passed and report.text.startswith("outputs against the single-device build: ")
    assert [p.row for p in planned] == [report.row] and report.row["run"] == report.measured.to_json()
    assert report.row["run"]["measured_s"] > 0 and report.row["assignment"]
    assert capsys.readouterr().out == ""
    code = main(["run", MODEL, *FAST, "--objective", "latency", "--json", str(tmp_path / "row.json")])
    assert code == 0 and set(json.loads((tmp_path / "row.json").read_text())) == set(report.row)


def test_an_interrupt_that_tvm_turned_into_another_error_still_ends_130(monkeypatch, capsys):
    """Ctrl-C inside a Python callback of a TVM pass (tvm.compile of a build) reaches the command as TVM's
    RuntimeError: seen as exit 1 with a traceback when SIGTERM stopped `run --rpc` while it compiled."""
    from tvm_diviml import errors
    from tvm_diviml.cli import graph as graph_command

    def compile_interrupted(args):
        try:
            errors.on_interrupt(signal.SIGTERM, None)
        except KeyboardInterrupt:
            raise RuntimeError("Traceback ...\nKeyboardInterrupt") from None

    monkeypatch.setattr(graph_command, "run", compile_interrupted)
    try:
        assert main(["graph", "twin_branch"]) == 130
    finally:
        errors.forget_interrupt()  # the next test of this process starts uninterrupted
    assert capsys.readouterr().err == "diviml: interrupted\n"


def test_an_interrupt_while_the_command_starts_is_one_line_and_130():
    """Ctrl-C while the command's modules are imported (seconds on a loaded machine): the signal is sent
    from inside the import of numpy, the first heavy module, so the moment is the same on every run."""
    import subprocess
    import sys

    code = (
        "import os, signal, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'numpy': os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "sys.argv = ['diviml', 'models']\n"
        "from tvm_diviml.entry import main\n"
        "main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert result.returncode == 130 and result.stderr == "diviml: interrupted\n", result.stderr[-2000:]
    assert result.stdout == ""


def test_a_tuned_run_times_the_default_schedules_too_and_keeps_them_when_faster(tmp_path, capsys, monkeypatch):
    """With a tuning database, each single-device configuration is also built without it (the default
    rules) and timed beside the rest; where the tuned builds measure slower (made 10x slower here),
    the default build is kept and the report says so."""
    from dataclasses import replace

    from tvm_diviml.modelspec import parse_model_spec
    from tvm_diviml.passes.extract import extract
    from tvm_diviml.profiling import timing, tuning
    from tvm_diviml.schedules import database as schedules_database
    from tvm_diviml.zoo import build_model

    monkeypatch.setenv("DIVIML_CACHE_DIR", str(tmp_path / "cache"))
    extraction = extract(build_model(*parse_model_spec(MODEL)).mod)
    kernel = next(iter(extraction.kernel_func.values()))
    (tmp_path / "db").mkdir()
    database = tuning.ms.database.JSONDatabase(work_dir=str(tmp_path / "db"))
    for threads in (1, os.cpu_count() or 1):  # one record per thread count a build may have
        target = schedules_database.tuning_target({"kind": "llvm", "num-cores": threads})
        tuning._seed_with_default_schedule(
            database, schedules_database.workload_module(extraction.mod[kernel]), target, kernel
        )

    built_with = []
    real_build, real_time = timing.build_runnable, timing._time_side_by_side

    def spy_build(model, extraction, platform, plan, *, database=None, progress=print):
        built_with.append(database is not None)
        return real_build(model, extraction, platform, plan, database=database, progress=progress)

    def tuned_slower(candidates, builds, *args):
        timings = real_time(candidates, builds, *args)
        return {key: t if key[2] else replace(t, measured_s=10 * t.measured_s) for key, t in timings.items()}

    monkeypatch.setattr(timing, "build_runnable", spy_build)
    monkeypatch.setattr(timing, "_time_side_by_side", tuned_slower)
    fast = [{"roofline": "measured"}.get(a, a) for a in FAST[:-2]] + ["--candidates", "1"]
    code = main(["run", MODEL, *fast, "--tuning-db", str(tmp_path / "db"), "--json", str(tmp_path / "row.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    chosen = json.loads((tmp_path / "row.json").read_text())["candidates"]
    defaults = [c for c in chosen["candidates"] if c["default_schedules"]]
    configurations = [c["label"] for c in chosen["candidates"] if c["label"] + ", default schedules" in out]
    assert len(defaults) == len(configurations) >= 1 and all(c["predicted_s"] is None for c in defaults)
    assert all(c["predicted_s"] > 0 for c in chosen["candidates"] if not c["default_schedules"])
    assert built_with.count(False) == len(defaults) and built_with.count(True) == len(chosen["candidates"]) - len(
        defaults
    )
    assert chosen["winner"].endswith(", default schedules")
    assert "the tuned schedules measured slower inside the model than the default ones" in out
    run = json.loads((tmp_path / "row.json").read_text())["run"]
    assert chosen["winner"] in run["single_device_s"] and run["speedup_over_best_single_device"] == pytest.approx(1)


def test_side_by_side_times_each_candidate_warm(monkeypatch):
    """A build slower on its first calls after another candidate ran (caches, thread pool) is timed at
    the speed it keeps when run again and again, not at the switch's. The calls take their time on a
    clock of the test's (a loaded machine stretches real sleeps past the difference)."""
    from types import SimpleNamespace

    import numpy as np

    from tvm_diviml.plan import Plan
    from tvm_diviml.profiling import timing
    from tvm_diviml.profiling.candidates import Candidate

    warm_s, cold_s = 0.002, 0.008
    cold_calls_after_a_switch = 2  # as measured on twin_branch:hidden=1024 (timing.WARM_CALLS)
    last, clock = {}, [0.0]

    class SwitchSlowedRunner:
        device = "cpu0"

        def __init__(self, built, params, *, num_threads=None):
            self.cold_calls = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def __call__(self, inputs):
            if last.get("runner") is not self:
                last["runner"], self.cold_calls = self, cold_calls_after_a_switch
            clock[0] += cold_s if self.cold_calls else warm_s
            self.cold_calls = max(0, self.cold_calls - 1)
            return [np.ones(2)]

    monkeypatch.setattr(timing, "SingleVMRunner", SwitchSlowedRunner)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(timing, "SETTLE_S", 0.0)
    candidates = [Candidate(f"{d} alone", Plan({"k": d}), 1e-3) for d in ("cpu0", "cpu1")]
    built = SimpleNamespace(placement=SimpleNamespace(devices=["cpu0"], kernel_devices=["cpu0"]))
    builds = {timing.timing_key(c): (built, 0.0) for c in candidates}
    model = SimpleNamespace(params=[], sample_inputs=lambda: [])
    timings = timing._time_side_by_side(candidates, builds, model, [np.ones(2)], 5)
    for t in timings.values():
        assert len(t.samples_s) == 5 and t.measured_s == pytest.approx(warm_s)
        assert t.outputs.max_rel_diff == 0.0


def test_a_throughput_run_builds_and_times_the_replicated_plans_and_the_pipeline(tmp_path, capsys):
    """The whole model replicated (one build per device) and the best pipeline are built and timed
    beside the plan and the single-device configurations; every output equals the reference."""
    row_path = tmp_path / "row.json"
    code, out, err = diviml_run(capsys, "--objective", "throughput", "--candidates", "1", "--json", str(row_path))
    assert code == 0, err
    row = json.loads(row_path.read_text())
    timed = {c["label"]: c for c in row["candidates"]["candidates"] if not c["left_out"]}
    (replicated,) = [c for label, c in timed.items() if label.endswith("the whole model replicated")]
    assert replicated["replicas"] == 1 and len(replicated["devices"]) == 1  # the primary device
    assert replicated["policy"] == "shares"
    (twin,) = [c for label, c in timed.items() if label.endswith("each input to the next free replica")]
    assert twin["policy"] == "next_free" and twin["predicted_s"] == replicated["predicted_s"]
    assert "the best pipeline" in timed
    for candidate in timed.values():
        assert candidate["measured_s"] > 0 and not candidate["outputs_differ"], candidate
        assert candidate["in_flight"] >= 1 and candidate["predicted_s"] > 0
    assert re.search(r"^kept .+: [0-9.]+x faster than the next candidate", out, re.MULTILINE), out
    assert "single-device configurations, measured now (a stream each, side by side with the plans)" in out


def test_a_batch_split_run_equals_the_whole_batch(tmp_path, capsys):
    """Two sub-batch copies, one per core, built from the batch-2 model, run side by side and joined:
    the outputs equal the batch-4 model's single-device build. (A convolutional net: an MLP's copies
    read the same weights, which roofline prices as the time they take, so no split of one wins.)"""
    row_path, library = tmp_path / "row.json", tmp_path / "split.so"
    model = "resnet18:resolution=32,classes=10,batch=4"
    code = main(["run", model, *FAST, "--batch-split", "2", "--json", str(row_path), "--export", str(library)])
    out, err = capsys.readouterr()
    assert code == 0, err
    row = json.loads(row_path.read_text())
    assert row["batch_split"] == 2 and sorted(row["copies"]) == ["0", "1"], out
    assert "outputs against the single-device build: " in out and ": equal" in out
    assert row["run"]["max_abs_diff"] <= 1e-5 and row["run"]["measured_s"] > 0
    # the export loads back and runs the batch as the copies did
    from tvm_diviml.runtime import SplitBuild
    from tvm_diviml.zoo import build_model
    from tvm_diviml.zoo.reference import run_reference

    whole = build_model("resnet18", {"resolution": 32, "classes": 10, "batch": 4})
    loaded = SplitBuild.load(str(library))
    assert len(loaded.builds) == 2 and loaded.batched == [True]
    with loaded.runner([w for _, w in whole.params]) as runner:
        got = runner(whole.sample_inputs())
    want = run_reference(whole, whole.sample_inputs())
    assert max(float(abs(g - w).max()) for g, w in zip(got, want, strict=True)) <= 1e-4


def test_a_batch_split_across_rpc_servers_is_refused(capsys):
    assert_one_line_error(
        capsys, ["run", MODEL, "--batch-split", "2", "--rpc", "local"], "--batch-split runs its copies"
    )
