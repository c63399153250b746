"""Build a plan across several servers (one executable per server) and run it over TVM RPC.

A TVM device string names a device on its own server (``cpu:0`` on s0 and on s1), so one module
cannot hold two servers' devices: each server's segment functions are placed and compiled alone
(``apply_plan(..., server=...)``), and the driver keeps the global segment graph (``ServersBuild``).
``run_plan_rpc`` is ``run_plan`` for that case: outputs against the single-device reference, the
latency or the period measured against the simulator's, and per server the busy time measured
against predicted, with the tensors that crossed servers through the driver (two hops each).

A replicated plan (``Plan.replicas``: the whole model on each server, say) is built as one such
per-server build per route (``Plan.routes``, ``ReplicatedServersBuild``), each run by its own
``RpcRunner`` as a lane of a ``ReplicatedRunner``: each input of the stream goes to one route, by
the plan's shares, and the report says how many inputs each replica took. ``run_rpc`` is the whole job
of ``diviml run --rpc``, from a MODEL string to a ``RunReport``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.platform import Platform
from tvm_diviml.presets import get_platform
from tvm_diviml.problem import Problem
from tvm_diviml.profiling.rpc_hops import (
    DriverHop,
    driver_hop_platform,
    driver_io_s,
    measure_driver_hops,
    with_driver_io,
)
from tvm_diviml.runtime.measure import time_stream
from tvm_diviml.runtime.replicas import ReplicaError, ReplicatedRunner
from tvm_diviml.runtime.routed import build_routes
from tvm_diviml.runtime.rpc import RpcRunner, ServerError, ServersBuild
from tvm_diviml.runtime.rpc_servers import (
    LOOPBACK,
    RemoteServer,
    connect_servers,
    parse_addresses,
    start_local_servers,
)
from tvm_diviml.segments import split_segments
from tvm_diviml.servers import per_server, server_devices, server_of
from tvm_diviml.simulator import Simulation, route_plans, run_order
from tvm_diviml.tolerances import compare_outputs
from tvm_diviml.toolkit.incumbents import Event
from tvm_diviml.units import format_seconds
from tvm_diviml.zoo import BuiltModel
from tvm_diviml.zoo.reference import run_reference

from ..passes.apply_plan import apply_plan
from ..passes.build import build
from ..passes.extract import Extraction
from .job import AS_GIVEN, LoadOptions, SolveOptions, runnable_workload, solve_workload
from .reference import check_reference
from .run import (
    RUN_DEFAULTS,
    RUN_SOLVE,
    MeasuredRun,
    Planned,
    RunOptions,
    RunReport,
    headline,
    measured_report,
    tuning_database,
)
from .workload import Workload

log = logging.getLogger(__name__)


def build_per_server(mod, plan: Plan, platform: Platform, *, extraction: Extraction, database=None) -> ServersBuild:
    """One executable per server that the plan uses, and the global segment order."""
    used = set(plan.assignment.values())
    builds = {}
    for sid, devices in server_devices(platform).items():
        if used.intersection(devices):
            builds[sid] = build(apply_plan(mod, plan, platform, extraction=extraction, database=database, server=sid))
    order = split_segments(extraction.graph, plan.assignment, run_order(extraction.graph, plan))
    return ServersBuild(builds, server_of(platform), [seg.name for seg in order])


@dataclass
class ReplicatedServersBuild:
    """A replicated plan across servers: one ``ServersBuild`` per route (``Plan.routes``) and the share
    of the stream it takes; a route on one server is named by that server."""

    routes: list[ServersBuild]
    shares: list[float]
    names: list[str]

    @property
    def segments(self) -> list[dict]:
        """Every route's segments (an input runs one route's)."""
        return [seg for route in self.routes for seg in route.segments]

    def runner(self, remotes: Mapping[str, RemoteServer], params: list, *, timeout_s: float) -> ReplicatedRunner:
        """An ``RpcRunner`` per route (each uploads its build and the weights), as the lanes of one runner."""
        lanes: list[RpcRunner] = []
        try:
            for route in self.routes:
                lanes.append(RpcRunner(route, remotes, params, timeout_s=timeout_s))
        except BaseException:
            for lane in lanes:
                lane.close()
            raise
        return ReplicatedRunner(lanes, self.shares, self.names)

    def export(self, directory: str) -> str:
        """Each route's per-server export in ``directory/NAME``."""
        for name, route in zip(self.names, self.routes, strict=True):
            route.export(os.path.join(directory, name))
        return directory


