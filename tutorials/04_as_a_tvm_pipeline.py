"""Place a model with tvm.compile: PartitionForDevices as a Relax pipeline, the way TVM users build.

The whole placement (extract the kernels, price them, solve, apply the plan) is one module pass,
``PartitionForDevices``. This script, printed step by step:

1. builds a zoo model and compiles it whole for one CPU (the reference),
2. compiles it with ``tvm.compile(mod, target=None, relax_pipeline=partition.pipeline())`` for the
   ``cpu2`` platform (this machine's CPU as two single-thread devices) and runs it,
3. compiles it again through the registered pipeline name, ``relax_pipeline="diviml"``, whose
   options come from ``with partition_options(...)`` (TVM passes a named pipeline no arguments),
4. compares both placed builds with the reference and prints the plan.

Run:  python tutorials/04_as_a_tvm_pipeline.py [--model vit_b16] [--no-small]
Exits 0 when both placed builds reproduce the reference, 1 when the outputs differ.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

import numpy as np
import tvm

from tvm_diviml import PartitionForDevices, partition_options
from tvm_diviml.runtime.vm import PlacedExecutable, SingleVMRunner
from tvm_diviml.zoo import SMALL_OPTIONS, build_model
from tvm_diviml.zoo.reference import run_reference


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit_b16", help="a zoo model")
    parser.add_argument(
        "--small",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="build the model at its SMALL_OPTIONS size (seconds); --no-small: full size",
    )
    parser.add_argument("--platform", default="cpu2", help="a platform preset that runs on this machine")
    parser.add_argument("--objective", default="latency", choices=["latency", "throughput"])
    parser.add_argument("--solver", default="auto", help="a solver name, or auto for the objective's default")
    parser.add_argument("--time-limit", type=float, default=5.0, help="solver time limit in seconds")
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance against the reference")
    return parser.parse_args()


def step(message: str) -> None:
    print(f"\n== {message}", flush=True)


def timed_run(runner: SingleVMRunner, inputs: list[np.ndarray]) -> tuple[list[np.ndarray], float]:
    """Outputs and the seconds of one inference after a warm-up run."""
    runner(inputs)
    began = time.perf_counter()
    outputs = runner(inputs)
    return outputs, time.perf_counter() - began


def matches(outputs: list[np.ndarray], reference: list[np.ndarray], rtol: float) -> bool:
    ok = len(outputs) == len(reference)
    for index, (got, want) in enumerate(zip(outputs, reference)):
        close = got.shape == want.shape and np.allclose(got, want, rtol=rtol, atol=1e-6)
        print(
            f"   output {index}: shape {got.shape}, max |diff| {float(np.abs(got - want).max()):.3g}"
            f" -> {'ok' if close else 'DIFFERENT'}"
        )
        ok = ok and close
    return ok


def describe(partition) -> None:
    plan, placement = partition.plan, partition.placement
    per_device = Counter(plan.assignment.values())
    print(
        f"   solver {plan.solver}, objective {plan.objective}, simulated {plan.objective} "
        f"{plan.simulated_value_s * 1e3:.3f} ms (roofline costs)"
    )
    print(
        f"   kernels per device: {', '.join(f'{d} {n}' for d, n in sorted(per_device.items()))}; "
        f"{placement.copies_per_run} device copies per inference"
    )


def main() -> int:
    args = parse_args()
    options = SMALL_OPTIONS.get(args.model, {}) if args.small else {}
    params = {"objective": args.objective, "solver": args.solver, "time_limit_s": args.time_limit}

    step(f"build {args.model} {options or '(full size)'} and compile it whole for one CPU (the reference)")
    model = build_model(args.model, options)
    weights = [w for _, w in model.params]
    inputs = model.sample_inputs()
    began = time.perf_counter()
    reference = run_reference(model, inputs)
    print(f"   compiled and ran in {time.perf_counter() - began:.1f} s")

    step(f"tvm.compile(mod, target=None, relax_pipeline=PartitionForDevices('{args.platform}', ...).pipeline())")
    partition = PartitionForDevices(args.platform, **params)
    began = time.perf_counter()
    executable = tvm.compile(model.mod, target=None, relax_pipeline=partition.pipeline())
    print(f"   placed and compiled in {time.perf_counter() - began:.1f} s")
    describe(partition)
    outputs, seconds = timed_run(SingleVMRunner(PlacedExecutable(executable, partition.placement), weights), inputs)
    print(f"   one inference on {', '.join(partition.placement.devices)}: {seconds * 1e3:.2f} ms")
    ok = matches(outputs, reference, args.rtol)

    step(f"with partition_options('{args.platform}', ...): tvm.compile(mod, target=None, relax_pipeline='diviml')")
    with partition_options(args.platform, **params) as named:
        executable = tvm.compile(model.mod, target=None, relax_pipeline="diviml")
    same = named.plan.assignment == partition.plan.assignment
    print(f"   same plan as the pass object's: {same}")
    outputs, _ = timed_run(SingleVMRunner(PlacedExecutable(executable, named.placement), weights), inputs)
    ok = matches(outputs, reference, args.rtol) and ok

    step("result")
    print("   both placed builds reproduce the single-device reference" if ok else "   OUTPUTS DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
