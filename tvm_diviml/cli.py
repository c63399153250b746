"""The ``diviml`` command line. Bad input: one line naming what is wrong, exit status 2."""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import importlib.util
import json
import logging
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple, TextIO

import numpy as np

from . import __version__
from .app.dataparallel import batch_split_workloads, build_split, format_batch_splits, solve_batch_splits
from .app.files import Read, Written, check_files
from .app.inputs import read_input_file
from .app.reference import FRAMEWORKS, build_outputs, check_against, check_reference, run_framework
from .app.report import format_row, solve_and_report
from .app.workload import GENERATORS, is_model_file, load_graph, load_workload, platform_files
from .detect import LOCAL
from .errors import (
    DivimlInputError,
    ServerFailure,
    answer_interrupts,
    forget_interrupt,
    interrupted,
    raise_if_interrupted,
)
from .plan import OBJECTIVES, Plan
from .presets import PRESETS, get_platform, preset_names
from .profiling.cache import FILE_NAME, default_cache_dir
from .servers import server_devices
from .simulator import Simulation
from .solvers import SOLVERS, Problem
from .stderr_filter import unactionable_warnings_filtered
from .toolkit.incumbents import Event
from .units import format_seconds
from .writes import write_text

log = logging.getLogger("tvm_diviml")


