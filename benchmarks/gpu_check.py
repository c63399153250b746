"""The llvm + CUDA check on a GPU machine that has no TVM compiler: build here, run there.

``prepare DIR`` (here, with the full TVM): plans a zoo model for ``h200-node`` (a CPU and an H200),
builds four placements — all on the GPU, all on the CPU, the latency solver's plan and a seeded mixed
plan that crosses between the devices many times — with CUDA code compiled to sm_90 by nvcc, exports
them with their placements, the per-kernel timing libraries for both targets, the graph, the weights,
sample inputs and the reference outputs of this machine's single-device CPU build; and packs a
runtime-only TVM (no compiler library) with the apache-tvm-ffi wheel for the GPU machine's Python.

``check DIR OUT`` (on the GPU machine, runtime-only TVM): times every kernel on each device and the
links between them (a measured cost table), predicts each plan with the simulator, runs each build
(one VM, and the concurrent executor), compares the outputs with the reference, and writes
``OUT/gpu_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

MODEL = "mobilenet_v2"
PLATFORM = "h200-node"
TVM_VERSION, FFI_VERSION = "0.27.0.post1", "0.1.14.post0"
PLANS = ("gpu", "cpu", "solver", "mixed")


def prepare(out: str, model_spec: str, python_version: str) -> None:
    os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")  # sm_90 fatbin, nothing compiled on load
    import tvm

    from tvm_diviml.app.load import load_model
    from tvm_diviml.cost.roofline import RooflineCostModel
    from tvm_diviml.modelspec import parse_model_spec
    from tvm_diviml.passes import apply_plan, build
    from tvm_diviml.plan import Plan
    from tvm_diviml.presets import load_platform
    from tvm_diviml.schedules.database import schedule_for_target
    from tvm_diviml.solvers import Problem, get_solver
    from tvm_diviml.zoo.reference import run_reference

    os.makedirs(out, exist_ok=True)
    platform = load_platform(PLATFORM)
    name, options = parse_model_spec(model_spec)
    loaded = load_model(name, options)
    model, extraction = loaded.built, loaded.extraction
    graph = extraction.graph
    cpu, gpu = platform.host, next(d.name for d in platform.devices if d.kind == "cuda")
    problem = Problem(graph, platform, RooflineCostModel(graph, platform), objective="latency")
    rng = random.Random(0)
    plans = {
        "gpu": Plan({k: gpu for k in graph.kernels}),
        "cpu": Plan({k: cpu for k in graph.kernels}),
        "solver": get_solver("split", time_limit_s=30).solve(problem),
        "mixed": Plan({k: rng.choice([cpu, gpu]) for k in graph.kernels}),
    }
    for label, plan in plans.items():
        began = time.perf_counter()
        build(apply_plan(model.mod, plan, platform, extraction=extraction)).export(f"{out}/plan_{label}.so")
        print(
            f"built plan {label} ({len(set(plan.assignment.values()))} devices) in {time.perf_counter() - began:.1f} s",
            flush=True,
        )
        plan.save(f"{out}/plan_{label}.json")
    funcs = {n: extraction.mod[n].with_attr("global_symbol", n) for n in sorted(set(extraction.kernel_func.values()))}
    for device in (cpu, gpu):
        target = tvm.target.Target(platform.device(device).target)
        scheduled = schedule_for_target(tvm.IRModule(funcs), target)
        tvm.compile(scheduled, target=target).export_library(f"{out}/kernels_{device}.so")
    specs = {n: [[[int(d) for d in p.shape], str(p.dtype)] for p in f.params] for n, f in funcs.items()}
    inputs = model.sample_inputs()
    reference = run_reference(model, inputs)
    with open(f"{out}/meta.json", "w") as handle:
        json.dump(
            {
                "model": model_spec,
                "graph": graph.to_json(),
                "platform": platform.to_json(),
                "kernel_func": extraction.kernel_func,
                "specs": specs,
                "cpu": cpu,
                "gpu": gpu,
            },
            handle,
        )
    np.savez(f"{out}/weights.npz", *[w for _, w in model.params])
    np.savez(f"{out}/io.npz", *inputs, *reference, num_inputs=len(inputs))
    _pack_runtime(out, python_version)


def _pack_runtime(out: str, python_version: str) -> None:
    """A runtime-only TVM (the package without libtvm_compiler.so and its C++ headers) and the
    apache-tvm-ffi wheel for the GPU machine's Python, fetched here with pip."""
    wheels = f"{out}/wheels"
    os.makedirs(wheels, exist_ok=True)
    abi = "cp" + python_version.replace(".", "")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            python_version,
            "--implementation",
            "cp",
            "--abi",
            abi,
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux_2_27_x86_64",
            "-d",
            wheels,
            f"apache-tvm=={TVM_VERSION}",
            f"apache-tvm-ffi=={FFI_VERSION}",
        ],
        check=True,
    )
    tvm_wheel = next(f for f in os.listdir(wheels) if f.startswith("apache_tvm-"))
    staging = f"{out}/staging"
    subprocess.run(
        [
            "unzip",
            "-q",
            "-o",
            f"{wheels}/{tvm_wheel}",
            "tvm/*",
            "-x",
            "tvm/lib/libtvm_compiler.so",
            "tvm/3rdparty/*",
            "-d",
            staging,
        ],
        check=True,
    )
    shutil.make_archive(f"{out}/tvm_runtime", "gztar", staging, "tvm")
    shutil.rmtree(staging)
    os.remove(f"{wheels}/{tvm_wheel}")