def build_for_servers(
    mod, plan: Plan, platform: Platform, *, extraction: Extraction, database=None
) -> ServersBuild | ReplicatedServersBuild:
    """``build_per_server`` of ``plan``, or of each of its routes where it has replicas."""
    if not plan.replicas:
        return build_per_server(mod, plan, platform, extraction=extraction, database=database)
    routed = build_routes(
        plan, lambda route: build_per_server(mod, route, platform, extraction=extraction, database=database)
    )
    names = [
        servers[0] if len(servers) == 1 else f"route{index}-{'+'.join(servers)}"
        for index, servers in enumerate(list(route.builds) for route in routed.builds)
    ]
    return ReplicatedServersBuild(routed.builds, routed.shares, names)


def open_runner(
    built: ServersBuild | ReplicatedServersBuild,
    remotes: Mapping[str, RemoteServer],
    params: list,
    *,
    timeout_s: float,
) -> RpcRunner | ReplicatedRunner:
    """The runner of a build across servers: one ``RpcRunner``, or one per replica side by side."""
    if isinstance(built, ReplicatedServersBuild):
        return built.runner(remotes, params, timeout_s=timeout_s)
    return RpcRunner(built, remotes, params, timeout_s=timeout_s)


@contextlib.contextmanager
def replica_failures_as_server_errors():
    """A replica whose server failed stays a ``ServerError`` (the CLI's one line and exit status 3),
    its message naming the replica and the input as well as the server, its address and the segment."""
    try:
        yield
    except ReplicaError as error:
        cause = error.__cause__
        if not isinstance(cause, ServerError):
            raise
        raise type(cause)(
            str(error),
            server=cause.server,
            address=cause.address,
            segment=cause.segment,
            device=cause.device,
            input_index=error.input_index,
        ) from error


def plan_line(plan: Plan, platform: Platform) -> str:
    """Which plan ``run --rpc`` builds: on which servers, and with replicas, each route's share."""

    def servers(assignment: dict[str, str]) -> str:
        used = set(assignment.values())
        return "+".join(sid for sid, devices in server_devices(platform).items() if used.intersection(devices))

    if not plan.replicas:
        return f"run over RPC: {plan.solver}'s plan, without replicas, on {servers(plan.assignment)}"
    routes = plan.routes()
    taken = ", ".join(f"{servers(assignment)} {100 * share:.0f}%" for assignment, share in routes)
    return f"run over RPC: {plan.solver}'s plan with replicas, each input on one of {len(routes)} routes: {taken}"


def routed_driver_io_s(
    graph: OpGraph, plan: Plan, platform: Platform, hops: Mapping[str, DriverHop]
) -> dict[str, float]:
    """``driver_io_s`` per server, each route's weighted by its share of the stream (a plan without
    replicas: its own)."""
    io: Counter = Counter()
    for route, share in route_plans(plan):
        for server, seconds in driver_io_s(graph, route, platform, hops).items():
            io[server] += share * seconds
    return dict(io)


def predicted_over_rpc(
    problem: Problem, plan: Plan, sim: Simulation, hops: Mapping[str, DriverHop]
) -> tuple[float, dict[str, float]]:
    """What a run across servers is predicted to take per inference, the driver's model I/O included
    (``with_driver_io``), and that I/O per server: the figures ``run_plan_rpc`` is given."""
    io = routed_driver_io_s(problem.graph, plan, problem.platform, hops)
    return with_driver_io(plan.objective, sim.value_s, sim.device_busy_s, io, problem.platform), io


@dataclass(kw_only=True)
class RpcRunMeasurement(MeasuredRun):
    """What one run of a plan across servers measured, per server and through the driver."""

    server_busy_s: dict[str, float]  # per inference: seconds in segment calls, per server
    predicted_server_busy_s: dict[str, float]  # the simulator's device_busy_s summed per server
    hops: float  # per inference: driver hops (two per tensor that crosses)
    hop_s: float  # per inference: seconds in those hops (all workers together)
    hop_bytes: float
    crossings: dict[str, float]  # per inference: tensors that crossed, per "src->dst" server pair
    io_s: float  # per inference: model inputs uploaded, outputs downloaded
    predicted_io_s: dict[str, float]  # per server: that I/O as the hop figures price it (in predicted_s)
    addresses: dict[str, str]  # server -> HOST:PORT
    segments: int
    driver_hops: dict[str, dict] = field(default_factory=dict)  # per server: the hop figures planned with
    replicas: dict[str, dict] = field(default_factory=dict)  # per replica: its "share", the "inputs" it took

    def to_json(self) -> dict[str, Any]:
        return {
            **self.headline_json(),
            "server_busy_s": self.server_busy_s,
            "predicted_server_busy_s": self.predicted_server_busy_s,
            "device_busy_s": self.device_busy_s,
            "hops_per_inference": self.hops,
            "hop_s_per_inference": self.hop_s,
            "hop_bytes_per_inference": self.hop_bytes,
            "crossings_per_inference": self.crossings,
            "io_s_per_inference": self.io_s,
            "predicted_io_s": self.predicted_io_s,
            "addresses": self.addresses,
            "build_s": self.build_s,
            "segments": self.segments,
            "in_flight": self.in_flight,
            "samples_s": self.samples_s,
            "driver_hops": self.driver_hops,
            "replicas": self.replicas,
            "executor": "rpc",
        }