def _json_safe(value: Any) -> Any:
    """JSON has no infinity: write it as null. NumPy scalars become Python ones."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, tuple) else "->".join(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# Where ``--json -`` writes: the command's stdout, while its human report goes to stderr.
_JSON_STDOUT: contextvars.ContextVar[TextIO | None] = contextvars.ContextVar("json_stdout", default=None)


@contextlib.contextmanager
def _report_on_stderr_beside_json(args: argparse.Namespace) -> Iterator[None]:
    """With ``--json -``, stdout carries the JSON alone: whatever else the command prints goes to stderr."""
    if getattr(args, "json", None) != "-":
        yield
        return
    token = _JSON_STDOUT.set(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_STDOUT.reset(token)


def write_json(data: Any, destination: str, what: str = "--json") -> None:
    """``data`` as JSON on stdout (``-``) or in a file, written whole or not at all."""
    text = json.dumps(_json_safe(data), indent=1)
    if destination == "-":
        print(text, file=_JSON_STDOUT.get() or sys.stdout)
    else:
        write_text(destination, text + "\n", what)


def command_files(args: argparse.Namespace) -> tuple[list[Read], list[Written]]:
    """What the command will read (MODEL, platform, cost and tuning files, the profile cache) and write
    (every output option, with the files an export writes beside its library)."""
    reads = [Read(args.model, "MODEL")] if is_model_file(getattr(args, "model", "")) else []
    reads += [Read(path, "--platform") for path in platform_files(getattr(args, "platform", None))]
    cost = getattr(args, "cost", None)
    if cost not in (None, "roofline", "measured"):
        reads.append(Read(cost, "--cost"))
    if getattr(args, "tuning_db", None):
        reads.append(Read(args.tuning_db, "--tuning-db", folder=True))
    if getattr(args, "input", None):
        reads.append(Read(args.input, "--input"))
    if args.command in ("run", "profile") or cost == "measured":
        reads.append(Read(os.path.join(default_cache_dir(), FILE_NAME), "the profile cache"))
    writes = [
        Written(getattr(args, flag), f"--{flag}")
        for flag in ("json", "gantt", "markdown")
        if getattr(args, flag, None) and getattr(args, flag) != "-" and args.command != "platforms"  # NAME there
    ]
    if args.command == "platforms" and args.output:
        writes.append(Written(args.output, "--output"))
        reads += [Read(path, "--json") for path in platform_files(args.json)]
    export = getattr(args, "export", None)
    if export and args.command == "run":
        from .app.export import export_writes

        writes += export_writes(export, server_devices(get_platform(args.platform)) if args.rpc else None)
    elif export:
        writes.append(Written(export, "--export"))
    return reads, writes


# ---------------------------------------------------------------------- commands
def cmd_platforms(args: argparse.Namespace) -> int:
    if args.json or args.detect:
        platform = get_platform(args.json or LOCAL)
        write_json(platform.to_json(), args.output or "-", "--output")
        if args.output:
            devices = ", ".join(f"{d.name} ({d.device})" for d in platform.devices)
            print(f"wrote {args.output}: {platform.description}\ndevices: {devices}")
            for device, notes in platform.estimates.items():
                print("\n".join(f"{device} {figure}: estimated ({how})" for figure, how in notes.items()))
            print(f"edit it (docs/platform.md), then: diviml plan MODEL --platform {args.output}")
        return 0
    if args.output:
        raise DivimlInputError("--output writes what --detect or --json NAME describes", hint="add one of them")
    for name, make in PRESETS.items():
        platform = make()
        devices = ", ".join(f"{d.name} ({d.device})" for d in platform.devices)
        print(f"{name:<12} {platform.description}\n{'':<12} devices: {devices}")
    print(f"{'cpuN':<12} this machine's CPU as N single-thread devices (N up to its cores, e.g. cpu4)")
    print(f"{'local':<12} this machine as detected: its CPU as one device (local:cores=K: K devices) and its GPUs")
    print(f"{'gpuK':<12} K identical H100-class GPUs on NVLink-class links (e.g. gpu4, gpu16)")
    print(f"{'servers:...':<12} servers of preset kinds on a network (e.g. servers:2xpaper-node+2xh200-node)")
    print(
        "\nOr a platform .json file of your own machine:\n"
        "  diviml platforms --detect --output my_machine.json   this machine (CPU, CUDA/ROCm GPUs), to edit and keep\n"
        "  diviml platforms --json NAME                          a preset in the file format, to start from\n"
        "  the format, field by field, with a CPU + A100 + L4 example: docs/platform.md"
    )
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .zoo import ZOO, zoo_names

    for name in zoo_names():
        entry = ZOO[name]
        options = ",".join(f"{k}={v}" for k, v in entry.defaults().items())
        print(f"{name:<14} {entry.description}\n{'':<14} options: {options}")
    for name, (_, description) in GENERATORS.items():
        print(f"{name:<14} synthetic: {description}")
    print(
        "\nAlso: an .onnx file or a .pt2 program saved with torch.export.save (--shape NAME=VALUE binds "
        "symbolic dimensions), an OpGraph .json, or an msr-fiddle .json."
    )
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    found = load_graph(args.model, shapes=args.shape, granularity=args.granularity)
    graph = found.graph
    if args.json:
        write_json(graph.to_json(), args.json)
        if args.json == "-":
            return 0
    width, exact = graph.widest_antichain()
    flops = sum(k.flops for k in graph.kernels.values())
    primfuncs = {k.attrs.get("primfunc_hash") for k in graph.kernels.values()} - {None}
    print(f"model {args.model}" + (f" ({args.granularity} granularity)" if found.loaded is not None else ""))
    print(
        f"kernels: {len(graph)}   edges: {len(graph.edges)}   inputs: {len(graph.inputs)}   "
        f"outputs: {len(graph.outputs)}"
    )
    if primfuncs:
        print(f"distinct PrimFuncs: {len(primfuncs)}")
    print(
        f"GFLOPs: {flops / 1e9:.3f}   weights: {sum(graph.weights.values()) / 1e6:.2f} MB   "
        f"widest antichain: {width}{'' if exact else ' (at least; level width)'}"
    )
    if found.loaded is not None:
        print(f"imported from {found.loaded.built.origin}")
        print(f"extracted in {found.loaded.extract_s:.2f} s")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    if args.batch_split > 1:
        plan, sim, row, problem = solve_batch_splits(
            _batch_split_workloads(args),
            args.solver,
            args.objective,
            stages=args.stages,
            time_limit_s=args.time_limit,
            seed=args.seed,
        )
    else:
        plan, sim, row, problem = _solve(args, _workload(args), interrupt_keeps_best=True)
    if args.json != "-":
        print(format_row(row, problem.platform.device_names))
        if "batch_splits_tried" in row:
            print(format_batch_splits(row))
    if args.json:
        write_json(row, args.json)
        if args.json != "-":
            print(f"\nplan written to {args.json}")
    if args.gantt:
        from .gantt import draw_schedule

        draw_schedule(problem.graph, problem.platform, problem.costs, plan, sim, args.gantt)
        print(f"schedule drawn to {args.gantt}", file=sys.stderr if args.json == "-" else sys.stdout)
    return 0 if row["feasible"] else 1


class Solved(NamedTuple):
    """A placement as ``plan`` and ``run`` report it."""

    plan: Plan
    sim: Simulation
    row: dict
    problem: Problem


def _solve(args: argparse.Namespace, workload, interrupt_keeps_best: bool = False) -> Solved:
    """Place ``workload`` as the plan/run options say. ``interrupt_keeps_best``: Ctrl-C during the
    solve reports the best plan so far (``plan``: the plan is the result) instead of stopping the
    command (``run``: a user who interrupts it wants nothing built). Throughput may replicate the
    model or its stages (``run`` builds a replicated plan as one executable per route)."""
    objective = args.objective or workload.default_objective
    problem = Problem(workload.graph, workload.platform, workload.costs, objective=objective, stages=args.stages)
    if objective == "pipeline" and args.stages is None:
        problem.stages = len(workload.platform.devices)
    plan, sim, row = solve_and_report(
        problem,
        args.solver,
        workload.model,
        workload.cost_source,
        time_limit_s=args.time_limit,
        seed=args.seed,
        bound_time_limit_s=args.bound_time_limit,
        listener=ProgressLines(),
        interrupt_keeps_best=interrupt_keeps_best,
        replicas=True,
    )
    return Solved(plan, sim, row, problem)


class ProgressLines:
    """The solve's progress on stderr: the best plan, bound and gap as they improve, from the first
    second on and at most a line a second (a quick solve prints none; Ctrl-C keeps the best plan)."""

    EVERY_S = 1.0

    def __init__(self) -> None:
        self.shown_at = 0.0

    def __call__(self, event: Event) -> None:
        if event.kind == "phase":  # a few per solve, each the start of a step that may be long
            print(f"[{event.at_s:7.1f} s] {event.by} ...", file=sys.stderr, flush=True)
            return
        if event.at_s - self.shown_at < self.EVERY_S:
            return
        self.shown_at = event.at_s
        gap = f"   gap {100 * event.gap:.1f}%" if event.gap is not None else ""
        bound = f"   bound {format_seconds(event.lower_bound_s)}" if event.lower_bound_s > 0 else ""
        best = format_seconds(event.value_s) if event.value_s is not None else "-"
        print(f"[{event.at_s:7.1f} s] best plan {best}{bound}{gap}   ({event.by})", file=sys.stderr, flush=True)


def _workload(args: argparse.Namespace, runs_here: bool = False):
    """The workload the plan/run options name."""
    return load_workload(args.model, args.platform, args.cost, **_load_options(args, runs_here))


def _batch_split_workloads(args: argparse.Namespace, runs_here: bool = False) -> dict:
    """The model unsplit and as each sub-batch split that ``--batch-split`` allows (R -> workload)."""
    return batch_split_workloads(
        args.model, args.platform, args.cost, args.batch_split, **_load_options(args, runs_here)
    )


def _load_options(args: argparse.Namespace, runs_here: bool) -> dict[str, Any]:
    """How the plan/run options load a model (``load_workload``'s keywords); ``run --input``'s file is
    read here, before the model, so that a missing or unreadable file is refused first."""
    given = getattr(args, "input", None)
    return dict(
        shapes=args.shape,
        granularity=args.granularity,
        tune=_budget(args),
        tuning_db=args.tuning_db,
        runs_here=runs_here,
        given_inputs=read_input_file(given) if given else None,
    )


def _runnable_workload(args: argparse.Namespace):
    """The workload of ``run``: a model that TVM builds (not an OpGraph or msr-fiddle file)."""
    workload = _workload(args, runs_here=True)
    if workload.loaded is None:
        raise DivimlInputError(
            "run needs a model that TVM builds",
            field="MODEL",
            hint="give a zoo name, an .onnx file or a .pt2 program (an OpGraph or msr-fiddle file has no kernels)",
        )
    return workload


def _tuning_database(args: argparse.Namespace, costs=None):
    """The MetaSchedule database the build applies: the one ``--tuning-db`` names, or the one that
    ``--tune``/``--tune-minutes`` just tuned into (``costs``' tuning); None without either."""
    if args.tuning_db:
        from .profiling.tuning import open_database

        return open_database(args.tuning_db)
    tuned = [result.database for result in getattr(costs, "tuning", {}).values()]
    return tuned[0] if tuned else None


def cmd_run(args: argparse.Namespace) -> int:
    """Plan, build and execute on this machine's devices; measured against predicted (and, with
    ``--reference``, the build's outputs against the user's framework first)."""
    if args.reference:
        check_reference(args.reference, args.model)
    if args.rpc:
        if args.reference:
            raise DivimlInputError(
                "the framework's check holds a build on this machine to it, not one across RPC servers",
                field="--reference",
                hint="drop --rpc to check the model against its framework here, or drop --reference",
            )
        if args.batch_split > 1:
            raise DivimlInputError(
                "--batch-split runs its copies on this machine's devices, not across RPC servers",
                field="--batch-split",
                hint="drop --batch-split or --rpc",
            )
        if args.candidates > 1:
            raise DivimlInputError(
                "--candidates times plans on this machine, not across RPC servers",
                field="--candidates",
                hint="drop --candidates or --rpc",
            )
        return _run_rpc(args)
    if args.batch_split > 1:
        return _run_batch_split(args)
    from .app.run import format_run, predicted_run, run_candidates, run_plan  # TVM: after the arguments' checks

    workload = _runnable_workload(args)
    loaded = workload.loaded
    framework = run_framework(args.reference, args.model, loaded.built.sample_inputs()) if args.reference else None
    plan, sim, row, problem = _solve(args, workload)
    print(format_row(row, problem.platform.device_names))
    _warn_of_fallback_hotspots(workload.costs)
    print()
    options = dict(
        repeats=args.repeats,
        stream_inputs=args.inputs,
        in_flight=args.in_flight,
        database=_tuning_database(args, workload.costs),
    )
    if not args.candidates:
        predicted, in_flight = predicted_run(problem, plan, args.in_flight)
        measured, built = run_plan(
            loaded.built, loaded.extraction, problem.platform, plan, predicted, **{**options, "in_flight": in_flight}
        )
        report = format_run(measured, args.rtol)
    else:
        from .profiling.candidates import format_selection

        selection, measured, built = run_candidates(
            loaded.built, loaded.extraction, problem, plan, args.candidates, rtol=args.rtol, **options
        )
        row["candidates"] = selection.to_json()
        row["kept_assignment"] = selection.winner.plan.assignment
        report = f"{format_selection(selection)}\n\nthe kept plan, run:\n{format_run(measured, args.rtol)}"
    if framework is None:
        return _report_run(args, row, measured, report, built, loaded.built)
    check = check_against(framework, build_outputs(built, loaded.built), args.input)
    row["reference"] = check.to_json(args.rtol)
    code = _report_run(args, row, measured, f"{check.describe(args.rtol)}\n{report}", built, loaded.built)
    return code or (0 if check.passed(args.rtol) else 1)


def _run_batch_split(args: argparse.Namespace) -> int:
    """``run --batch-split R``: the best split planned (``plan --batch-split``), its copies built on
    their devices and run side by side, the joined outputs checked against the batch's single-device
    build; timed one batch at a time beside the single-device configurations."""
    from .app.run import format_run, predicted_run, run_plan  # TVM: after the arguments' checks
    from .profiling.timing import build_runnable

    workloads = _batch_split_workloads(args, runs_here=True)
    plan, sim, row, problem = solve_batch_splits(
        workloads, args.solver, args.objective, stages=args.stages, time_limit_s=args.time_limit, seed=args.seed
    )
    print(format_row(row, problem.platform.device_names))
    print(format_batch_splits(row))
    print()
    whole = workloads[1].loaded
    database = _tuning_database(args, workloads[1].costs)
    built = None
    if plan.batch_split > 1:
        began = time.perf_counter()
        split = build_split(
            plan,
            workloads[1],
            workloads[plan.batch_split],
            lambda model, extraction, copy: build_runnable(
                model, extraction, problem.platform, copy, database=database
            )[0],
        )
        built = (split, time.perf_counter() - began)
    predicted, in_flight = predicted_run(problem, plan, args.in_flight)
    measured, built = run_plan(
        whole.built,
        whole.extraction,
        problem.platform,
        plan,
        predicted,
        repeats=args.repeats,
        stream_inputs=args.inputs,
        in_flight=in_flight,
        database=database,
        built=built,
    )
    sub_weights = workloads[plan.batch_split].loaded.built.params if plan.batch_split > 1 else None
    return _report_run(args, row, measured, format_run(measured, args.rtol), built, whole.built, sub_weights)


def _report_run(args: argparse.Namespace, row: dict, measured, report: str, built, model, weights=None) -> int:
    """Print a run's report; export the build (``app.export``: ``model``'s signature, and ``weights``
    where the runner takes other than the model's) and write the row where asked. Exit status 1 when
    the outputs differ from the reference beyond ``--rtol``."""
    print(report)
    row["run"] = measured.to_json()
    if args.export:
        from .app.export import export_run

        print(export_run(args.export, built, model, measured, weights))
    if args.json:
        write_json(row, args.json)
    return 0 if measured.outputs.equal(args.rtol) else 1


def _run_rpc(args: argparse.Namespace) -> int:
    """``run --rpc``: one RPC server per server of the platform (given, or started on the loopback); the
    plan prices cross-server copies as two hops through the driver, at figures measured over the sessions.
    For throughput, ``auto`` keeps the model (or its stages) replicated where that is predicted faster:
    each replica is built for its servers and takes its share of the stream."""
    from .app.rpc_run import format_rpc_run, plan_line, predicted_over_rpc, run_plan_rpc
    from .profiling.rpc_hops import driver_hop_platform, measure_driver_hops
    from .runtime.rpc_servers import LOOPBACK, connect_servers, parse_addresses, start_local_servers

    count = len(server_devices(get_platform(args.platform)))
    with contextlib.ExitStack() as stack:
        if args.rpc == "local":
            print(f"starting {count} RPC server(s) on {LOOPBACK} ...")
            addresses = stack.enter_context(start_local_servers(count)).addresses
        else:
            addresses = parse_addresses(args.rpc, count)
        workload = _runnable_workload(args)
        remotes = connect_servers(workload.platform, addresses, timeout_s=args.rpc_timeout)
        stack.callback(lambda: [remote.close() for remote in remotes.values()])
        hops = measure_driver_hops(remotes, timeout_s=args.rpc_timeout)
        # the cost models price a copy by their platform's links (measured ones only inside a server)
        workload.platform = workload.costs.platform = driver_hop_platform(workload.platform, hops)
        plan, sim, row, problem = _solve(args, workload)
        print(format_row(row, problem.platform.device_names))
        print(plan_line(plan, problem.platform))
        print()
        loaded = workload.loaded
        predicted, io = predicted_over_rpc(problem, plan, sim, hops)
        measured, built = run_plan_rpc(
            loaded.built,
            loaded.extraction,
            problem.platform,
            plan,
            predicted,
            remotes,
            predicted_busy_s=sim.device_busy_s,
            predicted_io_s=io,
            repeats=args.repeats,
            stream_inputs=args.inputs,
            in_flight=args.in_flight,
            timeout_s=args.rpc_timeout,
            database=_tuning_database(args, workload.costs),
            driver_hops=hops,
        )
    return _report_run(args, row, measured, format_rpc_run(measured, args.rtol), built, loaded.built)


def cmd_demo(args: argparse.Namespace) -> int:
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
            from .gantt import draw_schedule

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
    from .app.run import format_run, run_candidates
    from .profiling.candidates import format_selection

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
    from .bench.frameworks import tvm_default_seconds

    default_s = tvm_default_seconds(built, built.sample_inputs())
    print(
        f"\nthe same model through tvm.compile's default CPU pipeline (TVM's own, on both cores): "
        f"{format_seconds(default_s)} per inference; the kept plan is {default_s / kept_s:.1f}x faster"
    )
    if importlib.util.find_spec("torchvision") is None:
        print("(with torch installed, `diviml bench --suite frameworks` times torch and ONNX Runtime beside it)")
        return
    from .bench.frameworks import CATALOGUE, framework_row

    print("\nresnet18 at 64x64 (torchvision), seconds per inference on this CPU, one run:")
    with tempfile.TemporaryDirectory(prefix="diviml-demo-") as scratch:
        row = framework_row("resnet18_64", CATALOGUE["resnet18_64"], scratch, 0.0)
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


def cmd_profile(args: argparse.Namespace) -> int:
    workload = load_workload(
        args.model,
        args.platform or "cpu2",
        "measured",
        shapes=args.shape,
        granularity=args.granularity,
        tune=_budget(args),
        tuning_db=args.tuning_db,
    )
    costs = workload.costs
    rows = []
    for kernel in workload.graph.topo_order:
        for device in workload.platform.device_names:
            seconds = costs.compute_s(kernel, device)
            spread = costs.spread_s(kernel, device)
            rows.append(
                {
                    "kernel": kernel,
                    "device": device,
                    "median_us": seconds * 1e6,
                    "spread_us": None if spread is None else spread * 1e6,
                    "source": costs.source(kernel, device),
                    "schedule": costs.schedule_of(kernel, device),
                }
            )
    print(f"{'kernel':<44}{'device':<12}{'median us':>14}{'spread us':>12}  {'source':<10}schedule")
    for row in rows:
        spread = "-" if row["spread_us"] is None else f"{row['spread_us']:.1f}"
        print(
            f"{row['kernel'][:43]:<44}{row['device']:<12}{row['median_us']:>14.1f}{spread:>12}  "
            f"{row['source']:<10}{row['schedule']}"
        )
    _print_roofline_fits(costs)
    for (src, dst), link in costs.links.items():
        print(
            f"link {src} -> {dst}: {format_seconds(link.latency_s)} + bytes / {link.bandwidth_Bps / 1e9:.2f} GB/s "
            "(measured)"
        )
    overheads = costs.executor_overheads
    if len(costs.platform.devices) - len(costs.absent) > 1:
        print(
            f"the concurrent executor adds {format_seconds(overheads.run_s)} per inference, "
            f"{format_seconds(overheads.segment_s)} per segment call and {format_seconds(overheads.handoff_s)} "
            "per tensor handed to another device's worker (in the links' latency above)"
        )
        print(
            f"a CPU kernel takes {overheads.corun_factor:.2f}x as long while another CPU device's worker computes "
            "(each worker pinned to cores of its own)"
        )
    for device, seconds in costs.in_context_s.items():
        scale = costs.in_context_scale.get(device, 1.0)
        share = math.floor(scale * 100) / 100  # 0.996 is not "1.00 of their time"
        print(
            f"inside the model, {device} adds {format_seconds(seconds)} per kernel to its time alone "
            "(from the whole model's run)"
            if scale == 1.0
            else f"inside the model, {device}'s kernels take {share:.2f} of their time alone (the whole model's "
            "run took less than its kernels timed alone: they were timed while the machine was busier)"
        )
    if costs.in_context_s:
        print(
            f"a timing of the whole model strays by {100 * costs.prediction_error:.1f}% (half its interquartile "
            "range): --solver auto splits the model only for a predicted gain beyond that"
        )
    print(f"\n{costs.measured_now} kernels timed now, the rest from the cache ({costs.cache.path})")
    if costs.absent:
        print(f"estimated by the roofline (not present here): {', '.join(costs.absent)}")
    _warn_of_fallback_hotspots(costs)
    if args.json:
        write_json(rows, args.json)
    if args.export:
        costs.to_table().save(args.export)
        print(f"all costs written to {args.export}: plan anywhere with --cost {args.export}")
    return 0


def _warn_of_fallback_hotspots(costs) -> None:
    """A warning for each kernel that no class rule scheduled and that takes a large share of the
    model's measured time: otherwise only a profile's last column shows it."""
    from .profiling.fallback_time import fallback_hotspots

    for hotspot in fallback_hotspots(costs):
        print(f"warning: {hotspot.message()}", file=sys.stderr)


def _print_roofline_fits(costs) -> None:
    """How far to trust the roofline: its figures fitted to each measured device, and the error."""
    for device in costs.times:
        try:
            fit = costs.roofline_fit(device)
        except ValueError as error:
            print(f"roofline fit for {device}: not possible ({error})")
            continue
        print(
            f"roofline fit for {device}: {fit.peak_flops / 1e9:.2f} GFLOP/s, {fit.bandwidth_Bps / 1e9:.2f} GB/s, "
            f"{fit.overhead_s * 1e6:.1f} us per kernel; error per kernel: median {100 * fit.median_rel_error:.0f}%, "
            f"90th percentile {100 * fit.p90_rel_error:.0f}%"
        )


def cmd_cache(args: argparse.Namespace) -> int:
    """``info``: the profile cache's rows and the tuning databases; ``clear``: empty both (a damaged tuning
    database is removed with the rest)."""
    import shutil

    from .profiling.cache import ProfileCache, tuning_cache_dir

    tuning = tuning_cache_dir()
    databases = sorted(os.listdir(tuning)) if os.path.isdir(tuning) else []
    with ProfileCache() as cache:
        if args.action == "clear":
            print(f"removed {cache.clear()} entries from {cache.path}")
            try:
                if databases:
                    shutil.rmtree(tuning)
            except OSError as error:
                raise DivimlInputError(f"cannot remove: {error}", source=tuning, hint="remove it by hand") from None
            print(f"removed {len(databases)} tuning database(s) from {tuning}")
        else:
            for key, value in cache.stats().items():
                print(f"{key}: {value}")
            print(f"tuning databases: {len(databases)} in {tuning}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import SUITES, offers_by_flag, row_line, write_markdown

    suite = SUITES[args.suite]
    offers = offers_by_flag(SUITES.values())
    given = {flag: getattr(args, _flag_dest(flag)) for flag in offers}
    given = {flag: value for flag, value in given.items() if value is not None}
    taken = suite.flag_options()
    refused = [flag for flag in given if flag not in taken]
    if refused:
        takers = [taker.name for taker, _ in offers[refused[0]]]
        raise DivimlInputError(
            f"suite '{suite.name}' takes no {' or '.join(refused)}",
            field="--suite",
            hint=f"drop the option; {refused[0]} applies to suite {' or '.join(takers)}",
        )
    rows = []
    for row in suite.run(**{taken[flag].name: value for flag, value in given.items()}):
        rows.append(row)
        print(row_line(row), flush=True)
    if args.json:
        write_json(rows, args.json)
    if args.markdown:
        write_markdown(rows, args.markdown)
    return 0


# ---------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diviml",
        description="Place a model's kernels across heterogeneous "
        "devices, with lower bounds that say how close to optimal the placement is.",
    )
    parser.add_argument("--version", action="version", version=f"tvm-diviml {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="the main job on built-in defaults")
    demo.add_argument(
        "--gantt",
        metavar="PATH",
        default="demo_schedule.png",
        type=_png_path,
        help="where to draw the latency schedule (default demo_schedule.png; '' for none)",
    )
    demo.set_defaults(run=cmd_demo)

    platforms = commands.add_parser("platforms", help="list the platform presets, or describe this machine")
    described = platforms.add_mutually_exclusive_group()
    described.add_argument("--json", metavar="NAME", help="print one preset (or platform file) as JSON")
    described.add_argument(
        "--detect",
        action="store_true",
        help="describe this machine (CPU, CUDA/ROCm GPUs) as a platform file: the same as --json local",
    )
    platforms.add_argument("--output", metavar="FILE", help="write the JSON to FILE instead of stdout")
    platforms.set_defaults(run=cmd_platforms)

    models = commands.add_parser("models", help="list the model zoo and the synthetic generators")
    models.set_defaults(run=cmd_models)

    graph = commands.add_parser("graph", help="extract a model's kernel graph: a summary, or the OpGraph JSON")
    _model_arguments(graph)
    graph.add_argument("--json", metavar="PATH", help="write the OpGraph JSON to PATH, or - for stdout")
    graph.set_defaults(run=cmd_graph)

    _plan_parser(commands)
    _run_parser(commands)

    profile = commands.add_parser("profile", help="time every kernel on the platform's present devices")
    _model_arguments(profile)
    profile.add_argument(
        "--platform", help="a preset, local (this machine, detected) or platform .json (default cpu2, this machine)"
    )
    _tuning_arguments(profile, "apply an existing MetaSchedule database (its work_dir)")
    profile.add_argument("--json", metavar="PATH", help="write the per-kernel rows as JSON")
    profile.add_argument(
        "--export", metavar="PATH", help="write all costs (kernels and links) as a cost table that --cost PATH reads"
    )
    profile.set_defaults(run=cmd_profile)

    cache = commands.add_parser("cache", help="the persistent profile cache: info, or clear it")
    cache.add_argument("action", choices=["info", "clear"])
    cache.set_defaults(run=cmd_cache)

    _bench_parser(commands)
    return parser


def _batch_split_argument(parser) -> None:
    parser.add_argument(
        "--batch-split",
        type=_positive_int,
        default=1,
        metavar="R",
        help="data parallelism (zoo models, MODEL:batch=B): also try R and every smaller divisor "
        "of B as sub-batch copies placed together; the best plan wins, the bound is the minimum "
        "(run: the copies are built, run side by side and their outputs joined)",
    )


def _plan_parser(commands) -> None:
    plan = commands.add_parser("plan", help="place a model's kernels and report value, bound and gap")
    _model_arguments(plan)
    _problem_arguments(
        plan,
        platform=None,
        platform_help=f"a preset ({', '.join(preset_names())}) or a platform "
        ".json (default paper-node; msr-fiddle files bring their own)",
        objective=None,
        objective_help="default latency; throughput (their max-load problem) for msr-fiddle files",
        time_limit=60.0,
        bound_time_limit=10.0,
    )
    _batch_split_argument(plan)
    plan.add_argument(
        "--cost",
        help="roofline (default), measured (time the kernels with TVM on the devices "
        "present, roofline for the rest), or a cost table .json (msr-fiddle files bring their own)",
    )
    _tuning_arguments(plan, "apply an existing MetaSchedule database (its work_dir)")
    plan.add_argument("--json", metavar="PATH", help="write the plan row as JSON to PATH, or - for stdout")
    plan.add_argument(
        "--gantt",
        metavar="PATH",
        type=_png_path,
        help="draw the plan's schedule (or its loads) as a PNG to PATH (.png added where it names no format)",
    )
    plan.set_defaults(run=cmd_plan)


def _run_parser(commands) -> None:
    run = commands.add_parser("run", help="plan, build and execute on this machine's devices; measured vs predicted")
    _model_arguments(run)
    _problem_arguments(
        run,
        platform="cpu2",
        platform_help="a preset, local (this machine, detected) or platform .json whose devices this machine "
        "has (default cpu2: this CPU as two single-thread devices)",
        objective="latency",
        objective_help="default latency",
        time_limit=30.0,
        bound_time_limit=0.0,
    )
    run.add_argument(
        "--cost", default="measured", help="measured (default: time the kernels here), roofline, or a cost table .json"
    )
    _batch_split_argument(run)
    _tuning_arguments(run, "build and price with an existing MetaSchedule database (its work_dir)")
    run.add_argument(
        "--repeats",
        type=_positive_int,
        default=10,
        help="timed inferences (latency; default 10, more until they took 0.25 s)",
    )
    run.add_argument(
        "--inputs",
        type=_at_least_two,
        default=16,
        help="inputs streamed (throughput and pipeline; default 16; the period is timed from "
        "the first output to the last)",
    )
    run.add_argument(
        "--in-flight",
        type=_positive_int,
        metavar="N",
        help="inputs in flight when streaming (default: as many as the stream's price asks, reported)",
    )
    run.add_argument(
        "--candidates",
        type=_non_negative_int,
        default=1,
        metavar="N",
        help="build and time the N best distinct plans by prediction, the best single-device plan "
        "and every single-device configuration (the whole CPU on all its cores too: intra-operator "
        "against model parallelism), side by side, and keep the fastest measured (default 1: the "
        "plan and the configurations; 0: run the plan as planned)",
    )
    run.add_argument(
        "--rtol",
        type=_tolerance,
        help="largest difference from the single-device build (and the --reference framework), relative to "
        "each output's largest magnitude, that counts as equal (default: by the output's dtype, 1e-4 for float32 "
        "and float64, 10 ulps for coarser floats: float16 9.8e-3, bfloat16 7.8e-2; integers exact); NaN and "
        "infinities must fall where the reference has them; exit status 1 beyond it",
    )
    run.add_argument(
        "--input",
        metavar="FILE",
        help="run (and check) on these inputs instead of random ones: a .npy for a model of one input, or an "
        ".npz of arrays by input name (numpy.savez); shapes and dtypes must be the model's",
    )
    run.add_argument(
        "--reference",
        choices=sorted(FRAMEWORKS),
        help="also run MODEL in its own framework on the same inputs (torch for a .pt2 program, onnxruntime for "
        "an .onnx file) and hold the build's outputs to it, output by output, at --rtol; exit status 1 beyond it",
    )
    run.add_argument(
        "--rpc",
        metavar="HOST:PORT,...",
        help="run over TVM RPC: one server address per server of "
        "the platform (e.g. --platform servers:2xcpu1), in order, or 'local' to start them on the "
        "loopback; a server is `python -m tvm_diviml.runtime.rpc_servers --host H --port P`",
    )
    run.add_argument(
        "--rpc-timeout",
        type=_positive_float,
        default=60.0,
        metavar="S",
        help="with --rpc: seconds without progress before a server counts as hung (default 60)",
    )
    run.add_argument(
        "--export",
        metavar="DIR",
        help="also export the kept build as a folder that tvm_diviml.load(DIR) runs anywhere with these "
        "devices: the library (one per replica or copy), its placement, the weights, the inputs' and "
        "outputs' signature and manifest.json (see docs/deploy.md); with --rpc, one library per server "
        "and servers.json besides; a PATH ending in .so writes the library and PATH.placement.json alone",
    )
    run.add_argument("--json", metavar="PATH", help="write the plan row with its 'run' measurements as JSON")
    run.set_defaults(run=cmd_run)


def _bench_parser(commands) -> None:
    """The ``bench`` flags: the output files, then every flag a suite declares (see ``tvm_diviml.bench``),
    unset by default so that each suite's own default applies."""
    from .bench import SUITES, offers_by_flag

    listing = "\n".join(f"  {name:<11} {suite.description}" for name, suite in SUITES.items())
    bench = commands.add_parser(
        "bench",
        help="run a benchmark suite and print (or write) its rows",
        epilog=f"suites:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "--suite",
        choices=sorted(SUITES),
        default="simulator",
        help="the suite to run (default simulator; see the list below)",
    )
    bench.add_argument("--json", metavar="PATH", help="write the rows as a JSON list")
    bench.add_argument("--markdown", metavar="PATH", help="write the rows as a Markdown table")
    for flag, offers in offers_by_flag(SUITES.values()).items():
        option = offers[0][1]
        takers = ", ".join(suite.name for suite, _ in offers)
        if option.type is bool:
            bench.add_argument(
                flag, dest=_flag_dest(flag), action="store_true", default=None, help=f"{option.help} (suites {takers})"
            )
            continue
        defaults = ", ".join(f"{suite.name} {_shown(taken.default)}" for suite, taken in offers)
        bench.add_argument(
            flag,
            dest=_flag_dest(flag),
            type=_bench_flag_type(option.type),
            metavar=option.metavar,
            help=f"{option.help} (default per suite: {defaults})",
        )
    bench.set_defaults(run=cmd_bench)


def _shown(default) -> str:
    return f"{default:g}" if isinstance(default, int | float) else str(default or "none")


def _bench_flag_type(kind: type):
    """How a suite option's value is read from the command line: every number a suite takes there is
    positive (time limits, counts)."""
    return {float: _positive_float, int: _positive_int, str: str}[kind]


def _flag_dest(flag: str) -> str:
    """The ``args`` attribute argparse gives a flag: ``--time-limit`` -> ``time_limit``."""
    return flag.lstrip("-").replace("-", "_")


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="a zoo model with options (resnet18:resolution=64; see `diviml models`), an .onnx "
        "file, a .pt2 program (torch.export.save), an OpGraph .json, an msr-fiddle .json, or a generator "
        f"({', '.join(GENERATORS)}) with options",
    )
    parser.add_argument(
        "--shape",
        action="append",
        type=_shape_binding,
        metavar="NAME=VALUE",
        help="bind a symbolic dimension of an imported model (repeatable)",
    )
    parser.add_argument(
        "--granularity",
        choices=["fused", "operator"],
        default="fused",
        help="one node per fused kernel (default) or per operator",
    )


def _problem_arguments(
    parser: argparse.ArgumentParser,
    *,
    platform: str | None,
    platform_help: str,
    objective: str | None,
    objective_help: str,
    time_limit: float,
    bound_time_limit: float,
) -> None:
    """The flags ``plan`` and ``run`` share: where, what for, and how the placement is solved (their
    defaults differ: ``run`` plans for this machine and spends less time on solving)."""
    parser.add_argument("--platform", default=platform, help=platform_help)
    parser.add_argument("--objective", choices=OBJECTIVES, default=objective, help=objective_help)
    parser.add_argument("--stages", type=_positive_int, help="pipeline: the most stages (default: one per device)")
    parser.add_argument(
        "--solver",
        choices=["auto", *sorted(SOLVERS)],
        default="auto",
        help="default auto: symmetric on several servers (latency, throughput), else split for "
        "latency, milp for throughput, downsets for pipelines and msr-fiddle files",
    )
    parser.add_argument(
        "--time-limit",
        type=_positive_float,
        default=time_limit,
        metavar="S",
        help="wall time of the whole solve in seconds: the plan, its baselines and bounds (default "
        f"{time_limit:g}; past a few thousand kernels the first plan and the cheap bounds may take longer)",
    )
    parser.add_argument(
        "--bound-time-limit",
        type=_non_negative_float,
        default=bound_time_limit,
        metavar="S",
        help="seconds of the time limit kept from the solver for the stronger lower bounds: pipelines' stage "
        "cover and MIPs, latency's series decomposition and overlap branching (up to a quarter of the limit); "
        "they also get whatever the solver leaves, and start only with a second left "
        f"(default {bound_time_limit:g}; 0: combinatorial bounds only)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")


def _tuning_arguments(parser: argparse.ArgumentParser, db_help: str) -> None:
    parser.add_argument(
        "--tune",
        type=_positive_int,
        default=0,
        metavar="TRIALS",
        help="tune each kernel with MetaSchedule (TRIALS per kernel) before measuring; the database "
        "persists under the cache directory and a repeated run resumes",
    )
    parser.add_argument(
        "--tune-minutes",
        type=lambda text: _seconds(text, allow_zero=False, unit=" of minutes"),
        default=0.0,
        metavar="M",
        help="tune the model's kernels with MetaSchedule for M minutes in all (with --tune: whichever "
        "ends first), starting from the default schedules, with a progress bar and the time left",
    )
    parser.add_argument("--tuning-db", metavar="DIR", help=db_help)


def _budget(args: argparse.Namespace):
    """The ``TuningBudget`` of ``--tune`` and ``--tune-minutes`` (None without either)."""
    if not (args.tune or args.tune_minutes):
        return None
    from .profiling.tuning import TuningBudget

    return TuningBudget(args.tune, args.tune_minutes)


def _shape_binding(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not NAME=VALUE with a positive integer VALUE")
    return name, int(value)


def _seconds(text: str, allow_zero: bool, unit: str = " of seconds") -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not (value >= 0 if allow_zero else value > 0) or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a {'non-negative' if allow_zero else 'positive'} number{unit}")
    return value


def _png_path(text: str) -> str:
    """A picture's path as it will be written: matplotlib adds .png to a name without a suffix."""
    if not text or os.path.splitext(text)[1] or os.path.isdir(text):
        return text  # a folder is refused by name when outputs are checked
    return text + ".png"


def _tolerance(text: str) -> float:
    return _seconds(text, allow_zero=True, unit="")


def _positive_float(text: str) -> float:
    return _seconds(text, allow_zero=False)


def _non_negative_float(text: str) -> float:
    return _seconds(text, allow_zero=True)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def _at_least_two(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError("must be at least 2: a stream's period is timed between its outputs")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "shape", None) is not None:
        args.shape = dict(args.shape)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    # SIGTERM and SIGHUP unwind like Ctrl-C, so that subprocesses (CP-SAT, RPC servers) are stopped on the way
    # out; each is remembered, so that one TVM turned into another error still ends the command (exit 130)
    forget_interrupt()
    answer_interrupts()
    try:
        check_files(*command_files(args))
        with _report_on_stderr_beside_json(args):
            code = args.run(args)
        raise_if_interrupted()
        return code
    except KeyboardInterrupt:
        return _interrupted_exit()
    except BrokenPipeError:  # output piped into head or a closed pager: not an error
        sys.stdout = open(os.devnull, "w")
        return 0
    except (DivimlInputError, ServerFailure) as error:  # with --rpc, the other servers were released on the way out
        if interrupted():
            return _interrupted_exit()
        if args.debug:
            raise
        print(f"diviml: error: {error}", file=sys.stderr)
        return 2 if isinstance(error, DivimlInputError) else 3
    except Exception:  # an interrupt that TVM turned into its own error on the way up (a pass's callback)
        if not interrupted():
            raise
        return _interrupted_exit()


def _interrupted_exit() -> int:
    print("diviml: interrupted", file=sys.stderr)
    return 130


def entry() -> None:
    """The ``diviml`` command. A thread left inside a TVM call (an upload cut short by Ctrl-C, a server
    that stopped answering) aborts the interpreter's shutdown when it returns ("terminate called without
    an active exception"). With any thread but this one left (alive or not: a join cut short by Ctrl-C
    marks a running thread stopped), everything is already cleaned up: exit at once. So too after an
    interrupt: one that arrived while an import ran C code (TVM's, torch's) leaves CPython's "unhandled
    KeyboardInterrupt" mark set, and its own exit then kills the process with SIGINT (exit -2, not 130)."""
    with unactionable_warnings_filtered(enabled="--debug" not in sys.argv[1:]):
        code = main()
    if code == 130 or threading.active_count() > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
