"""The ``diviml`` command in a subprocess: good paths, and every bad input as one line with exit 2."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tvm_diviml.cli import parse_args
from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.graph import OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.presets import get_platform
from tvm_diviml.problem import Problem
from tvm_diviml.simulator import simulate
from tvm_diviml.synthetic import random_dag

from ..helpers import diviml, hand_file

CONTRACT_KEYS = {
    "model",
    "platform",
    "objective",
    "mode",
    "solver",
    "value_s",
    "lower_bound_s",
    "gap",
    "solve_s",
    "optimal",
    "assignment",
    "stages",
    "baselines",
}


@pytest.fixture
def graph_and_costs(tmp_path):
    graph = random_dag(12, seed=3)
    graph_path = tmp_path / "graph.json"
    graph.save(str(graph_path))
    platform = get_platform("paper-node")
    times = {
        k: {d: 1e-3 * (1 + i % 3) * (10 if d == "cpu" else 1) for d in platform.device_names}
        for i, k in enumerate(graph.kernels)
    }
    cost_path = tmp_path / "costs.json"
    TableCostModel(platform, times).save(str(cost_path))
    return graph_path, cost_path, times


def test_plan_on_an_opgraph_with_a_cost_table(graph_and_costs):
    graph_path, cost_path, times = graph_and_costs
    result = diviml(
        "plan",
        graph_path,
        "--platform",
        "paper-node",
        "--cost",
        cost_path,
        "--solver",
        "fastest_single_device",
        "--json",
        "-",
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)
    assert CONTRACT_KEYS <= set(row)
    assert row["mode"] == "latency" and row["solver"] == "fastest_single_device" and row["kernels"] == 12
    device = next(iter(set(row["assignment"].values())))
    assert row["value_s"] >= sum(t[device] for t in times.values())  # all its kernels, one after another
    graph, platform = OpGraph.load(str(graph_path)), get_platform("paper-node")
    costs = TableCostModel.load(str(cost_path), platform, graph)
    assert row["value_s"] == simulate(Problem(graph, platform, costs), Plan(row["assignment"])).value_s
    assert row["value_s"] == min(
        simulate(Problem(graph, platform, costs), Plan({k: d for k in graph.kernels})).value_s
        for d in platform.device_names
    )
    assert row["baselines"]["fastest_single_device"] == row["value_s"]
    assert row["lower_bound_s"] <= row["value_s"] and row["gap"] >= 0


def test_plan_prints_a_table_and_writes_json(graph_and_costs, tmp_path):
    graph_path, cost_path, _ = graph_and_costs
    out = tmp_path / "plan.json"
    result = diviml(
        "plan",
        graph_path,
        "--cost",
        cost_path,
        "--objective",
        "pipeline",
        "--solver",
        "fastest_single_device",
        "--json",
        out,
    )
    assert result.returncode == 0, result.stderr
    assert "lower bound" in result.stdout and "rtx2080ti" in result.stdout
    row = json.loads(out.read_text())
    assert row["mode"] == "stage_serial" and len(row["stages"]) == 1


def test_json_reports_write_numpy_scalars_as_plain_values(tmp_path):
    from tvm_diviml.cli.output import write_json

    out = tmp_path / "row.json"
    write_json({"optimal": np.bool_(True), "gap": np.float64(0.25), "parts": [np.float64(np.inf)]}, str(out))
    assert json.loads(out.read_text()) == {"optimal": True, "gap": 0.25, "parts": [None]}


def test_plan_on_an_msr_fiddle_file(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(hand_file()))
    result = diviml("plan", path, "--solver", "fastest_single_device", "--json", "-")
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)
    assert row["mode"] == "host_staged" and row["objective"] == "throughput"
    # colour class {3, 4} and 120 bytes on one 100-byte accelerator: only the CPU holds the whole model
    assert set(row["assignment"].values()) == {"cpu0"} and row["value_s"] == pytest.approx(40e-3)


def test_plan_on_real_msr_fiddle_inference_files(msr_fiddle_dir):
    import glob

    for path in sorted(glob.glob(os.path.join(msr_fiddle_dir, "*-inputs", "*", "*_inference.json"))):
        result = diviml("plan", path, "--solver", "fastest_single_device", "--json", "-")
        assert result.returncode == 0, (path, result.stderr)
        assert json.loads(result.stdout)["feasible"]


@pytest.mark.parametrize("solver", ["greedy", "heft", "milp", "split"])
def test_latency_solvers_through_the_cli(solver):
    result = diviml(
        "plan",
        "random:kernels=10,seed=2",
        "--platform",
        "paper-node",
        "--solver",
        solver,
        "--time-limit",
        "30",
        "--json",
        "-",
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)
    assert CONTRACT_KEYS <= set(row) and row["solver"] == solver and row["kernels"] == 10
    assert {"fastest_single_device", "heft", "greedy"} <= set(row["baselines"])
    assert row["lower_bound_s"] <= row["value_s"] * (1 + 1e-9) and row["gap"] >= -1e-9
    if solver in ("milp", "split"):  # both start from the best of the baselines
        assert row["value_s"] <= min(row["baselines"].values()) * (1 + 1e-9)
    if solver == "milp":  # 10 kernels close well within the limit
        assert row["optimal"]


def test_platforms_list_and_print_presets():
    platforms = diviml("platforms")
    assert platforms.returncode == 0 and "paper-node" in platforms.stdout and "gpuK" in platforms.stdout
    preset = diviml("platforms", "--json", "cpu2")
    assert json.loads(preset.stdout)["devices"][1]["device"] == "cpu:1"


@pytest.mark.slow  # a few minutes; `make demo` runs it too
def test_demo_runs(tmp_path):
    from tvm_diviml.cli.demo import DEMO_NEXT

    demo = diviml("demo", cwd=tmp_path, timeout=600)  # 2-3 min on this 2-core machine
    assert demo.returncode == 0, demo.stderr
    # three objectives on paper-node, the LLM on four servers, then the plan built and run on cpu2
    assert demo.stdout.count("lower bound") == 5 and "solver split" in demo.stdout
    servers = demo.stdout.split("== llama:layers=24 on servers:4xpaper-node ==")[1]
    # the symmetric plan, then replicas where faster (the plan's stages replicated: 818 us against
    # 1.375 ms for the symmetric plan, 2026-12-04)
    assert "solver symmetric" in servers and "replicated (each replica takes a share of the stream)" in servers
    assert "replicas: " in servers
    assert (tmp_path / "demo_schedule.png").stat().st_size > 0
    ran = demo.stdout.split("== built and run on cpu2 ==")[1]
    assert "candidates, built and timed now" in ran and "<- kept" in ran and "(2 threads, the whole CPU)" in ran
    assert ": equal" in ran and "measured/predicted" in ran
    assert "speed-up over the best single-device configuration" in ran and "speed-up over one worker" in ran
    assert demo.stdout.rstrip().endswith(DEMO_NEXT.rstrip())


def test_the_demos_next_commands_are_ones_this_version_takes():
    """`make demo` ends with what to try next: each command must parse as written."""
    from tvm_diviml.cli.demo import DEMO_NEXT

    commands = [line.split("#")[0].split() for line in DEMO_NEXT.splitlines() if line.strip().startswith("diviml ")]
    assert [words[1] for words in commands] == ["run", "platforms", "plan", "run"]
    for words in commands:
        parse_args(words[1:])  # an option this version lacks exits with status 2


def _tiny_onnx(tmp_path):
    from ..helpers import tiny_onnx

    tiny_onnx(tmp_path / "tiny.onnx")
    return tmp_path / "tiny.onnx"


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _graph_json(**change):
    data = random_dag(4, seed=1).to_json()
    data.update(change)
    return data


BAD_INPUTS = {
    "malformed": lambda t: (["plan", _write(t, "bad.json", '{"kernels": [')], ["bad.json", "malformed JSON"]),
    "missing file": lambda t: (["plan", t / "nope.json"], ["nope.json", "no such file"]),
    "cycle": lambda t: (
        [
            "plan",
            _write(
                t,
                "cyc.json",
                _graph_json(edges=[{"src": "k0", "dst": "k1", "bytes": 1}, {"src": "k1", "dst": "k0", "bytes": 1}]),
            ),
        ],
        ["cyc.json", "edges", "cycle"],
    ),
    "negative size": lambda t: (
        [
            "plan",
            _write(
                t,
                "neg.json",
                _graph_json(
                    kernels=[{"name": "k0", "flops": -5}, {"name": "k1"}, {"name": "k2"}, {"name": "k3"}],
                    edges=[],
                    inputs=[],
                    weights={},
                ),
            ),
        ],
        ["neg.json", "kernels[k0].flops", "non-negative"],
    ),
    "unknown platform": lambda t: (["plan", "random", "--platform", "tpu-pod"], ["unknown platform 'tpu-pod'"]),
    "unknown model": lambda t: (["plan", "resnet9000"], ["unknown model 'resnet9000'"]),
    "bad model option": lambda t: (["plan", "random:kernels"], ["not key=value"]),
    "unknown device in costs": lambda t: (
        ["plan", "random:kernels=2", "--cost", _write(t, "c.json", {"kernels": {"k0": {"tpu": 1}, "k1": {"cpu": 1}}})],
        ["c.json", "kernels.k0.tpu", "unknown device 'tpu'"],
    ),
    "missing cost": lambda t: (
        [
            "plan",
            "random:kernels=2",
            "--cost",
            _write(t, "m.json", {"kernels": {"k0": {"cpu": 1, "rtx2080ti": 1, "gtx1080ti": 1}}}),
        ],
        ["m.json", "missing cost for kernel 'k1'"],
    ),
    "platform with target options": lambda t: (
        [
            "plan",
            "random",
            "--platform",
            _write(t, "p.json", {"devices": [{"name": "c", "target": "llvm -mcpu=znver3", "device": "cpu:0"}]}),
        ],
        ["p.json", "devices[c].target", "has options"],
    ),
    "colour class that cannot be honoured": lambda t: (
        [
            "plan",
            _write(
                t,
                "colour.json",
                {
                    **hand_file(maxCPUs=0),
                    "nodes": [{**n, "supportedOnFpga": 0 if n["id"] == 3 else 1} for n in hand_file()["nodes"]],
                },
            ),
        ],
        ["can run on no device"],
    ),
    "msr-fiddle with a platform": lambda t: (
        ["plan", _write(t, "f.json", hand_file()), "--platform", "cpu2"],
        ["carries its own"],
    ),
    "unknown zoo option": lambda t: (
        ["graph", "resnet18:depth=3"],
        ["model 'resnet18' has no option 'depth'", "resolution=224"],
    ),
    "bad zoo option value": lambda t: (
        ["graph", "resnet18:resolution=abc"],
        ["option 'resolution' of 'resnet18' must be a positive integer"],
    ),
    "unbound symbolic onnx dimension": lambda t: (
        ["graph", _tiny_onnx(t)],
        ["tiny.onnx", "symbolic dimension 'N'", "--shape N=VALUE"],
    ),
    "shape for a zoo model": lambda t: (["graph", "resnet18", "--shape", "N=2"], ["--shape applies to imported"]),
    "latency solver for throughput": lambda t: (
        ["plan", "random:kernels=4", "--objective", "throughput", "--solver", "heft"],
        ["objective", "throughput"],
    ),
    "memory nothing can hold": lambda t: (
        [
            "plan",
            _write(
                t,
                "big.json",
                _graph_json(
                    weights={"w": 1e15},
                    kernels=[{"name": "k0", "weights": ["w"]}, {"name": "k1"}, {"name": "k2"}, {"name": "k3"}],
                ),
            ),
            "--platform",
            "paper-node",
            "--solver",
            "milp",
        ],
        ["k0", "needs", "931322.6 GiB", "192.0 GiB"],
    ),
    "unwritable json": lambda t: (["plan", "random", "--json", t / "no" / "such" / "dir.json"], ["cannot write"]),
    # checked before any solving or building
    "export into a missing folder": lambda t: (
        ["run", "twin_branch", "--export", t / "nodir" / "x.so"],
        ["cannot write --export", "does not exist"],
    ),
    "gantt onto a folder": lambda t: (["plan", "random", "--gantt", t], ["cannot write --gantt", "a folder of that"]),
    "a folder as the model": lambda t: (["plan", t], [str(t), "is a folder, not a model"]),
    "json and gantt to one file": lambda t: (
        ["plan", "random", "--json", t / "x.png", "--gantt", t / "x.png"],
        ["--json and --gantt name the same file"],
    ),
    "gantt without suffix onto the json": lambda t: (
        ["plan", "random", "--json", t / "x.png", "--gantt", t / "x"],
        ["--json and --gantt name the same file"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(case, tmp_path):
    args, fragments = BAD_INPUTS[case](tmp_path)
    result = diviml(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diviml: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.stderr


def test_debug_shows_the_traceback():
    result = diviml("--debug", "plan", "resnet9000")
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_models_lists_the_zoo_with_options():
    result = diviml("models")
    assert result.returncode == 0, result.stderr
    for name in (
        "resnet18",
        "resnet50",
        "mobilenet_v2",
        "inception_v3",
        "bert_base",
        "gpt2",
        "vit_b16",
        "randwire_ws",
        "randwire_er",
        "randwire_ba",
    ):
        assert f"\n{name} " in "\n" + result.stdout
    assert "nodes=32,seed=0" in result.stdout


def test_graph_summary_and_json_for_a_zoo_model():
    summary = diviml("graph", "resnet18:resolution=32")
    assert summary.returncode == 0, summary.stderr
    # 20 convolutions, the max pool, the global pool, the classifier and the input's change to NHWC
    assert "kernels: 24" in summary.stdout and "widest antichain" in summary.stdout
    result = diviml("graph", "resnet18:resolution=32", "--json", "-")
    graph = OpGraph.from_json(json.loads(result.stdout))
    assert len(graph) == 24 and all("primfunc_hash" in k.attrs for k in graph.kernels.values())


def test_graph_and_plan_for_an_onnx_file_with_a_bound_shape(tmp_path):
    path = _tiny_onnx(tmp_path)
    result = diviml("graph", path, "--shape", "N=2", "--json", "-")
    assert result.returncode == 0, result.stderr
    assert OpGraph.from_json(json.loads(result.stdout)).inputs[0].bytes == 2 * 3 * 8 * 8 * 4
    plan = diviml("plan", path, "--shape", "N=2", "--json", "-")
    assert plan.returncode == 0, plan.stderr
    # the input to NHWC, conv+relu, mean, matmul; the reshape is a view
    assert json.loads(plan.stdout)["kernels"] == 4


def test_bad_shape_syntax_is_an_argument_error():
    result = diviml("graph", "resnet18", "--shape", "N")
    assert result.returncode == 2 and "NAME=VALUE" in result.stderr


def test_a_stream_of_one_input_is_an_argument_error():
    result = diviml("run", "twin_branch", "--objective", "throughput", "--inputs", "1")
    assert result.returncode == 2 and "--inputs: must be at least 2" in result.stderr


@pytest.mark.parametrize(
    "objective, extra, solver",
    [
        ("throughput", [], "milp"),
        ("pipeline", ["--stages", "2", "--bound-time-limit", "2"], "downsets"),
    ],
)
def test_auto_solves_throughput_and_pipelines(objective, extra, solver):
    result = diviml(
        "plan",
        "random:kernels=12,seed=3",
        "--platform",
        "paper-node",
        "--objective",
        objective,
        *extra,
        "--time-limit",
        "20",
        "--json",
        "-",
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)
    assert CONTRACT_KEYS <= set(row) and row["solver"] == solver and row["objective"] == objective
    assert row["lower_bound_s"] <= row["value_s"] * (1 + 1e-9)
    assert row["value_s"] <= row["baselines"]["fastest_single_device"]
    if objective == "pipeline":
        assert 1 <= len(row["stages"]) <= 2 and len(set(row["stage_devices"])) == len(row["stages"])
        # the downset DP proves its plan optimal: its value is the bound, and no MIP bound runs
        assert row["optimal"] and row["gap"] <= 1e-6 and {"solver", "lp_load"} <= set(row["lower_bound_parts"])
        assert "three_superblock" not in row["lower_bound_parts"]
    else:
        # 12 kernels: the MILP proves it at once, among plans without replicas (`plan` may replicate)
        assert row["optimal"] or row["replicas"] or "solver" not in row["lower_bound_parts"]


def test_auto_solves_an_msr_fiddle_file_exactly(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(hand_file(maxSizePerFPGA=1000.0)))
    result = diviml("plan", path, "--json", "-")
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)
    assert row["solver"] == "downsets" and row["optimal"]
    # {1, 2} on one accelerator, {3, 4} (a colour class) on another: 7.75 ms (see test_msr_fiddle)
    assert row["value_s"] == pytest.approx(7.75e-3)


def test_a_plan_that_overflows_memory_says_so_and_exits_1(tmp_path):
    """a -> b -> c -> d with a skip a -> d: each kernel's working set (8 B) fits the 10 B device, but
    a's tensor stays live across c, so every order peaks at 12 B. HEFT has nowhere else to go: the
    plan comes back marked INFEASIBLE, naming the device, and the exit status is 1."""
    from ..helpers import graph_of

    graph = graph_of(
        [("a", "b", 4), ("b", "c", 4), ("c", "d", 4), ("a", "d", 4)], output_bytes={"a": 4, "b": 4, "c": 4}
    )
    graph_path = tmp_path / "graph.json"
    graph.save(str(graph_path))
    platform_path = tmp_path / "small.json"
    platform_path.write_text(
        json.dumps(
            {
                "name": "small",
                "devices": [
                    {
                        "name": "cpu",
                        "target": {"kind": "llvm"},
                        "device": "cpu:0",
                        "memory_bytes": 10,
                        "peak_flops": 1e12,
                        "bandwidth_Bps": 1e11,
                    }
                ],
            }
        )
    )
    done = diviml("plan", graph_path, "--platform", platform_path, "--solver", "heft")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "INFEASIBLE: device 'cpu' needs 12 B, has 10 B" in done.stdout


@pytest.mark.parametrize("solver", ["split", "cpsat", "milp"])
def test_a_time_limit_past_any_clock_is_no_limit(solver):
    """1e308 s overflowed the platform's time_t in the wait on CP-SAT's worker (a traceback)."""
    result = diviml(
        "plan", "random:kernels=8,seed=1", "--solver", solver, "--time-limit", "1e308", "--bound-time-limit", "1e300"
    )
    assert result.returncode == 0, result.stderr
    assert "gap: 0.0%" in result.stdout, result.stdout


def test_an_unknown_model_is_refused_before_tvm_is_imported():
    """A typo is answered at once (TVM's import alone takes 5 s here), and named like build_model names it."""
    code = (
        "import sys\n"
        "from tvm_diviml.app.workload import load_graph\n"
        "from tvm_diviml.errors import DivimlInputError\n"
        "try:\n"
        "    load_graph('resnett18')\n"
        "except DivimlInputError as error:\n"
        "    print(error, 'tvm' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "unknown model 'resnett18'" in run.stdout and "resnet18" in run.stdout, run.stderr
    assert run.stdout.strip().endswith("False")
