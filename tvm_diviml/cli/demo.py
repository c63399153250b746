"""``diviml demo``: the main job on built-in inputs, end to end; it grows as the project does (never
canned output)."""

from __future__ import annotations

import argparse
import importlib.util
import tempfile

from ..app.report import format_row, solve_and_report
from ..app.run import format_run, run_candidates
from ..app.workload import load_workload
from ..bench.frameworks import CATALOGUE, framework_row, tvm_default_seconds
from ..gantt import draw_schedule
from ..plan import OBJECTIVES
from ..problem import Problem
from ..profiling.candidates import format_selection
from ..units import format_seconds
from .arguments import png_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gantt",
        metavar="PATH",
        default="demo_schedule.png",
        type=png_path,
        help="where to draw the latency schedule (default demo_schedule.png; '' for none)",
    )


def run(args: argparse.Namespace) -> int:
    """The main job on built-in inputs; it grows as the project does (never canned output)."""
    model = "inception_v3"
    print(
        f"tvm-diviml demo: {model} (the zoo's Inception-v3, many parallel branches) is built with TVM Relax,\n"
        "its fused kernels are extracted, and it is placed on paper-node (a CPU and two different GPUs)\n"
        "with roofline costs: for latency by DiviML's splitting heuristic (exact solves of small modules),\n"
        "for throughput (a stream of inputs) by the exact MILP, and as a 3-stage pipeline by SliceGraph\n"
        "(a genetic search over topological orders, each cut into stages by an exact DP). Then an LLM is\n"
        "placed across four servers, and a model is planned, built and run for real on this machine (cpu2).\n"
    )
    workload = load_workload(model, "paper-node", "roofline")
    graph = workload.graph
    width, _ = graph.widest_antichain()
    print(
        f"extracted {len(graph)} kernels ({sum(k.flops for k in graph.kernels.values()) / 1e9:.2f} GFLOP, "
        f"widest antichain {width}) in {workload.loaded.extract_s:.2f} s\n"
    )
    for objective in OBJECTIVES:
        problem = Problem(
            graph, workload.platform, workload.costs, objective=objective, stages=len(workload.platform.devices)
        )
        plan, sim, row = solve_and_report(
            problem, "auto", workload.model, workload.cost_source, time_limit_s=60, bound_time_limit_s=10, replicas=True
        )
        print(f"== {objective} ==")
        print(format_row(row, workload.platform.device_names))
        if objective == "latency" and args.gantt:
            draw_schedule(graph, workload.platform, workload.costs, plan, sim, args.gantt)
            print(f"schedule drawn to {args.gantt}")
        print()
    cpu = workload.platform.device("cpu")
    print(
        f"Note: the CPU is priced at {cpu.efficiency:.1%} of its datasheet peak ({cpu.peak_flops / 1e12:.2f} "
        f"TFLOP/s -> {format_seconds(1e9 / cpu.effective_flops)} per GFLOP): what tvm-diviml's scheduled "
        "kernels reach on this machine's CPU (presets.py says where the figure comes from).\n"
    )
    _demo_servers(DEMO_LLM, DEMO_SERVERS)
    _demo_run(DEMO_RUN_MODEL)
    print(DEMO_NEXT)
    return 0


DEMO_NEXT = """
== next: your model, your machine, a build to ship (the command is .venv/bin/diviml) ==
  .venv/bin/pip install -e '.[onnx,onnxruntime]'       # to read .onnx files and check against ONNX Runtime
  diviml run model.onnx --reference onnxruntime         # your model: placed, built, run here and checked
  diviml platforms --detect --output my_machine.json    # your machine, in a file to edit and keep
  diviml plan model.onnx --platform my_machine.json     #   (docs/platform.md: the format)
  diviml run model.onnx --export out                    # a build to ship: library, weights, manifest
  python -c "import tvm_diviml; m = tvm_diviml.load('out'); print(m.inputs)"   # reload it; m(x) runs it
"""