# ---------------------------------------------------------------------- on the GPU machine
def _time_kernels(path: str, specs: dict, device, repeats: int = 5) -> dict[str, float]:
    import tvm

    library = tvm.runtime.load_module(path)
    rng = np.random.default_rng(0)
    out = {}
    for name, params in specs.items():
        args = [
            tvm.runtime.tensor(
                rng.standard_normal(shape).astype(dtype) if dtype.startswith("float") else np.zeros(shape, dtype=dtype),
                device,
            )
            for shape, dtype in params
        ]
        timing = library.time_evaluator(name, device, number=1, repeat=repeats, min_repeat_ms=20)(*args)
        out[name] = float(np.median(timing.results))
    return out


def _load_cuda_runtime() -> None:
    """The CUDA runtime sidecar library: a runtime-only TVM does not load it by itself."""
    import ctypes

    import tvm

    path = os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_cuda.so")
    try:
        ctypes.CDLL(path)
    except OSError as error:
        print(f"cannot load {path}: {error}", flush=True)


def check(directory: str, out: str, repeats: int) -> dict:
    import tvm

    _load_cuda_runtime()

    from tvm_diviml.cost.roofline import RooflineCostModel
    from tvm_diviml.cost.table import TableCostModel
    from tvm_diviml.graph import OpGraph
    from tvm_diviml.plan import Plan
    from tvm_diviml.platform import Link, Platform
    from tvm_diviml.problem import Problem
    from tvm_diviml.runtime.concurrent import ConcurrentRunner
    from tvm_diviml.runtime.measure import time_calls, time_link
    from tvm_diviml.runtime.vm import PlacedExecutable, SingleVMRunner, tvm_device
    from tvm_diviml.simulator import simulate
    from tvm_diviml.tolerances import compare_outputs

    with open(f"{directory}/meta.json") as handle:
        meta = json.load(handle)
    graph, platform = OpGraph.from_json(meta["graph"]), Platform.from_json(meta["platform"])
    weights = np.load(f"{directory}/weights.npz")
    params = [weights[f"arr_{i}"] for i in range(len(weights.files))]
    io = np.load(f"{directory}/io.npz")
    count = int(io["num_inputs"])
    arrays = [io[f"arr_{i}"] for i in range(len(io.files) - 1)]
    inputs, reference = arrays[:count], arrays[count:]
    result: dict = {"model": meta["model"], "platform": platform.name, "gpu_name": None, "kernels": len(graph)}
    result["gpu_present"] = tvm.cuda(0).exist
    if result["gpu_present"]:
        result["gpu_name"] = tvm.cuda(0).device_name
    present = [d for d in (meta["cpu"], meta["gpu"]) if tvm_device(platform.device(d).device).exist]
    print("devices present:", present, result["gpu_name"], flush=True)
    per_func = {
        d: _time_kernels(f"{directory}/kernels_{d}.so", meta["specs"], tvm_device(platform.device(d).device))
        for d in present
    }
    compute = {k: {d: per_func[d][meta["kernel_func"][k]] for d in per_func} for k in graph.kernels}
    links = {}
    if len(present) == 2:
        for src, dst in ((meta["cpu"], meta["gpu"]), (meta["gpu"], meta["cpu"])):
            fit = time_link(platform.device(src), platform.device(dst))
            links[(src, dst)] = Link(src, dst, fit.latency_s, fit.bandwidth_Bps)
            result[f"link_{src}_to_{dst}"] = {"latency_s": fit.latency_s, "bandwidth_Bps": fit.bandwidth_Bps}
    measured_costs = TableCostModel(platform, compute, links)
    roofline = RooflineCostModel(graph, platform)
    result["sum_kernels_s"] = {d: sum(compute[k][d] for k in graph.kernels) for d in per_func}
    result["plans"] = {}
    for label in PLANS:
        plan = Plan.load(f"{directory}/plan_{label}.json")
        if not set(plan.assignment.values()) <= set(present):
            print(f"plan {label} skipped: it needs a device that is not present", flush=True)
            continue
        built = PlacedExecutable.load(f"{directory}/plan_{label}.so")
        row = {
            "devices": sorted(set(plan.assignment.values())),
            "kernels_per_device": {d: sum(v == d for v in plan.assignment.values()) for d in platform.device_names},
            "copies_per_run": built.placement.copies_per_run,
            "predicted_measured_costs_s": simulate(Problem(graph, platform, measured_costs), plan).value_s,
            "predicted_roofline_s": simulate(Problem(graph, platform, roofline), plan).value_s,
        }
        runner = SingleVMRunner(built, params)
        outputs = runner(inputs)
        compared = compare_outputs(outputs, reference)
        row["max_abs_diff"], row["max_rel_diff"] = compared.max_abs_diff, compared.max_rel_diff
        row["measured_single_vm_s"] = statistics.median(time_calls(runner, inputs, repeats))
        with ConcurrentRunner(built, params) as concurrent:
            row["measured_concurrent_s"] = statistics.median(time_calls(concurrent, inputs, repeats))
            row["segments"] = len(built.placement.segments)
        row["measured_over_predicted"] = row["measured_single_vm_s"] / row["predicted_measured_costs_s"]
        result["plans"][label] = row
        print(label, json.dumps(row), flush=True)
    os.makedirs(out, exist_ok=True)
    with open(f"{out}/gpu_check.json", "w") as handle:
        json.dump(result, handle, indent=1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="build everything here (full TVM, nvcc)")
    prep.add_argument("directory")
    prep.add_argument("--model", default=MODEL)
    prep.add_argument("--python", default="3.12", help="the GPU machine's Python version (for the ffi wheel)")
    run = commands.add_parser("check", help="run on the GPU machine (runtime-only TVM)")
    run.add_argument("directory")
    run.add_argument("out")
    run.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.directory, args.model, args.python)
    else:
        check(args.directory, args.out, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
