"""Pipeline and throughput: place a model for a stream of inputs, run the stream, and compare the period.

Latency asks how fast one inference finishes; a stream asks how often a result comes out. With
several inputs in flight, each device works on a different input at once, so the time per
inference (the period) approaches the busiest device's share of the work. This script, printed
step by step:

1. loads a zoo model and prices its kernels on ``cpu2`` (this machine's CPU as two single-thread
   devices): roofline estimates by default, ``--cost measured`` times every kernel with TVM,
2. places it three times: as a 2-stage pipeline (SliceGraph: contiguous stages, one device each),
   for throughput (the exact MILP by default: any assignment whose busiest device is least loaded),
   and as the whole model replicated on every device (each input runs on one of them, the stream
   shared in proportion to their speed: data parallelism),
3. prices each plan's stream as the executor runs it (``simulator.stream_price``: the busiest
   device's load per inference, and what one input takes through the executor over the inputs in
   flight),
4. builds each plan (``build_runnable``: one executable, one Relax function per same-device segment;
   a replicated plan is one executable per replica) and streams inputs through its runner
   (``open_runner``: one worker thread per device; replicas side by side) with several in flight,
5. prints predicted against measured seconds per inference, and the single-device build's time,
6. checks every streamed output against the single-device build, itself checked against the
   model compiled whole (``run_reference``).

The default model, ``twin_branch:branches=1,depth=8``, is a chain of equal layers: a pipeline cut
in the middle gives both devices the same work.

Run:  python tutorials/03_pipeline_throughput.py [--model resnet18] [--cost measured] [--in-flight 3]
Exits 0 when every placed output matches the reference, 1 when some differ, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from tvm_diviml.app.workload import load_workload
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.modelspec import format_model_spec
from tvm_diviml.passes.apply_plan import apply_plan
from tvm_diviml.passes.build import build
from tvm_diviml.passes.timing import build_runnable, open_runner
from tvm_diviml.plan import Plan
from tvm_diviml.runtime.measure import time_calls, time_stream
from tvm_diviml.runtime.routed import RoutedBuild
from tvm_diviml.runtime.vm import SingleVMRunner
from tvm_diviml.simulator import simulate, stream_price
from tvm_diviml.solvers import Problem, get_solver
from tvm_diviml.solvers.replicas import whole_model_replicas
from tvm_diviml.tolerances import compare_outputs
from tvm_diviml.zoo import SMALL_OPTIONS
from tvm_diviml.zoo.reference import run_reference


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        default="twin_branch:branches=1,depth=8",
        help="a zoo model, with options (a bare name runs at its SMALL_OPTIONS size)",
    )
    parser.add_argument("--platform", default="cpu2", help="a platform whose devices this machine has")
    parser.add_argument(
        "--cost",
        default="roofline",
        choices=["roofline", "measured"],
        help="roofline estimates (default, instant) or kernels timed with TVM here",
    )
    parser.add_argument(
        "--throughput-solver",
        default="milp",
        choices=["milp", "greedy", "split"],
        help="the solver of the throughput plan",
    )
    parser.add_argument("--inputs", type=positive_int, default=8, help="inputs streamed through each build")
    parser.add_argument(
        "--in-flight", type=positive_int, help="inputs in the devices at once (default: as each stream's price asks)"
    )
    parser.add_argument("--time-limit", type=float, default=5.0, help="solver time limit in seconds")
    parser.add_argument("--seed", type=int, default=0, help="the solvers' seed")
    parser.add_argument(
        "--rtol",
        type=float,
        default=1e-5,
        help="largest difference, relative to the reference's largest output, counted as equal",
    )
    return parser.parse_args()


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def step(message: str) -> None:
    print(f"\n== {message}", flush=True)


def model_spec(model: str) -> str:
    """A bare zoo name at its SMALL_OPTIONS size; a name with options as given."""
    if ":" in model or model not in SMALL_OPTIONS:
        return model
    return format_model_spec(model, SMALL_OPTIONS[model])


def describe(built, acyclic: bool) -> str:
    """The build's segments in run order; a device that comes back in the chain makes the device graph
    cyclic. A replicated build: its replicas and their shares of the stream."""
    if isinstance(built, RoutedBuild):
        return "replicas, each input on one: " + ", ".join(
            f"{name} {100 * share:.0f}%" for name, share in zip(built.names, built.shares, strict=True)
        )
    segments = built.placement.segments
    chain = " -> ".join(f"{seg['device']}[{len(seg['kernels'])}]" for seg in segments)
    return (
        f"{len(segments)} segments (device[kernels], in run order): {chain}; "
        f"device graph {'acyclic' if acyclic else 'cyclic'}"
    )


def main() -> int:
    args = parse_args()
    spec = model_spec(args.model)

    step(f"1. load {spec} and price its kernels on {args.platform} ({args.cost} costs)")
    began = time.perf_counter()
    workload = load_workload(spec, args.platform, args.cost)
    if workload.loaded is None:
        raise DivimlInputError(f"'{spec}' has no TVM kernels to build", field="--model", hint="give a zoo model")
    model, extraction = workload.loaded.built, workload.loaded.extraction
    graph, platform, costs = workload.graph, workload.platform, workload.costs
    print(
        f"{len(graph)} kernels, {sum(k.flops for k in graph.kernels.values()) / 1e6:.1f} MFLOP, "
        f"devices {', '.join(platform.device_names)} ({time.perf_counter() - began:.1f} s)"
    )

    step("2. the single-device build: the reference for every streamed input")
    weights = [w for _, w in model.params]
    stream = [model.sample_inputs(seed) for seed in range(args.inputs)]
    single = SingleVMRunner(
        build(
            apply_plan(model.mod, Plan(dict.fromkeys(graph.kernels, platform.host)), platform, extraction=extraction)
        ),
        weights,
    )
    whole_rel = compare_outputs(single(stream[0]), run_reference(model, stream[0])).max_rel_diff
    references = [single(inputs) for inputs in stream]
    single_s = statistics.median(time_calls(single, stream[0], repeats=3))
    single_predicted = sum(costs.compute_s(kernel, platform.host) for kernel in graph.kernels)
    print(
        f"all kernels on {platform.host}: predicted {single_predicted * 1e3:.2f} ms, measured "
        f"{single_s * 1e3:.2f} ms per inference; against the model compiled whole: max rel diff {whole_rel:.2g}"
    )
    worst = whole_rel

    throughput = Problem(graph, platform, costs, objective="throughput")
    plans = [
        (
            "a pipeline in 2 stages, solved by slicegraph",
            Problem(graph, platform, costs, objective="pipeline", stages=2),
        ),
        (f"throughput, solved by {args.throughput_solver}", throughput),
        ("throughput, the whole model replicated on every device", throughput),
    ]
    for number, (title, problem) in enumerate(plans, start=3):
        step(f"{number}. {title}")
        if "replicated" in title:
            plan = whole_model_replicas(problem)
        else:
            solver = "slicegraph" if problem.objective == "pipeline" else args.throughput_solver
            plan = get_solver(solver, time_limit_s=args.time_limit, seed=args.seed).solve(problem)
        price = stream_price(problem, plan, args.in_flight)
        built, _ = build_runnable(model, extraction, platform, plan, progress=print)
        print(describe(built, simulate(problem, plan).device_graph_acyclic))
        with open_runner(built, weights) as runner:
            outputs = list(runner.stream(stream, in_flight=price.in_flight))
            measured = time_stream(runner, stream, price.in_flight)
            busy = {device: seconds / len(stream) for device, seconds in runner.busy_s.items()}  # last stream
        rel = max(compare_outputs(got, want).max_rel_diff for got, want in zip(outputs, references, strict=True))
        worst = max(worst, rel)
        print(
            f"period: predicted {price.period_s * 1e3:.2f} ms (busiest device {price.load_s * 1e3:.2f} ms, one "
            f"input {price.latency_s * 1e3:.2f} ms over {price.in_flight} in flight), measured "
            f"{measured * 1e3:.2f} ms per inference ({args.inputs} inputs): "
            f"measured/predicted {measured / price.period_s:.2f}"
        )
        print("busy per inference: " + ", ".join(f"{d} {s * 1e3:.2f} ms" for d, s in sorted(busy.items())))
        print(
            f"speed-up over the single-device build: predicted {single_predicted / price.period_s:.2f}x, "
            f"measured {single_s / measured:.2f}x; {len(outputs)} outputs in input order, max rel diff {rel:.2g}"
        )

    verdict = worst <= args.rtol
    step(
        f"every output {'matches' if verdict else 'DIFFERS from'} the reference (max rel diff {worst:.2g}, "
        f"rtol {args.rtol:g})"
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except DivimlInputError as error:  # a bad --model or --platform: say what, not a traceback
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
