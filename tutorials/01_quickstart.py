"""Quickstart: place a zoo model on two devices, build it, run it, and check it against the whole model.

The whole flow of tvm-diviml in one script, printed step by step:

1. build a model from the zoo (a Relax IRModule plus deterministic weights) and extract its graph of
   fused kernels (what the placement works on): ``tvm_diviml.load_model``,
2. price every kernel on every device with the roofline cost model of the ``cpu2`` platform
   (this machine's CPU as two single-thread devices, so the result really runs here),
3. solve the placement problem and score the plan with the simulator: ``tvm_diviml.plan_model``
   (``--solver auto``: the default solver for the objective, the fastest single device kept where
   the split is not predicted faster), with its lower bound and the best single device beside it,
4. apply the plan to the module, build one executable for both devices, run it,
5. compare the outputs with the model compiled whole for one CPU.

``tvm_diviml.run_model`` does steps 1-5 in one call, timing the build against every single device as
``diviml run`` does.

Run:  python tutorials/01_quickstart.py [--model twin_branch] [--objective latency]
Exits 0 when the placed build reproduces the reference, 1 when the outputs differ.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from tvm_diviml import Problem, apply_plan, build, load_model, load_platform, plan_model
from tvm_diviml.cost import RooflineCostModel
from tvm_diviml.runtime.vm import SingleVMRunner
from tvm_diviml.zoo import SMALL_OPTIONS
from tvm_diviml.zoo.reference import run_reference


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="twin_branch", help="a zoo model (run at its SMALL_OPTIONS size)")
    parser.add_argument("--objective", default="latency", choices=["latency", "throughput"])
    parser.add_argument("--solver", default="auto", help="a solver name, or auto for the objective's default")
    parser.add_argument("--platform", default="cpu2", help="a platform preset that runs on this machine")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="largest relative difference accepted")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the inputs")
    return parser.parse_args()


def step(message: str) -> None:
    print(f"\n== {message}", flush=True)


def compare(outputs: list[np.ndarray], reference: list[np.ndarray], tolerance: float) -> bool:
    """Print the largest absolute and relative differences per output; True when all are within tolerance."""
    ok = len(outputs) == len(reference)
    for index, (got, want) in enumerate(zip(outputs, reference)):
        abs_diff = float(np.abs(got - want).max())
        rel_diff = abs_diff / max(float(np.abs(want).max()), 1e-30)
        within = got.shape == want.shape and rel_diff <= tolerance
        print(
            f"   output {index}: shape {got.shape}, max |diff| {abs_diff:.3g}, relative {rel_diff:.3g}"
            f" {'ok' if within else 'DIFFERS'}"
        )
        ok = ok and within
    return ok


def main() -> int:
    args = parse_args()
    began = time.perf_counter()

    step(f"load_model('{args.model}'): built and its kernel graph extracted")
    loaded = load_model(args.model, {**SMALL_OPTIONS.get(args.model, {}), "seed": args.seed})
    model, graph = loaded.built, loaded.extraction.graph
    print(f"   {model.name}: inputs {[(n, s) for n, s, _ in model.inputs]}, {len(model.params)} weights")
    print(f"   {len(graph)} kernels, {sum(k.flops for k in graph.kernels.values()) / 1e6:.1f} MFLOP")

    step(f"cost model: roofline on platform {args.platform}")
    platform = load_platform(args.platform)
    costs = RooflineCostModel(graph, platform)
    for device in platform.devices:
        total = sum(costs.compute_s(k, device.name) for k in graph.kernels)
        print(f"   {device.name}: all kernels {total * 1e3:.2f} ms (efficiency {device.efficiency})")

    step(f"plan_model: solve for {args.objective} with {args.solver}, scored by the simulator")
    solved = plan_model(Problem(graph, platform, costs, objective=args.objective), args.solver, time_limit_s=10.0)
    plan = solved.plan
    per_device = {d: sum(1 for v in plan.assignment.values() if v == d) for d in platform.device_names}
    print(f"   solver {plan.solver}; kernels per device: {per_device}")
    if solved.kept_single_device:
        print(f"   {solved.kept_single_device}")
    alone = solved.baselines["fastest_single_device"]
    print(
        f"   {plan.mode}: {solved.value_s * 1e3:.2f} ms, lower bound {solved.bound_s * 1e3:.2f} ms "
        f"(best single device {alone * 1e3:.2f} ms)"
    )

    step("apply the plan, build, run")
    applied = apply_plan(model.mod, plan, platform, entry=model.entry)
    print(f"   devices {applied.placement.devices}, {applied.placement.copies_per_run} copies per run")
    built = build(applied)
    runner = SingleVMRunner(built, [weight for _, weight in model.params])
    inputs = model.sample_inputs(seed=args.seed)
    outputs = runner(inputs)

    step("compare with the model compiled whole (run_reference)")
    ok = compare(outputs, run_reference(model, inputs), args.tolerance)
    print(f"\n{'PASS' if ok else 'FAIL'} in {time.perf_counter() - began:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