def run_plan_rpc(
    model: BuiltModel,
    extraction: Extraction,
    platform: Platform,
    plan: Plan,
    predicted_s: float,
    addresses: list[tuple[str, int]] | dict[str, RemoteServer],
    *,
    predicted_busy_s: dict[str, float] | None = None,
    predicted_io_s: dict[str, float] | None = None,
    repeats: int = 5,
    stream_inputs: int = 16,
    in_flight: int | None = None,
    timeout_s: float = 60.0,
    database=None,
    driver_hops: dict[str, DriverHop] | None = None,
    progress=print,
) -> tuple[RpcRunMeasurement, ServersBuild | ReplicatedServersBuild]:
    """Build ``plan`` per server (per route, where it has replicas), run it over RPC (``addresses`` in
    server order, or sessions from ``connect_servers``), check it against the reference and time it.
    ``predicted_s``: the plan's value with the driver's model I/O (``rpc_hops.with_driver_io``);
    ``predicted_busy_s``: the simulator's device_busy_s, for the per-server comparison;
    ``predicted_io_s`` (per server, priced by ``routed_driver_io_s``) and ``driver_hops``: recorded in
    the result."""
    began = time.perf_counter()
    built = build_for_servers(model.mod, plan, platform, extraction=extraction, database=database)
    build_s = time.perf_counter() - began
    progress(f"built for servers {', '.join(_servers(built))} in {build_s:.1f} s ({_describe(built)})")
    own_sessions = not isinstance(addresses, dict)
    remotes = connect_servers(platform, addresses, timeout_s=timeout_s) if own_sessions else addresses
    params = [w for _, w in model.params]
    inputs = model.sample_inputs()
    reference = run_reference(model, inputs)
    with contextlib.ExitStack() as cleanup:
        if own_sessions:
            cleanup.callback(lambda: [remote.close() for remote in remotes.values()])
        runner = cleanup.enter_context(open_runner(built, remotes, params, timeout_s=timeout_s))
        cleanup.enter_context(replica_failures_as_server_errors())
        outputs = compare_outputs(runner(inputs), reference)
        timed = _timed(runner, model, plan.objective, inputs, repeats, stream_inputs, in_flight)
        measured, samples, busy, stats, flight, runs = timed
        replicas = _replicas_taken(runner)
    return RpcRunMeasurement(
        objective=plan.objective,
        predicted_s=predicted_s,
        measured_s=measured,
        outputs=outputs,
        server_busy_s={sid: seconds / runs for sid, seconds in per_server(busy, platform).items()},
        predicted_server_busy_s=per_server(predicted_busy_s or {}, platform),
        device_busy_s={d: s / runs for d, s in busy.items()},
        hops=stats["hops"] / runs,
        hop_s=stats["hop_s"] / runs,
        hop_bytes=stats["hop_bytes"] / runs,
        crossings={pair: n / runs for pair, n in stats["by_pair"].items()},
        io_s=stats["io_s"] / runs,
        predicted_io_s=dict(predicted_io_s or {}),
        addresses={sid: r.address for sid, r in remotes.items()},
        build_s=build_s,
        segments=len(built.segments),
        in_flight=flight,
        samples_s=samples,
        driver_hops={sid: hop.to_json() for sid, hop in (driver_hops or {}).items()},
        replicas=replicas,
    ), built


def _timed(
    runner: RpcRunner | ReplicatedRunner,
    model: BuiltModel,
    objective: str,
    inputs: list[np.ndarray],
    repeats: int,
    stream_inputs: int,
    in_flight: int | None,
) -> tuple[float, list[float], dict[str, float], dict, int, int]:
    """Latency: the median of ``repeats`` inferences; else a stream's seconds per inference. With the
    samples, the busy time and the driver's figures, the inputs in flight and the runs those cover."""
    if objective == "latency":
        return *_latency(runner, inputs, repeats), 1, repeats + 1
    flight = in_flight or 2 * len(runner.busy_s)
    stream = model.sample_stream(stream_inputs, distinct=flight)
    measured = time_stream(runner, stream, flight)
    return measured, [], runner.busy_s, _stats(runner), flight, stream_inputs  # the last stream's


