"""Place an LLM across several servers, then run one across TVM RPC servers started on this machine.

This script, printed step by step:

1. plans ``llama:layers=N`` on four servers of the paper's kind (``servers:4xpaper-node``, roofline
   costs: those servers are not here) with the symmetric solver, which solves one group of layers per
   server kind once and decides how many layers each server takes, beside the whole-graph solvers
   (split for latency, the MILP for throughput): values, the whole problem's bound, solve times;
2. starts one TVM RPC server per server on 127.0.0.1 and measures a hop through the driver (TVM RPC
   has no server-to-server copy: a tensor that crosses servers is downloaded and uploaded again);
3. plans a small llama for throughput on those servers (``servers:Kxcpu1``) with kernel costs measured
   here and cross-server copies priced as the two hops just measured;
4. builds each server's part, uploads it with its weights, runs a stream of inputs across the servers,
   checks the outputs against the single-device reference and prints measured against predicted per
   server.

Run:  python tutorials/05_llm_multi_server.py [--layers 24] [--servers 3]
Exits 0 when the run across servers reproduces the reference, 1 when the outputs differ.
"""

from __future__ import annotations

import argparse
import sys

from tvm_diviml import load_workload
from tvm_diviml.app.rpc_run import format_rpc_run, over_driver_hops, predicted_over_rpc, run_plan_rpc
from tvm_diviml.profiling.rpc_hops import measure_driver_hops
from tvm_diviml.runtime.rpc_servers import connect_servers, start_local_servers
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, get_solver
from tvm_diviml.units import format_seconds

# Small enough to run in seconds on an unscheduled CPU, large enough that a layer outweighs a hop.
RUN_MODEL = "llama:layers=4,hidden=128,heads=4,kv_heads=2,intermediate=256,vocab=128,seq=32"
WHOLE_GRAPH_SOLVER = {"latency": "split", "throughput": "milp"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8, help="layers of the llama planned on four servers")
    parser.add_argument("--platform", default="servers:4xpaper-node", help="the servers to plan for")
    parser.add_argument("--servers", type=int, default=2, help="RPC servers to start here for the run")
    parser.add_argument("--time-limit", type=float, default=30.0, help="each solver's time limit in seconds")
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance against the reference")
    return parser.parse_args()


def step(message: str) -> None:
    print(f"\n== {message}", flush=True)


def plan_across_servers(model: str, platform: str, time_limit_s: float) -> None:
    """Step 1: the symmetric solver beside the whole-graph solver, for latency and for throughput."""
    workload = load_workload(model, platform)
    print(f"   {len(workload.graph)} kernels, {len(workload.platform.devices)} devices")
    for objective, whole in WHOLE_GRAPH_SOLVER.items():
        problem = Problem(workload.graph, workload.platform, workload.costs, objective=objective)
        symmetric = get_solver("symmetric", time_limit_s=time_limit_s).solve(problem)
        found = symmetric.attrs["symmetric"]
        if "fallback" in found:
            print(f"   {objective}: the symmetric solver fell back: {found['fallback']}")
        else:
            per_server = ", ".join(f"{s} {sum(run['blocks'] for run in runs)}" for s, runs in found["servers"].items())
            print(
                f"   {objective}: {found['blocks']} blocks of {found['block_kernels']} kernels; "
                f"blocks per server: {per_server}"
            )
        full = get_solver(whole, time_limit_s=time_limit_s).solve(problem)
        bound = symmetric.lower_bound_s
        for plan in (symmetric, full):
            print(
                f"   {objective:>10} {plan.solver:>9}: {format_seconds(plan.value_s)} "
                f"(gap to the bound {format_seconds(bound)}: {plan.value_s / bound - 1:.1%}), "
                f"solved in {plan.solve_s:.2f} s"
            )
        print(
            f"   symmetric/{whole}: value {symmetric.value_s / full.value_s:.3f}x, "
            f"solve time {full.solve_s / symmetric.solve_s:.1f}x faster"
        )


def run_across_servers(model: str, count: int, time_limit_s: float, rtol: float) -> bool:
    """Steps 2-4: loopback RPC servers, hops measured, a plan priced with them, built, run, checked."""
    platform = f"servers:{count}xcpu1"
    with start_local_servers(count) as local:
        print(f"   {', '.join(f'{host}:{port}' for host, port in local.addresses)}")
        step(f"plan {model} for throughput on {platform}, kernel costs measured here")
        workload = load_workload(model, platform, "measured")
        remotes = connect_servers(workload.platform, local.addresses)
        try:
            hops = measure_driver_hops(remotes)
            for server, hop in hops.items():
                print(
                    f"   a hop through the driver, {server}: download {format_seconds(hop.download_latency_s)} + "
                    f"{hop.download_Bps / 1e6:.1f} MB/s, upload {format_seconds(hop.upload_latency_s)} + "
                    f"{hop.upload_Bps / 1e6:.1f} MB/s"
                )
            # cross-server copies as this runtime pays them: the workload on a platform whose links are the hops
            workload = over_driver_hops(workload, hops)
            problem = Problem(workload.graph, workload.platform, workload.costs, objective="throughput")
            plan = get_solver("symmetric", time_limit_s=time_limit_s).solve(problem)
            sim = simulate(problem, plan)
            predicted, io = predicted_over_rpc(problem, plan, sim, hops)
            per_device = {d: sum(1 for v in plan.assignment.values() if v == d) for d in problem.platform.device_names}
            print(
                f"   predicted period {format_seconds(predicted)} (the servers' work {format_seconds(sim.value_s)}, "
                f"the driver's model I/O included); kernels per device: "
                + ", ".join(f"{d} {n}" for d, n in per_device.items())
            )
            step("build each server's part, upload it, run a stream across the servers")
            loaded = workload.loaded
            measured, _ = run_plan_rpc(
                loaded.built,
                loaded.extraction,
                problem.platform,
                plan,
                predicted,
                remotes,
                predicted_busy_s=sim.device_busy_s,
                predicted_io_s=io,
                driver_hops=hops,
                progress=lambda line: print(f"   {line}"),
            )
        finally:
            for remote in remotes.values():
                remote.close()
    print("\n".join(f"   {line}" for line in format_rpc_run(measured, rtol).splitlines()))
    return measured.max_rel_diff <= rtol


def main() -> int:
    args = parse_args()
    step(f"plan llama:layers={args.layers} on {args.platform} (roofline costs)")
    plan_across_servers(f"llama:layers={args.layers}", args.platform, args.time_limit)
    step(f"start {args.servers} TVM RPC servers on this machine")
    ok = run_across_servers(RUN_MODEL, args.servers, args.time_limit, args.rtol)
    step("result")
    print("   the run across servers reproduces the single-device reference" if ok else "   OUTPUTS DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
