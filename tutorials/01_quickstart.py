"""Quickstart: place a zoo model on two devices, build it, run it, and check it against the whole model.

The whole flow of tvm-diviml in one script, printed step by step:

1. build a model from the zoo (a Relax IRModule plus deterministic weights),
2. extract its graph of fused kernels (what the placement works on),
3. price every kernel on every device with the roofline cost model of the ``cpu2`` platform
   (this machine's CPU as two single-thread devices, so the result really runs here),
4. solve the placement problem (``--solver auto`` picks the default solver for the objective),
5. score the plan with the simulator,
6. apply the plan to the module, build one executable for both devices, run it,
7. compare the outputs with the model compiled whole for one CPU.

Run:  python tutorials/01_quickstart.py [--model twin_branch] [--objective latency]
Exits 0 when the placed build reproduces the reference, 1 when the outputs differ.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from tvm_diviml.cost import RooflineCostModel
from tvm_diviml.passes.apply_plan import apply_plan
from tvm_diviml.passes.build import build
from tvm_diviml.passes.extract import extract
from tvm_diviml.plan import Plan
from tvm_diviml.presets import load_platform
from tvm_diviml.runtime.vm import SingleVMRunner
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, default_solver, get_solver
from tvm_diviml.zoo import SMALL_OPTIONS, build_model
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

    step(f"build_model('{args.model}')")
    model = build_model(args.model, SMALL_OPTIONS.get(args.model, {}), seed=args.seed)
    print(f"   {model.name}: inputs {[(n, s) for n, s, _ in model.inputs]}, {len(model.params)} weights")

    step("extract the kernel graph")
    graph = extract(model.mod, model.entry, name=model.name).graph
    print(f"   {len(graph)} kernels, {sum(k.flops for k in graph.kernels.values()) / 1e6:.1f} MFLOP")

    step(f"cost model: roofline on platform {args.platform}")
    platform = load_platform(args.platform)
    costs = RooflineCostModel(graph, platform)
    for device in platform.devices:
        total = sum(costs.compute_s(k, device.name) for k in graph.kernels)
        print(f"   {device.name}: all kernels {total * 1e3:.2f} ms (efficiency {device.efficiency})")

    problem = Problem(graph, platform, costs, objective=args.objective)
    solver_name = default_solver(problem) if args.solver == "auto" else args.solver
    step(f"solve for {args.objective} with {solver_name}")
    plan = get_solver(solver_name, time_limit_s=10.0).solve(problem)
    per_device = {d: sum(1 for v in plan.assignment.values() if v == d) for d in platform.device_names}
    print(f"   kernels per device: {per_device}")

    step("score the plan with the simulator")
    sim = simulate(Problem(graph, platform, costs), plan)
    alone = min(
        simulate(
            Problem(graph, platform, costs),
            Plan(dict.fromkeys(graph.kernels, d), objective=plan.objective, mode=plan.mode),
        ).value_s
        for d in platform.device_names
    )
    print(f"   {plan.mode}: {sim.value_s * 1e3:.2f} ms (best single device {alone * 1e3:.2f} ms)")

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
