"""Throughput over the fastest single device in the simulator: model parallelism alone, with replicas,
and with batch splits, on the presets of the DiviML paper's kind of machine (roofline costs).

DiviML (the paper this project builds on) reports up to 2.9x the throughput of the fastest GPU from
data and model parallelism together. This prints, per preset and model, the period of:

- the fastest single device (the baseline),
- the throughput MILP (model parallelism: each kernel on one device),
- the best of that plan with its stages or the whole model replicated (``solvers.replicas``),
- the best batch split of a batch of B as R sub-batch copies placed together (data parallelism),
  each split solved by the MILP,

and each one's speed-up over the baseline. These are predictions of the simulator, not measurements:
no machine here has these GPUs.

Run:  .venv/bin/python benchmarks/data_model_parallelism.py [--time-limit 20] [--batch 8]
"""

from __future__ import annotations

import argparse
import logging

from tvm_diviml.app.dataparallel import batch_split_workloads, solve_batch_splits
from tvm_diviml.planning import plan_model
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem
from tvm_diviml.solvers.replicas import best_with_replicas
from tvm_diviml.toolkit.single_device import single_device_values

PRESETS = ("paper-node", "h200-node")
MODELS = ("resnet50", "inception_v3", "bert_base", "randwire_ws")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per solve")
    parser.add_argument("--batch", type=int, default=8, help="the batch B, split into up to B copies")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print("| preset | model | batch | fastest single device | model parallelism | + replicas | + batch split |")
    print("|---|---|---|---|---|---|---|")
    for preset in PRESETS:
        for name in MODELS:
            spec = f"{name}:batch={args.batch}"
            workloads = batch_split_workloads(spec, preset, "roofline", args.batch)
            whole = workloads[1]
            problem = Problem(whole.graph, whole.platform, whole.costs, objective="throughput")
            single, _ = single_device_values(problem)
            base = single.value_s
            milp = plan_model(problem, "milp", time_limit_s=args.time_limit).plan
            replicated = best_with_replicas(problem, milp, "replicas")
            _, split_sim, row, _ = solve_batch_splits(workloads, "milp", "throughput", time_limit_s=args.time_limit)
            cells = [
                cell(base, simulate(problem, milp).value_s),
                cell(base, simulate(problem, replicated).value_s, replicated.replicas_option),
                cell(base, split_sim.value_s, f"R={row['batch_split']}"),
            ]
            device = single.devices_used()[0]
            print(
                f"| {preset} | {name} | {args.batch} | {base * 1e3:.3f} ms ({device}) | {' | '.join(cells)} |",
                flush=True,
            )


def cell(base: float, seconds: float, note: str = "") -> str:
    """A period and its speed-up over ``base``."""
    return f"{seconds * 1e3:.3f} ms ({base / seconds:.2f}x{', ' + note if note else ''})"


if __name__ == "__main__":
    main()
