"""The one simulator that scores every Plan, in named cost modes (docs/design.md#cost-modes).

- ``latency``: one inference. Each device runs one kernel at a time in the plan's order; a kernel
  starts when its device is free and all its inputs have arrived; a tensor made on d reaches e at
  its finish + c(v, d, e), once per destination device. With ``link_contention`` a link is a FIFO
  resource too. Model inputs start on the host; outputs made elsewhere return to it.
- ``period_overlap``: a stream of inputs (DiviML's throughput). Transfers overlap compute; the
  period is the largest device load or link load. Replica groups split the stream by shares.
- ``stage_serial``: a k-stage pipeline (MTPP). A stage's cost is its work plus every tensor that
  enters it (once per tensor) plus every tensor it sends out (once per tensor); period = max.
- ``host_staged``: the msr-fiddle model. Copies pass through host memory: an accelerator pays its
  work, one copy to the host for each of its tensors that leaves it and one copy from the host for
  each tensor that enters it; CPU devices pay their work only. Period = largest load.

Everything is linear in the graph size apart from a heap in ``latency`` mode.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

import networkx as nx

from .cost.base import CostModel
from .graph import OpGraph
from .plan import Plan, PlanError
from .platform import Platform
from .problem import Problem
from .segments import segment_boundaries, split_segments
from .servers import corun_groups
from .units import format_bytes


@dataclass(frozen=True)
class Transfer:
    tensor: str
    src: str
    dst: str
    start_s: float
    end_s: float


@dataclass
class Simulation:
    mode: str
    value_s: float  # makespan (latency) or period
    feasible: bool = True
    problems: list[str] = field(default_factory=list)
    device_busy_s: dict[str, float] = field(default_factory=dict)  # load (period modes) or busy time
    link_busy_s: dict[tuple[str, str], float] = field(default_factory=dict)
    memory_bytes: dict[str, float] = field(default_factory=dict)
    start_s: dict[str, float] = field(default_factory=dict)  # latency mode
    finish_s: dict[str, float] = field(default_factory=dict)
    transfers: list[Transfer] = field(default_factory=list)
    stage_cost_s: list[float] = field(default_factory=list)  # stage_serial
    device_graph_acyclic: bool = True


# Simulations kept per problem: one solve scores the same plan several times (a list schedule by the
# heuristics, by its solver's finish, by the report's baselines): 17 simulations of 0.23 s on a
# 10,000-kernel latency solve, of which 12 scored a plan already scored.
KEPT_SIMULATIONS = 8


def simulate(problem: Problem, plan: Plan, *, link_contention: bool = False) -> Simulation:
    """Score ``plan`` on ``problem``'s graph, platform and costs in the plan's own cost mode (not the
    problem's objective: a latency plan of a throughput problem is scored as latency). Raises
    PlanError when the plan does not fit. A plan scored before on the same problem is not scored
    again: its Simulation is shared (a shallow copy), so callers read it and do not change it."""
    plan.check(problem.graph, problem.platform)
    kept = problem.memo.setdefault("simulations", OrderedDict())
    key = (_plan_key(problem.graph, plan), link_contention)
    if key in kept:
        kept.move_to_end(key)
        return dataclasses.replace(kept[key])
    sim = _simulate(problem, plan, link_contention)
    kept[key] = sim
    if len(kept) > KEPT_SIMULATIONS:
        kept.popitem(last=False)
    return dataclasses.replace(sim)


@dataclass(frozen=True)
class StreamPrice:
    """A stream of a plan as the concurrent executor runs it, ``in_flight`` inputs at a time: each
    input takes ``latency_s`` (its route as executed, averaged over the routes by their shares), so
    by Little's law the period is at least ``latency_s / in_flight``; and at least ``load_s``, the
    simulator's period (the busiest device or link per inference) or what the driver's own work per
    inference allows (``_driver_bound``), whichever is larger."""

    period_s: float
    in_flight: int
    load_s: float
    latency_s: float


STREAM_SLACK = 1  # inputs in flight beyond what Little's law asks: a device never waits for the driver


def stream_price(problem: Problem, plan: Plan, in_flight: int | None = None) -> StreamPrice:
    """``plan``'s stream priced as it runs, at ``in_flight`` inputs in flight (None: the fewest that
    keep the busiest device busy, ``ceil(latency / load)``, and ``STREAM_SLACK`` more). A plan on one
    device runs in one VM, one inference after another (``runtime.vm.SingleVMRunner.stream``): its
    period is its latency, whatever ``in_flight``."""
    if one_vm_stream(plan):  # one VM: the latency mode's schedule, as a one-device latency plan
        latency = _latency(problem.graph, problem.platform, problem.costs, plan, False).value_s
        return StreamPrice(latency, 1, latency, latency)
    sim = simulate(problem, _as_streamed(plan))
    load = max(sim.value_s, _driver_bound(problem, sim))
    latency = sum(share * _route_latency(problem, route) for route, share in route_plans(plan))
    if in_flight is None:
        in_flight = max(1, math.ceil(latency / load - 1e-9)) + STREAM_SLACK if load > 0 else 1
    return StreamPrice(max(load, latency / in_flight), in_flight, load, latency)


def _as_streamed(plan: Plan) -> Plan:
    """A pipeline's stream as the concurrent executor runs it: a stage's worker hands its tensors to
    the next stage's and starts on its next input meanwhile, so a hand-off loads its link, not the
    stage's device (``period_overlap``), where ``stage_serial`` adds it to the stage. Priced serially,
    the best pipeline of mobilenet_v2 at 64x64 on cpu2 was predicted at 1.15 ms per inference (three
    hand-offs of ~95 us each charged to its stages) and measured 0.68 ms; priced so, a later run
    predicted 0.87 ms and measured 0.89."""
    return dataclasses.replace(plan, mode="period_overlap") if plan.mode == "stage_serial" else plan


def _driver_bound(problem: Problem, sim: Simulation) -> float:
    """The driver's own work per inference (``run_s``: inputs handed in, outputs collected) is serial,
    and it runs on the host's cores: where the host's CPU devices are busy, they share their threads
    with it (on cpu2 a stream of two replicas left no core free: a model of ~100 us per inference ran
    at (both devices' work + the driver's) / 2 cores, not at the devices' load)."""
    platform, driver = problem.platform, problem.costs.executor_overheads.run_s
    if driver <= 0:
        return 0.0
    host = platform.device(platform.host)
    group = next((g for g in corun_groups(platform) if host.name in g), {host.name} if host.kind == "cpu" else set())
    cores = sum(platform.device(d).num_threads or 1 for d in group)
    busy = sum(sim.device_busy_s.get(d, 0.0) for d in group)
    return max(driver, (busy + driver) / cores) if cores else driver


def route_plans(plan: Plan) -> list[tuple[Plan, float]]:
    """``plan``'s routes (``Plan.routes``) as plain plans, with their shares; a plan without replicas
    is its one route, its device orders kept."""
    if not plan.replicas:
        return [(plan, 1.0)]
    return [(Plan(assignment), share) for assignment, share in plan.routes()]


def one_vm_stream(plan: Plan) -> bool:
    """Whether ``plan``'s stream runs in one VM on the calling thread: one device, no replicas, no
    batch split."""
    return not plan.replicas and plan.batch_split == 1 and len(set(plan.assignment.values())) == 1


def _route_latency(problem: Problem, route: Plan) -> float:
    """One input's time through one route (a plan without replicas) on the concurrent executor:
    segment by segment where the costs describe that executor, each call at its cost in a stream
    (the calls of one input run one after another along the route: at most that many more), else the
    latency mode's schedule."""
    graph, platform, costs = problem.graph, problem.platform, problem.costs
    if not costs.executor_segments:
        return _latency(graph, platform, costs, route, False).value_s
    overheads = costs.executor_overheads
    calls = len(split_segments(graph, route.assignment, run_order(graph, route)))
    extra = (overheads.streamed_segment_s - overheads.segment_s) * calls
    return _latency_as_executed(graph, platform, costs, route).value_s + extra


def _plan_key(graph: OpGraph, plan: Plan) -> tuple:
    """Everything of ``plan`` that the simulator reads, hashable; no order reads as the one it stands
    for (``device_orders``), so that a plan given its order after a simulation is not simulated again
    (a second or more on 100,000 kernels)."""
    orders = plan.order if plan.order else device_orders(graph, plan)
    return (
        plan.mode,
        tuple(plan.assignment[k] for k in graph.topo_order),
        tuple((d, tuple(kernels)) for d, kernels in sorted(orders.items())),
        tuple(tuple(stage) for stage in plan.stages) if plan.stages else None,
        tuple(plan.stage_devices) if plan.stage_devices else None,
        tuple((tuple(g.kernels), tuple(sorted(g.shares.items()))) for g in plan.replicas),
    )


def _simulate(problem: Problem, plan: Plan, link_contention: bool) -> Simulation:
    graph, platform, costs = problem.graph, problem.platform, problem.costs
    if plan.replicas and plan.mode != "period_overlap":
        raise PlanError(f"replicas are priced only in mode period_overlap, not '{plan.mode}'", field="replicas")
    if plan.mode == "latency" and costs.executor_segments and len(set(plan.assignment.values())) > 1:
        sim = _latency_as_executed(graph, platform, costs, plan)
    elif plan.mode == "latency":
        sim = _latency(graph, platform, costs, plan, link_contention)
    elif plan.mode == "period_overlap":
        sim = _period_overlap(graph, platform, costs, plan)
    elif plan.mode == "stage_serial":
        sim = _stage_serial(graph, platform, costs, plan)
    else:
        sim = _host_staged(graph, platform, costs, plan)
    _check_constraints(graph, platform, costs, plan, sim)
    sim.device_graph_acyclic = _device_graph_acyclic(graph, plan.assignment)
    return sim


# ---------------------------------------------------------------------- shared pieces
def remote_sends(graph: OpGraph, assignment: dict[str, str], kernel: str) -> dict[str, float]:
    """Destination device -> bytes for the tensor of ``kernel``: once per device, the largest edge."""
    here = assignment[kernel]
    sends: dict[str, float] = {}
    for edge in graph.succ[kernel]:
        there = assignment[edge.dst]
        if there != here:
            sends[there] = max(sends.get(there, 0.0), edge.bytes)
    return sends


def input_sends(graph: OpGraph, assignment: dict[str, str]) -> list[tuple[str, str, float]]:
    """(input name, destination device, bytes) for each model input and each device that reads it."""
    out = []
    for graph_input in graph.inputs:
        for device in dict.fromkeys(assignment[c] for c in graph_input.consumers):
            out.append((graph_input.name, device, graph_input.bytes))
    return out


def _device_graph_acyclic(graph: OpGraph, assignment: dict[str, str]) -> bool:
    quotient = nx.DiGraph()
    quotient.add_edges_from(
        (assignment[e.src], assignment[e.dst]) for e in graph.edges if assignment[e.src] != assignment[e.dst]
    )
    return nx.is_directed_acyclic_graph(quotient)


def device_orders(graph: OpGraph, plan: Plan) -> dict[str, list[str]]:
    """The plan's per-device run order, or the graph's topological order restricted to each device."""
    if plan.order is None:
        orders: dict[str, list[str]] = defaultdict(list)
        for kernel in graph.topo_order:
            orders[plan.assignment[kernel]].append(kernel)
        return dict(orders)
    for device, kernels in plan.order.items():
        for kernel in kernels:
            if plan.assignment.get(kernel) != device:
                raise PlanError(
                    f"order lists kernel '{kernel}' on '{device}', but it is assigned to "
                    f"'{plan.assignment.get(kernel)}'",
                    field="order",
                )
    listed = sum(len(v) for v in plan.order.values())
    if listed != len(graph) or len({k for v in plan.order.values() for k in v}) != listed:
        raise PlanError("order must list every kernel exactly once", field="order")
    return {d: list(v) for d, v in plan.order.items()}


def run_order(graph: OpGraph, plan: Plan) -> list[str]:
    """One order of all kernels that respects the data and the plan's per-device order (when it
    has one): the order the single VM runs them in, and the one segments are cut from."""
    if plan.order is None:
        return list(graph.topo_order)
    device_orders(graph, plan)  # validates the order against the assignment
    dag = graph.to_networkx()
    for kernels in plan.order.values():
        dag.add_edges_from(zip(kernels, kernels[1:]))
    position = {k: i for i, k in enumerate(graph.topo_order)}
    try:
        return list(nx.lexicographical_topological_sort(dag, key=position.__getitem__))
    except nx.NetworkXUnfeasible:
        raise PlanError(
            "the plan's per-device order contradicts the data dependencies",
            field="order",
            hint="order each device's kernels topologically",
        ) from None


# ---------------------------------------------------------------------- latency
def _arrivals_awaited(
    graph: OpGraph, assign: dict[str, str]
) -> tuple[dict[str, int], dict[tuple[str, str], list[str]]]:
    """Per kernel, how many inputs it waits for (a same-device producer's finish, or one arrival per
    remote producer and model input); per (tensor, device), the kernels there that wait for it."""
    waiting_for: dict[tuple[str, str], list[str]] = defaultdict(list)
    pending = {k: 0 for k in graph.kernels}
    for kernel in graph.kernels:
        remote = set()
        for edge in graph.pred[kernel]:
            if assign[edge.src] == assign[kernel]:
                pending[kernel] += 1
            else:
                remote.add(edge.src)
        for src in remote:
            waiting_for[src, assign[kernel]].append(kernel)
        pending[kernel] += len(remote)
    for graph_input in graph.inputs:
        for consumer in dict.fromkeys(graph_input.consumers):
            waiting_for[graph_input.name, assign[consumer]].append(consumer)
            pending[consumer] += 1
    return pending, waiting_for


def _latency(graph: OpGraph, platform: Platform, costs: CostModel, plan: Plan, contention: bool) -> Simulation:
    assign = plan.assignment
    host = platform.host
    outputs = graph.output_set
    orders = device_orders(graph, plan)
    pointer = {d: 0 for d in orders}
    device_free = {d: 0.0 for d in orders}
    ready = {k: 0.0 for k in graph.kernels}
    start: dict[str, float] = {}
    finish: dict[str, float] = {}
    pending, waiting_for = _arrivals_awaited(graph, assign)
    events: list[tuple[float, int, str, tuple]] = []
    sequence = 0
    link_free: dict[tuple[str, str], float] = defaultdict(float)
    transfers: list[Transfer] = []
    output_arrival = 0.0
    busy: dict[str, float] = defaultdict(float)

    def push(time: float, kind: str, payload: tuple) -> None:
        nonlocal sequence
        heapq.heappush(events, (time, sequence, kind, payload))
        sequence += 1

    def try_start(device: str) -> None:
        queue = orders[device]
        while pointer[device] < len(queue) and pending[queue[pointer[device]]] == 0:
            kernel = queue[pointer[device]]
            pointer[device] += 1
            begin = max(device_free[device], ready[kernel])
            seconds = costs.compute_s(kernel, device)
            start[kernel], finish[kernel] = begin, begin + seconds
            device_free[device] = finish[kernel]
            busy[device] += seconds
            push(finish[kernel], "finish", (kernel,))

    def satisfy(kernel: str, time: float) -> None:
        ready[kernel] = max(ready[kernel], time)
        pending[kernel] -= 1
        if pending[kernel] == 0:
            try_start(assign[kernel])

    def arrive(tensor: str, device: str, time: float) -> None:
        for kernel in waiting_for.get((tensor, device), ()):
            satisfy(kernel, time)

    for name, device, nbytes in input_sends(graph, assign):
        if device == host:
            arrive(name, device, 0.0)
        else:
            push(0.0, "send", (name, host, device, nbytes))
    for device in orders:
        try_start(device)

    while events:
        time, _, kind, payload = heapq.heappop(events)
        if kind == "finish":
            (kernel,) = payload
            device = assign[kernel]
            for edge in graph.succ[kernel]:
                if assign[edge.dst] == device:
                    satisfy(edge.dst, time)
            sends = remote_sends(graph, assign, kernel)
            if kernel in outputs and device != host and graph.kernels[kernel].output_bytes > 0:
                sends[host] = max(sends.get(host, 0.0), graph.kernels[kernel].output_bytes)
            for there, nbytes in sends.items():
                push(time, "send", (kernel, device, there, nbytes))
        else:
            tensor, src, dst, nbytes = payload
            begin = max(time, link_free[(src, dst)]) if contention else time
            end = begin + costs.transfer_s(nbytes, src, dst)
            if contention:
                link_free[(src, dst)] = end
            transfers.append(Transfer(tensor, src, dst, begin, end))
            if dst == host and tensor in outputs:
                output_arrival = max(output_arrival, end)
            arrive(tensor, dst, end)

    return _schedule_result(graph, assign, start, finish, transfers, output_arrival, busy)


def _schedule_result(
    graph: OpGraph,
    assign: dict[str, str],
    start: dict[str, float],
    finish: dict[str, float],
    transfers: list[Transfer],
    output_arrival: float,
    busy: dict[str, float],
) -> Simulation:
    """The latency Simulation of a finished event run; a run that left kernels unstarted deadlocked."""
    if len(finish) != len(graph):
        stuck = next(k for k in graph.topo_order if k not in finish)
        raise PlanError(
            f"the plan's order deadlocks: kernel '{stuck}' on '{assign[stuck]}' can never start",
            field="order",
            hint="each device's order must be consistent with the graph's dependencies",
        )
    link_busy: dict[tuple[str, str], float] = defaultdict(float)
    for t in transfers:
        link_busy[t.src, t.dst] += t.end_s - t.start_s
    makespan = max([0.0, output_arrival, *finish.values()])
    return Simulation(
        "latency",
        makespan,
        device_busy_s=dict(busy),
        link_busy_s=dict(link_busy),
        start_s=start,
        finish_s=finish,
        transfers=transfers,
    )


def _latency_as_executed(graph: OpGraph, platform: Platform, costs: CostModel, plan: Plan) -> Simulation:
    """Latency as the concurrent executor runs the build: the plan cut into same-device segments
    (``tvm_diviml.segments``), each one call that starts once its device is free and every segment it
    reads has ended (a segment's tensors leave it when its call returns); the destination's worker
    then copies each tensor it lacks (link time, hand-off included) before its kernels run back to
    back. Model inputs come from the host, outputs made elsewhere go back to it. Every segment call
    costs ``executor_overheads.segment_s`` before its kernels, and the inference ``run_s`` more.

    Where the CPU devices of one server slow each other (``corun_factor`` > 1), a segment's kernels
    are stretched by the factor over the share of their time that another of those devices computes
    too (that share read from the schedule without the stretch: one correction, not a fixed point)."""
    segments = split_segments(graph, plan.assignment, run_order(graph, plan))
    boundaries = segment_boundaries(graph, segments)
    sim, spans = _run_segments(graph, platform, costs, segments, boundaries, {})
    factor = costs.executor_overheads.corun_factor
    if factor > 1.0:
        stretch = {name: 1.0 + (factor - 1.0) * share for name, share in _corun_shares(platform, spans).items()}
        if any(x > 1.0 for x in stretch.values()):
            sim, _ = _run_segments(graph, platform, costs, segments, boundaries, stretch)
    return sim


def _run_segments(
    graph: OpGraph, platform: Platform, costs: CostModel, segments, boundaries, stretch: dict[str, float]
) -> tuple[Simulation, dict[str, tuple[str, float, float]]]:
    """``_latency_as_executed``'s schedule, each segment's kernels taking ``stretch`` times their cost;
    also each segment's device and the span its kernels run in."""
    host = platform.host
    inputs = {i.name: i.bytes for i in graph.inputs}
    overheads = costs.executor_overheads
    segment_end: dict[str, float] = {}
    spans: dict[str, tuple[str, float, float]] = {}
    where: dict[str, str] = {}  # kernel -> device of its segment
    device_free: dict[str, float] = defaultdict(float)
    busy: dict[str, float] = defaultdict(float)
    start: dict[str, float] = {}
    finish: dict[str, float] = {}
    transfers: list[Transfer] = []
    moved: set[tuple[str, str]] = set()  # (tensor, device): a tensor crosses once per device
    for seg in segments:
        device = seg.device
        bound = boundaries[seg.name]
        clock = max([device_free[device], *(finish[k] for k in bound.reads)])
        crossings = [(name, host, inputs[name]) for name in bound.inputs if device != host]
        crossings += [
            (k, where[k], max(e.bytes for e in graph.succ[k] if e.dst in seg.kernels))
            for k in bound.reads
            if where[k] != device
        ]
        for tensor, src, nbytes in crossings:
            if (tensor, device) not in moved:
                moved.add((tensor, device))
                seconds = costs.transfer_s(nbytes, src, device)
                transfers.append(Transfer(tensor, src, device, clock, clock + seconds))
                clock += seconds
        clock += overheads.segment_s
        first = clock
        for kernel in seg.kernels:
            seconds = costs.compute_s(kernel, device) * stretch.get(seg.name, 1.0)
            start[kernel], finish[kernel] = clock, clock + seconds
            clock += seconds
            busy[device] += seconds
            where[kernel] = device
        for kernel in seg.kernels:  # its tensors are handed on when the call returns
            finish[kernel] = clock
        spans[seg.name] = (device, first, clock)
        segment_end[seg.name] = device_free[device] = clock
    makespan = max(segment_end.values(), default=0.0)
    for kernel in graph.outputs:
        if where[kernel] != host and graph.kernels[kernel].output_bytes > 0:
            seconds = costs.transfer_s(graph.kernels[kernel].output_bytes, where[kernel], host)
            transfers.append(Transfer(kernel, where[kernel], host, finish[kernel], finish[kernel] + seconds))
            makespan = max(makespan, finish[kernel] + seconds)
    makespan += overheads.run_s
    link_busy: dict[tuple[str, str], float] = defaultdict(float)
    for t in transfers:
        link_busy[(t.src, t.dst)] += t.end_s - t.start_s
    sim = Simulation(
        "latency",
        makespan,
        device_busy_s=dict(busy),
        link_busy_s=dict(link_busy),
        start_s=start,
        finish_s=finish,
        transfers=transfers,
    )
    return sim, spans


def _corun_shares(platform: Platform, spans: dict[str, tuple[str, float, float]]) -> dict[str, float]:
    """Per segment on a CPU device: the share of its kernels' span during which another CPU device
    of its server runs kernels too."""
    group_of = {device: index for index, group in enumerate(corun_groups(platform)) for device in group}
    shares = {}
    for name, (device, begin, end) in spans.items():
        if device not in group_of or end <= begin:
            continue
        overlap = sum(
            max(0.0, min(end, e) - max(begin, b))
            for other, (d, b, e) in spans.items()
            if other != name and d != device and group_of.get(d) == group_of[device]
        )
        shares[name] = min(1.0, overlap / (end - begin))
    return shares


# ---------------------------------------------------------------------- period_overlap
def _placement_shares(graph: OpGraph, plan: Plan) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """Per kernel: {device: share of the stream}; and a group id (kernels of a group move together)."""
    shares = {k: {d: 1.0} for k, d in plan.assignment.items()}
    group_of = {k: -1 - i for i, k in enumerate(graph.kernels)}  # singletons
    for index, group in enumerate(plan.replicas):  # Plan.check: known kernels, each in one group at most
        for kernel in group.kernels:
            shares[kernel] = {d: s for d, s in group.shares.items() if s > 0}
            group_of[kernel] = index
    return shares, group_of


def _period_overlap(graph: OpGraph, platform: Platform, costs: CostModel, plan: Plan) -> Simulation:
    shares, group_of = _placement_shares(graph, plan)
    outputs = graph.output_set
    for group in plan.replicas:
        for device in group.shares:
            platform.device(device)
    device_load: dict[str, float] = defaultdict(float)
    link_load: dict[tuple[str, str], float] = defaultdict(float)
    devices = platform.device_names
    for kernel in graph.kernels:
        for device, share in shares[kernel].items():
            device_load[device] += share * costs.compute_s(kernel, device)
        # Which devices need this tensor, with what probability, given where it was made.
        consumer_groups: dict[int, tuple[dict[str, float], float]] = {}
        for edge in graph.succ[kernel]:
            gid = group_of[edge.dst]
            if gid == group_of[kernel]:
                continue  # moves with the producer: always on the same device
            dist, nbytes = consumer_groups.get(gid, (shares[edge.dst], 0.0))
            consumer_groups[gid] = (dist, max(nbytes, edge.bytes))
        # only devices where a consumer may run receive the tensor (a model replicated on 1,000 devices
        # would otherwise ask every pair of them for each kernel: 14 s a simulation)
        receivers = [d for d in devices if any(dist.get(d, 0.0) > 0 for dist, _ in consumer_groups.values())]
        for src, p_src in shares[kernel].items():
            for dst in receivers:
                if dst == src:
                    continue
                p_absent, nbytes = 1.0, 0.0
                for dist, group_bytes in consumer_groups.values():
                    if dist.get(dst, 0.0) > 0:
                        p_absent *= 1.0 - dist[dst]
                        nbytes = max(nbytes, group_bytes)
                if p_absent < 1.0:
                    link_load[(src, dst)] += p_src * (1.0 - p_absent) * costs.transfer_s(nbytes, src, dst)
        if kernel in outputs and graph.kernels[kernel].output_bytes > 0:
            for src, p_src in shares[kernel].items():
                if src != platform.host:
                    nbytes = graph.kernels[kernel].output_bytes
                    link_load[(src, platform.host)] += p_src * costs.transfer_s(nbytes, src, platform.host)
    for graph_input in graph.inputs:
        need: dict[str, float] = {}
        for consumer in graph_input.consumers:
            for device, share in shares[consumer].items():
                need[device] = max(need.get(device, 0.0), share)
        for device, probability in need.items():
            if device != platform.host:
                link_load[(platform.host, device)] += probability * costs.transfer_s(
                    graph_input.bytes, platform.host, device
                )
    stretch = _corun_stretch(platform, costs, device_load)
    for device, extra in stretch.items():
        device_load[device] *= 1.0 + extra
    for route, share in route_plans(plan):
        for device, seconds in _segment_charges(graph, costs, route).items():
            device_load[device] += share * seconds
    period = max([0.0, *device_load.values(), *link_load.values()])
    return Simulation("period_overlap", period, device_busy_s=dict(device_load), link_busy_s=dict(link_load))


def _corun_stretch(platform: Platform, costs: CostModel, work: dict[str, float]) -> dict[str, float]:
    """How much longer each device's kernels take in a stream: every device computes all the time,
    so where two CPU devices of one server both have ``work``, each one's kernels take
    ``corun_factor`` times as long (the value is the factor less one)."""
    factor = costs.executor_overheads.corun_factor
    if factor <= 1.0:
        return {}
    stretch = {}
    for group in corun_groups(platform):
        working = [d for d in group if work.get(d, 0.0) > 0]
        if len(working) > 1:
            stretch.update(dict.fromkeys(working, factor - 1.0))
    return stretch


def _segment_charges(graph: OpGraph, costs: CostModel, plan: Plan) -> dict[str, float]:
    """What a stream of ``plan`` (one route, no replicas) pays each device per inference beyond its
    kernels when its costs describe the concurrent executor (``executor_segments``): a segment call's
    cost in a stream per call (``streamed_segment_s``). A stream always runs on that executor, one
    device or several."""
    per_call = costs.executor_overheads.streamed_segment_s
    if not costs.executor_segments or per_call <= 0:
        return {}
    charges: dict[str, float] = defaultdict(float)
    for seg in split_segments(graph, plan.assignment, run_order(graph, plan)):
        charges[seg.device] += per_call
    return charges


# ---------------------------------------------------------------------- stage_serial
def _stage_serial(graph: OpGraph, platform: Platform, costs: CostModel, plan: Plan) -> Simulation:
    if not plan.stages:
        raise PlanError("mode stage_serial needs 'stages'", field="stages")
    stage_of: dict[str, int] = {}
    for index, stage in enumerate(plan.stages):
        for kernel in stage:
            if kernel in stage_of:
                raise PlanError(f"kernel '{kernel}' is in two stages", field="stages")
            if kernel not in graph.kernels:
                raise PlanError(f"stage {index} names unknown kernel '{kernel}'", field="stages")
            stage_of[kernel] = index
    if len(stage_of) != len(graph):
        missing = next(k for k in graph.kernels if k not in stage_of)
        raise PlanError(f"kernel '{missing}' is in no stage", field="stages")
    devices = plan.stage_devices or [plan.assignment[stage[0]] if stage else platform.host for stage in plan.stages]
    if len(devices) != len(plan.stages):
        raise PlanError("stage_devices must name one device per stage", field="stage_devices")
    for index, stage in enumerate(plan.stages):
        for kernel in stage:
            if plan.assignment[kernel] != devices[index]:
                raise PlanError(
                    f"kernel '{kernel}' of stage {index} is assigned to '{plan.assignment[kernel]}', "
                    f"not to its stage's device '{devices[index]}'",
                    field="assignment",
                )
    for edge in graph.edges:
        if stage_of[edge.src] > stage_of[edge.dst]:
            raise PlanError(
                f"edge {edge.src} -> {edge.dst} runs from stage {stage_of[edge.src]} back to "
                f"stage {stage_of[edge.dst]}",
                field="stages",
                hint="stages must be ordered",
            )
    assign = plan.assignment
    cost = [0.0] * len(plan.stages)
    work = [0.0] * len(plan.stages)
    for kernel in graph.kernels:
        home = stage_of[kernel]
        cost[home] += costs.compute_s(kernel, assign[kernel])
        work[home] += costs.compute_s(kernel, assign[kernel])
        inbound: dict[int, float] = {}
        for edge in graph.succ[kernel]:
            there = stage_of[edge.dst]
            if there != home:
                inbound[there] = max(inbound.get(there, 0.0), edge.bytes)
        if inbound:  # sent once, priced at the dearest destination link
            cost[home] += max(costs.transfer_s(b, assign[kernel], devices[s]) for s, b in inbound.items())
        for there, nbytes in inbound.items():
            cost[there] += costs.transfer_s(nbytes, assign[kernel], devices[there])
        if kernel in graph.output_set:
            cost[home] += costs.transfer_s(graph.kernels[kernel].output_bytes, assign[kernel], platform.host)
    for _name, device, nbytes in input_sends(graph, assign):
        cost[devices.index(device)] += costs.transfer_s(nbytes, platform.host, device)
    device_work: dict[str, float] = defaultdict(float)
    for index, device in enumerate(devices):
        device_work[device] += work[index]
    stretch = _corun_stretch(platform, costs, device_work)
    for index, device in enumerate(devices):
        cost[index] += stretch.get(device, 0.0) * work[index]
    for device, seconds in _segment_charges(graph, costs, plan).items():
        cost[devices.index(device)] += seconds
    device_load: dict[str, float] = defaultdict(float)
    for index, device in enumerate(devices):
        device_load[device] += cost[index]
    return Simulation("stage_serial", max(cost, default=0.0), device_busy_s=dict(device_load), stage_cost_s=cost)


# ---------------------------------------------------------------------- host_staged
def _host_staged(graph: OpGraph, platform: Platform, costs: CostModel, plan: Plan) -> Simulation:
    assign = plan.assignment
    host = platform.host
    pays = {d.name: d.kind != "cpu" for d in platform.devices}
    load: dict[str, float] = defaultdict(float)
    for kernel in graph.kernels:
        here = assign[kernel]
        load[here] += costs.compute_s(kernel, here)
        sends = remote_sends(graph, assign, kernel)
        if pays[here]:
            out_bytes = max(sends.values(), default=0.0)
            if kernel in graph.output_set:
                out_bytes = max(out_bytes, graph.kernels[kernel].output_bytes)
            if out_bytes > 0 or sends:
                load[here] += costs.transfer_s(out_bytes, here, host)
        for there, nbytes in sends.items():
            if pays[there]:
                load[there] += costs.transfer_s(nbytes, host, there)
    for _name, device, nbytes in input_sends(graph, assign):
        if pays[device]:
            load[device] += costs.transfer_s(nbytes, host, device)
    return Simulation("host_staged", max(load.values(), default=0.0), device_busy_s=dict(load))


# ---------------------------------------------------------------------- constraints
def _check_constraints(graph: OpGraph, platform: Platform, costs: CostModel, plan: Plan, sim: Simulation) -> None:
    shares, _ = _placement_shares(graph, plan)
    colocated: dict[str, set[str]] = defaultdict(set)
    for name, kernel in graph.kernels.items():
        for device in shares[name]:
            if kernel.allowed_devices is not None and device not in kernel.allowed_devices:
                sim.problems.append(
                    f"kernel '{name}' may not run on '{device}' (allowed: {', '.join(kernel.allowed_devices)})"
                )
            elif math.isinf(costs.compute_s(name, device)):
                sim.problems.append(f"kernel '{name}' cannot run on '{device}' (no cost)")
        if kernel.colocate is not None:
            colocated[kernel.colocate].update(shares[name])
    for group, devices in colocated.items():
        if len(devices) > 1:
            sim.problems.append(f"co-location group '{group}' is split over {', '.join(sorted(devices))}")
    sim.memory_bytes = memory_per_device(graph, plan, shares)
    for device, used in sim.memory_bytes.items():
        capacity = platform.device(device).memory_bytes
        if capacity is not None and used > capacity:
            sim.problems.append(f"device '{device}' needs {format_bytes(used)}, has {format_bytes(capacity)}")
    sim.feasible = not sim.problems and not math.isinf(sim.value_s)


def memory_per_device(
    graph: OpGraph, plan: Plan, shares: dict[str, dict[str, float]] | None = None
) -> dict[str, float]:
    """Bytes per device: every weight used there once, plus the peak of live activations.

    Activations are swept along the device's run order: a tensor made there is live from its
    producer to its last consumer there (to the end if it is a model output); a tensor received
    is live from its first to its last consumer there. A tensor's size is its producer's
    ``output_bytes`` (edge bytes only price transfers).
    """
    if shares is None:
        shares, _ = _placement_shares(graph, plan)
    kernels_on: dict[str, list[str]] = defaultdict(list)
    for kernel in graph.topo_order:
        for device in shares[kernel]:
            kernels_on[device].append(kernel)
    if plan.order is not None and not plan.replicas:
        kernels_on = defaultdict(list, {d: list(v) for d, v in plan.order.items()})
    return {
        device: graph.weight_bytes(sequence) + _peak_live_bytes(graph, sequence)
        for device, sequence in kernels_on.items()
    }


def _peak_live_bytes(graph: OpGraph, sequence: list[str]) -> float:
    """Peak of the activations live on one device that runs ``sequence`` in that order."""
    position = {k: i for i, k in enumerate(sequence)}
    intervals: list[tuple[int, int, float]] = []
    received: dict[str, tuple[int, int]] = {}
    for kernel in sequence:
        here = position[kernel]
        local = [position[e.dst] for e in graph.succ[kernel] if e.dst in position]
        end = len(sequence) - 1 if kernel in graph.output_set else max(local, default=here)
        intervals.append((here, end, graph.kernels[kernel].output_bytes))
        for edge in graph.pred[kernel]:
            if edge.src not in position:
                first, last = received.get(edge.src, (here, here))
                received[edge.src] = (min(first, here), max(last, here))
    intervals += [(first, last, graph.kernels[src].output_bytes) for src, (first, last) in received.items()]
    for graph_input in graph.inputs:
        spots = [position[c] for c in graph_input.consumers if c in position]
        if spots:
            intervals.append((min(spots), max(spots), graph_input.bytes))
    delta = [0.0] * (len(sequence) + 1)
    for first, last, nbytes in intervals:
        delta[first] += nbytes
        delta[last + 1] -= nbytes
    peak = running = 0.0
    for change in delta[:-1]:
        running += change
        peak = max(peak, running)
    return peak