def _servers(built: ServersBuild | ReplicatedServersBuild) -> list[str]:
    routes = built.routes if isinstance(built, ReplicatedServersBuild) else [built]
    return list(dict.fromkeys(sid for route in routes for sid in route.builds))


def _describe(built: ServersBuild | ReplicatedServersBuild) -> str:
    """Segments and crossing tensors of a build; with replicas, per route and its share."""
    if isinstance(built, ServersBuild):
        return f"{len(built.segments)} segments, {len(crossing_tensors(built.segments))} tensors cross servers"
    routes = "; ".join(
        f"{name} {100 * share:.0f}%: {_describe(route)}"
        for name, share, route in zip(built.names, built.shares, built.routes, strict=True)
    )
    return f"{len(built.routes)} replicas, each input on one: {routes}"


def _replicas_taken(runner: RpcRunner | ReplicatedRunner) -> dict[str, dict]:
    """Per replica, its planned share of the stream and the inputs it took in the last one."""
    if not isinstance(runner, ReplicatedRunner):
        return {}
    return {
        name: {"share": share, "inputs": runner.sent[name]}
        for name, share in zip(runner.names, runner.shares, strict=True)
    }


def crossing_tensors(segments: list[dict]) -> set[tuple[str, str]]:
    """(tensor key, destination device) for each tensor that a segment on another server reads: the
    driver moves it once per device that reads it, as the simulator charges it."""
    writer = {key: seg["server"] for seg in segments for key in seg["writes"]}
    return {
        (key, seg["device"])
        for seg in segments
        for key in seg["reads"]
        if key in writer and writer[key] != seg["server"]
    }


def _stats(runner: RpcRunner | ReplicatedRunner) -> dict:
    """The driver's figures of the last run or stream, over every replica."""
    lanes = runner.lanes if isinstance(runner, ReplicatedRunner) else [runner]
    every = [lane.stats for lane in lanes]
    return {
        "hops": sum(stats.hops for stats in every),
        "hop_s": sum(stats.hop_s for stats in every),
        "hop_bytes": sum(stats.hop_bytes for stats in every),
        "by_pair": dict(sum((Counter(stats.by_pair) for stats in every), Counter())),
        "io_s": sum(stats.input_s + stats.output_s for stats in every),
    }


def _latency(runner: RpcRunner | ReplicatedRunner, inputs: list[np.ndarray], repeats: int):
    """Median latency, the samples, and busy time and hop figures summed over the runs (warm-up included)."""
    busy: Counter = Counter()
    totals = {"hops": 0, "hop_s": 0.0, "hop_bytes": 0.0, "by_pair": Counter(), "io_s": 0.0}
    samples = []
    for run in range(repeats + 1):
        began = time.perf_counter()
        runner(inputs)
        if run:
            samples.append(time.perf_counter() - began)
        busy.update(runner.busy_s)  # busy_s and stats cover the last run only
        for key, value in _stats(runner).items():
            totals[key] += Counter(value) if key == "by_pair" else value
    return statistics.median(samples), samples, dict(busy), {**totals, "by_pair": dict(totals["by_pair"])}