DEMO_LLM, DEMO_SERVERS = "llama:layers=24", "servers:4xpaper-node"


def _demo_servers(model: str, platform: str) -> None:
    """The demo's LLM part: a 24-layer decoder on four servers, placed by the symmetric solver."""
    print(
        f"== {model} on {platform} ==\nA LLaMA-style decoder of 24 identical layers is placed on four servers "
        "(each a CPU and two GPUs, joined by a 100 Gb/s network) for throughput: the symmetric solver places "
        "one group of layers per server kind once and decides how many layers each server takes; then, as "
        "`diviml plan` does for throughput, the model replicated on several devices (each replica serving a "
        "share of the stream) is kept where it is faster. The bound is the whole problem's, replicas included.\n"
    )
    workload = load_workload(model, platform, "roofline")
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="throughput")
    _, _, row = solve_and_report(problem, "auto", workload.model, workload.cost_source, time_limit_s=60, replicas=True)
    print(format_row(row, workload.platform.device_names))
    print()


DEMO_RUN_MODEL = "twin_branch:hidden=1024"


def _demo_run(model: str) -> None:
    """The demo's second half: plan with measured costs, then build the plan and every single-device
    configuration (the whole CPU on both cores too) and run them side by side on cpu2."""
    print(
        f"== built and run on cpu2 ==\n{model} (two parallel branches of dense layers) is planned on cpu2, "
        "this machine's CPU as two single-thread devices, with kernel costs measured here (kernels scheduled "
        "by tvm-diviml's CPU rules); the plan is built into one heterogeneous executable and run by the "
        "concurrent executor (one worker thread per device), side by side with each single-device "
        "configuration, the whole CPU with both cores in every kernel among them: model parallelism against "
        "intra-operator parallelism, decided by measurement. The fastest is kept.\n"
    )
    workload = load_workload(model, "cpu2", "measured")
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="latency")
    plan, sim, row = solve_and_report(problem, "auto", model, "measured", time_limit_s=30)
    print(format_row(row, workload.platform.device_names))
    print()
    loaded = workload.loaded
    selection, measured, _ = run_candidates(loaded.built, loaded.extraction, problem, plan, 1)
    print(format_selection(selection))
    print(f"\nthe kept plan, run:\n{format_run(measured)}")
    _demo_frameworks(loaded.built, measured.measured_s)


def _demo_frameworks(built, kept_s: float) -> None:
    """The demo's last lines: the kept plan against what a user would run instead, timed here and now:
    ``tvm.compile``'s own default pipeline always; torch and ONNX Runtime on a torchvision model when
    they are installed (``diviml bench --suite frameworks`` is the whole comparison)."""
    default_s = tvm_default_seconds(built, built.sample_inputs())
    print(
        f"\nthe same model through tvm.compile's default CPU pipeline (TVM's own, on both cores): "
        f"{format_seconds(default_s)} per inference; the kept plan is {default_s / kept_s:.1f}x faster"
    )
    if importlib.util.find_spec("torchvision") is None:
        print("(with torch installed, `diviml bench --suite frameworks` times torch and ONNX Runtime beside it)")
        return
    print("\nresnet18 at 64x64 (torchvision), seconds per inference on this CPU, one run:")
    with tempfile.TemporaryDirectory(prefix="diviml-demo-") as scratch:
        row = framework_row("resnet18_64", CATALOGUE["resnet18_64"], scratch, 0.0, torch_compile=False, paired=False)
    for key, label in FRAMEWORK_COLUMNS:
        shown = format_seconds(row[key]) if row[key] else "-"
        print(f"  {label:<34}{shown:>12}")
    if row["notes"]:
        print(f"  ({row['notes']})")


FRAMEWORK_COLUMNS = (
    ("diviml_s", "diviml run (default options)"),
    ("tvm_default_s", "tvm.compile default"),
    ("torch_1_thread_s", "torch eager, 1 thread"),
    ("torch_s", "torch eager, every core"),
    ("onnxruntime_s", "ONNX Runtime, every core"),
)