def format_rpc_run(run: RpcRunMeasurement, rtol: float | None = None) -> str:
    """The measured-against-predicted report of a run across servers (``rtol`` None: by the outputs' dtypes)."""
    lines = headline(run, rtol, "the single-device reference", how=" over RPC")
    if run.replicas:
        taken = ", ".join(
            f"{name} {100 * replica['share']:.0f}% / {replica['inputs']}" for name, replica in run.replicas.items()
        )
        lines.append(f"replicas, share of the stream planned / inputs taken in the last stream: {taken}")
    lines.append("per server, busy per inference (measured / predicted):")
    for sid in run.addresses:
        measured, predicted = run.server_busy_s.get(sid, 0.0), run.predicted_server_busy_s.get(sid)
        versus = f"{format_seconds(predicted):>12}" if predicted is not None else f"{'-':>12}"
        lines.append(f"  {sid} {run.addresses[sid]:<22}{format_seconds(measured):>12} /{versus}")
    crossings = ", ".join(f"{pair}: {count:g}" for pair, count in sorted(run.crossings.items()))
    lines.append(
        f"through the driver per inference: {run.hops:g} hops "
        f"({'tensors ' + crossings if crossings else 'no tensor crossed servers'}), "
        f"{run.hop_bytes / 1e3:.1f} kB, {format_seconds(run.hop_s)}; model inputs up and outputs down "
        f"{format_seconds(run.io_s)} (waits for the sessions included), predicted "
        f"{format_seconds(sum(run.predicted_io_s.values()))} (in the prediction above)"
    )
    for sid, hop in sorted(run.driver_hops.items()):
        lines.append(
            f"  hop {sid}: download {format_seconds(hop['download_latency_s'])} + "
            f"{hop['download_Bps'] / 1e6:.1f} MB/s, upload {format_seconds(hop['upload_latency_s'])} + "
            f"{hop['upload_Bps'] / 1e6:.1f} MB/s (measured, planned with)"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------- the whole job: diviml run --rpc
def run_rpc(
    model: str,
    platform: str,
    addresses: str = "local",
    cost: str = "measured",
    *,
    timeout_s: float = 60.0,
    load: LoadOptions = AS_GIVEN,
    solve: SolveOptions = RUN_SOLVE,
    options: RunOptions = RUN_DEFAULTS,
    listener: Callable[[Event], None] | None = None,
    on_planned: Callable[[Planned], None] | None = None,
    progress: Callable[[str], None] = print,
) -> RunReport:
    """``diviml run --rpc`` without its parsing and printing: one RPC server per server of ``platform``
    (``addresses`` HOST:PORT,... in server order, or ``local`` to start them on the loopback); the plan
    prices cross-server copies as two hops through the driver, at figures measured over the sessions.
    For throughput, ``auto`` keeps the model (or its stages) replicated where that is predicted faster:
    each replica is built for its servers and takes its share of the stream. ``timeout_s``: seconds
    without progress before a server counts as hung."""
    refuse_local_only_options(model, options)
    count = len(server_devices(get_platform(platform)))
    with contextlib.ExitStack() as stack:
        if addresses == "local":
            progress(f"starting {count} RPC server(s) on {LOOPBACK} ...")
            servers = stack.enter_context(start_local_servers(count)).addresses
        else:
            servers = parse_addresses(addresses, count)
        workload = runnable_workload(model, platform, cost, load)
        remotes = connect_servers(workload.platform, servers, timeout_s=timeout_s)
        stack.callback(lambda: [remote.close() for remote in remotes.values()])
        hops = measure_driver_hops(remotes, timeout_s=timeout_s)
        workload = over_driver_hops(workload, hops)
        solved, row, problem = solve_workload(workload, solve, listener=listener)
        plan, sim = solved.plan, solved.simulation
        if on_planned:
            on_planned(Planned(row, problem, notes=[plan_line(plan, problem.platform)]))
        predicted, io = predicted_over_rpc(problem, plan, sim, hops)
        loaded = workload.loaded
        measured, built = run_plan_rpc(
            loaded.built,
            loaded.extraction,
            problem.platform,
            plan,
            predicted,
            remotes,
            predicted_busy_s=sim.device_busy_s,
            predicted_io_s=io,
            repeats=options.repeats,
            stream_inputs=options.stream_inputs,
            in_flight=options.in_flight,
            timeout_s=timeout_s,
            database=tuning_database(load.tuning_db, workload.costs),
            driver_hops=hops,
            progress=progress,
        )
    return measured_report(row, measured, format_rpc_run(measured, options.rtol), built, loaded.built, options.rtol)


def refuse_local_only_options(model: str, options: RunOptions) -> None:
    """What a run across RPC servers cannot do: check against a framework (after the framework's own
    checks), split a batch, or time candidates, each of which runs on this machine."""
    if options.reference:
        check_reference(options.reference, model)
        raise DivimlInputError(
            "the framework's check holds a build on this machine to it, not one across RPC servers",
            field="--reference",
            hint="drop --rpc to check the model against its framework here, or drop --reference",
        )
    if options.batch_split > 1:
        raise DivimlInputError(
            "--batch-split runs its copies on this machine's devices, not across RPC servers",
            field="--batch-split",
            hint="drop --batch-split or --rpc",
        )
    if options.candidates > 1:
        raise DivimlInputError(
            "--candidates times plans on this machine, not across RPC servers",
            field="--candidates",
            hint="drop --candidates or --rpc",
        )


def over_driver_hops(workload: Workload, hops: Mapping[str, DriverHop]) -> Workload:
    """``workload`` with every cross-server link priced as the driver's two hops: a new platform
    (``driver_hop_platform``) and its cost model on it (the cost models price a copy by their platform's
    links, measured ones only inside a server); the workload given is left as it was."""
    platform = driver_hop_platform(workload.platform, hops)
    costs = copy.copy(workload.costs)
    costs.platform = platform
    return dataclasses.replace(workload, platform=platform, costs=costs)
