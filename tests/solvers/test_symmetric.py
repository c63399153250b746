"""The symmetric solver and block detection: against brute force on chains of blocks, against the
full solver with parallel blocks, and on the zoo's transformers."""

import itertools
import logging
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_diviml.cost.base import ExecutorOverheads
from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.platform import Device, Link, Network, Platform
from tvm_diviml.servers import ServerGroup, build_servers
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, get_solver
from tvm_diviml.solvers.symmetric import Symmetric
from tvm_diviml.toolkit.blocks import find_blocks, longest_repeat
from tvm_diviml.toolkit.incumbents import Incumbents

from ..helpers import examples, table


def kind(name: str, speeds: dict[str, float], memory: dict[str, float] | None = None, link=(0.1, 100.0)) -> Platform:
    """A server kind: devices named by ``speeds`` (the first is the host, a CPU), joined by ``link``."""
    memory = memory or {}
    devices = [
        Device(
            d,
            {"kind": "llvm"} if i == 0 else {"kind": "cuda"},
            "cpu:0" if i == 0 else f"cuda:{i - 1}",
            memory_bytes=memory.get(d),
        )
        for i, d in enumerate(speeds)
    ]
    links = {(a, b): Link(a, b, *link) for a in speeds for b in speeds if a != b}
    return Platform(name, devices, links)


def servers(*groups: tuple[Platform, int], latency=1.0, bandwidth=10.0) -> Platform:
    return build_servers([ServerGroup(k.name, k, n) for k, n in groups], Network(bandwidth, latency))


def stacked(
    blocks: int, shape: str = "chain", boundary_bytes=2.0, inner_bytes=4.0, weight_bytes=0.0, head=True, tail=True
) -> OpGraph:
    """``blocks`` identical blocks between a head ``h`` and a tail ``t``; a ``chain`` block is x -> y,
    a ``fork`` block is x -> (a, c) -> y. Kernels of one position share a PrimFunc hash. Tensors
    inside a block are wider than those between blocks by default, as in a transformer's MLP."""
    positions = {"chain": ["x", "y"], "fork": ["x", "a", "c", "y"]}[shape]
    inside = {"chain": [("x", "y")], "fork": [("x", "a"), ("x", "c"), ("a", "y"), ("c", "y")]}[shape]
    kernels, edges, weights = [], [], {}
    previous = None
    if head:
        kernels.append(Kernel("h", attrs={"primfunc_hash": "h"}))
        previous = "h"
    for b in range(blocks):
        for p in positions:
            ids = (f"w{p}{b}",) if weight_bytes else ()
            weights.update({w: weight_bytes for w in ids})
            kernels.append(Kernel(f"{p}{b}", weights=ids, attrs={"primfunc_hash": p}))
        edges += [Edge(f"{s}{b}", f"{d}{b}", inner_bytes) for s, d in inside]
        if previous:
            edges.append(Edge(previous, f"x{b}", boundary_bytes))
        previous = f"y{b}"
    if tail:
        kernels.append(Kernel("t", attrs={"primfunc_hash": "t"}))
        edges.append(Edge(previous, "t", boundary_bytes))
    first = kernels[0].name
    return OpGraph(kernels, edges, inputs=[GraphInput("ids", 1.0, (first,))], weights=weights)


def costs_for(graph: OpGraph, platform: Platform, per_device: dict[str, float], ends: float = 1.0):
    """Block kernels cost ``per_device[suffix]`` on every server's device of that name, head/tail ``ends``."""
    times = {}
    for kernel in graph.kernels:
        times[kernel] = {
            d: (ends if kernel in ("h", "t") else per_device[d.split(".", 1)[1]]) for d in platform.device_names
        }
    return table(platform, times)


def brute_force(problem: Problem) -> float:
    """The best feasible value over every assignment (chains: the run order is forced)."""
    graph = problem.graph
    best = math.inf
    for devices in itertools.product(problem.platform.device_names, repeat=len(graph.kernels)):
        plan = Plan(dict(zip(graph.kernels, devices)), objective=problem.objective, mode=problem.mode)
        sim = simulate(Problem(graph, problem.platform, problem.costs), plan)
        if sim.feasible:
            best = min(best, sim.value_s)
    return best


def blocks_of(plan: Plan, graph: OpGraph, count: int) -> list[str]:
    return [plan.assignment[f"x{b}"].split(".")[0] for b in range(count)]


# ---------------------------------------------------------------------- block detection
@pytest.mark.parametrize(
    "keys, expected",
    [
        ([0, 1, 2, 1, 2, 1, 2, 3], (1, 2, 3)),
        ([5, 5, 5, 5], (0, 1, 4)),  # the shortest block among equal coverage
        ([0, 1, 2, 3], (0, 0, 1)),  # nothing repeats
        ([0, 1, 2, 1, 2, 0, 3, 0, 3, 0, 3], (5, 2, 3)),  # the run that covers most wins
    ],
)
def test_longest_repeat(keys, expected):
    assert longest_repeat(keys) == expected


def test_find_blocks_splits_head_blocks_tail():
    platform = servers((kind("k", {"A": 1, "B": 1}), 2))
    graph = stacked(3, "fork")
    blocks, why = find_blocks(graph, costs_for(graph, platform, {"A": 2, "B": 1}), platform)
    assert blocks.head == ["h"] and blocks.tail == ["t"]
    assert [sorted(b) for b in blocks.blocks] == [sorted(f"{p}{i}" for p in "xacy") for i in range(3)]
    assert "3 blocks of 4 kernels" in why


def test_blocks_differing_in_cost_or_wiring_are_not_blocks():
    platform = servers((kind("k", {"A": 1}), 2))
    graph = stacked(3)
    costs = costs_for(graph, platform, {"A": 1})
    costs.compute["y1"]["s0.A"] = 5.0  # block 1 is slower on one device
    blocks, why = find_blocks(graph, costs, platform)
    assert blocks is None and "repeat" in why
    skip = OpGraph(list(graph.kernels.values()), [*graph.edges, Edge("y0", "x2", 2.0)], inputs=graph.inputs)
    blocks, why = find_blocks(skip, costs_for(skip, platform, {"A": 1}), platform)
    assert blocks is None and "beyond the next block" in why


def test_a_short_repeat_in_a_long_model_is_not_a_block_structure():
    platform = servers((kind("k", {"A": 1}), 2))
    chain = [Kernel(f"k{i}", attrs={"primfunc_hash": str(i)}) for i in range(8)]
    chain[3] = Kernel("k3", attrs={"primfunc_hash": "2"})  # 2 repeats of 1 kernel among 8
    graph = OpGraph(chain, [Edge(f"k{i}", f"k{i + 1}", 1.0) for i in range(7)])
    blocks, why = find_blocks(graph, costs_for(graph, platform, {"A": 1}, ends=1.0), platform)
    assert blocks is None and "less than half" in why


# ---------------------------------------------------------------------- against brute force
def test_memory_spreads_blocks_over_identical_servers_as_brute_force_does():
    # Each GPU holds one block's weights; the CPUs are slow: the optimum puts block 0 on s0's GPU,
    # block 1 on s1's GPU and pays one network hop.
    gpu = kind("node", {"A": 0, "B": 0}, memory={"B": 10.0})
    platform = servers((gpu, 2))
    graph = stacked(2, weight_bytes=3.0)
    problem = Problem(graph, platform, costs_for(graph, platform, {"A": 10.0, "B": 1.0}))
    plan = Symmetric().solve(problem)
    assert plan.value_s == pytest.approx(simulate(Problem(graph, platform, problem.costs), plan).value_s)
    assert plan.value_s == pytest.approx(brute_force(problem))
    assert [plan.assignment[f"{p}{b}"] for b in range(2) for p in "xy"] == ["s0.B", "s0.B", "s1.B", "s1.B"]
    assert plan.lower_bound_s <= plan.value_s


def test_memory_makes_a_server_go_on_with_its_second_gpu():
    node = kind("node", {"A": 0, "B": 0, "C": 0}, memory={"B": 7.0, "C": 7.0})
    platform = servers((node, 1))
    graph = stacked(2, weight_bytes=3.0)
    problem = Problem(graph, platform, costs_for(graph, platform, {"A": 10.0, "B": 1.0, "C": 1.0}))
    plan = Symmetric().solve(problem)
    assert "fallback" not in plan.attrs["symmetric"]
    assert plan.value_s == pytest.approx(brute_force(problem))
    assert {plan.assignment["x0"], plan.assignment["x1"]} == {"s0.B", "s0.C"}
    assert len(plan.attrs["symmetric"]["servers"]["s0"]) == 2


def test_throughput_splits_blocks_evenly_over_identical_servers():
    platform = servers((kind("node", {"B": 0}), 2), latency=0.5, bandwidth=100.0)
    graph = stacked(4)
    problem = Problem(graph, platform, costs_for(graph, platform, {"B": 1.0}), objective="throughput")
    plan = Symmetric().solve(problem)
    assert "fallback" not in plan.attrs["symmetric"]
    assert plan.value_s == pytest.approx(brute_force(problem))
    assert blocks_of(plan, graph, 4) == ["s0", "s0", "s1", "s1"]
    assert [run["blocks"] for run in plan.attrs["symmetric"]["servers"]["s0"]] == [2]


def test_throughput_gives_the_faster_kind_more_blocks():
    fast, slow = kind("fast", {"B": 0}), kind("slow", {"B": 0})
    platform = servers((slow, 1), (fast, 1), latency=0.5, bandwidth=100.0)
    graph = stacked(6, head=False, tail=False)
    times = {k: {"s0.B": 2.0, "s1.B": 1.0} for k in graph.kernels}
    problem = Problem(graph, platform, table(platform, times), objective="throughput")
    plan = Symmetric().solve(problem)
    assert "fallback" not in plan.attrs["symmetric"]
    assert plan.value_s == pytest.approx(brute_force(problem))
    assert blocks_of(plan, graph, 6).count("s1") == 4


def test_symmetric_breaks_ties_between_identical_servers_in_order():
    platform = servers((kind("node", {"B": 0}), 3), latency=0.5, bandwidth=100.0)
    graph = stacked(5, head=False, tail=False)
    problem = Problem(graph, platform, costs_for(graph, platform, {"B": 1.0}), objective="throughput")
    counts = [
        sum(run["blocks"] for run in runs) for runs in Symmetric().solve(problem).attrs["symmetric"]["servers"].values()
    ]
    assert counts == sorted(counts, reverse=True) and sum(counts) == 5


def test_the_server_that_carries_head_and_tail_takes_fewer_blocks():
    # Head and tail (2 s each) may run only on s0, a block takes 1 s: s0 takes 1 block, s1 the other 5,
    # period 5 s. Ordering identical servers by their blocks would force s0 to take at least as many
    # as s1 (7 s), and only the MILP after it would mend that.
    platform = servers((kind("node", {"B": 0}), 2), latency=0.5, bandwidth=100.0)
    stack = stacked(6)
    ends = {k: replace(kernel, allowed_devices=("s0.B",)) for k, kernel in stack.kernels.items() if k in ("h", "t")}
    graph = OpGraph([ends.get(k, kernel) for k, kernel in stack.kernels.items()], stack.edges, inputs=stack.inputs)
    problem = Problem(graph, platform, costs_for(graph, platform, {"B": 0.5}, ends=2.0), objective="throughput")
    plan = Symmetric().solve(problem)
    assert "fallback" not in plan.attrs["symmetric"]
    assert plan.value_s == pytest.approx(5.0) == pytest.approx(brute_force(problem))
    assert blocks_of(plan, graph, 6).count("s0") == 1
    assert not plan.attrs["symmetric"]["improved_by_milp"]  # the server program's own plan


def test_the_ends_link_loads_are_the_simulators():
    """With every block on one device, every transfer has the head or tail at one end (or is the
    model's input or output): the loads the server program adds for them are the simulator's."""
    from tvm_diviml.solvers.symmetric import _end_link_loads

    platform = servers((kind("node", {"A": 0, "B": 0, "C": 0}), 2), latency=0.5)
    graph = stacked(3, "fork", boundary_bytes=3.0, inner_bytes=5.0)
    problem = Problem(
        graph, platform, costs_for(graph, platform, {"A": 2.0, "B": 1.0, "C": 1.0}), objective="throughput"
    )
    blocks, _ = find_blocks(graph, problem.costs, platform)
    for head, body, tail in [("s0.B", "s1.C", "s0.C"), ("s0.A", "s0.B", "s1.B"), ("s1.B", "s1.B", "s0.B")]:
        assignment = (
            {k: body for k in graph.kernels} | dict.fromkeys(blocks.head, head) | dict.fromkeys(blocks.tail, tail)
        )
        plan = Plan(assignment, objective="throughput", mode="period_overlap")
        expected = {link: s for link, s in simulate(problem, plan).link_busy_s.items() if s > 0}
        assert _end_link_loads(problem, blocks, plan) == pytest.approx(expected)


# ---------------------------------------------------------------------- against the full solver
# How much worse than the full solver the symmetric plan may be on these 2-3 block graphs over two
# servers: whole blocks per server cannot balance a period (worst measured over 150 drawn instances:
# 1.60x for throughput, 1.12x for latency). The aim is both within 1%, which takes more than whole
# blocks per server (a block split between two servers); until then the test holds it to these.
SLACK_OVER_FULL = {"latency": 1.15, "throughput": 1.65}


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_symmetric_is_within_a_known_factor_of_the_full_solver(data):
    speeds = {"A": 0, "B": 0}
    platform = servers(
        (kind("node", speeds, link=(data.draw(st.sampled_from([0.1, 1.0])), 10.0)), 2),
        latency=data.draw(st.sampled_from([0.5, 3.0])),
    )
    count = data.draw(st.integers(2, 3))
    graph = stacked(
        count,
        "fork",
        boundary_bytes=data.draw(st.sampled_from([1.0, 8.0])),
        inner_bytes=data.draw(st.sampled_from([1.0, 4.0])),
    )
    position_times = {
        p: {"A": float(data.draw(st.integers(1, 6))), "B": float(data.draw(st.integers(1, 6)))} for p in "xacy"
    }
    times = {
        k: (
            {d: 1.0 for d in platform.device_names}
            if k in "ht"
            else {d: position_times[k[0]][d.split(".")[1]] for d in platform.device_names}
        )
        for k in graph.kernels
    }
    objective = data.draw(st.sampled_from(["latency", "throughput"]))
    problem = Problem(graph, platform, table(platform, times), objective=objective)
    full = get_solver("split" if objective == "latency" else "milp", time_limit_s=30).solve(problem)
    plan = Symmetric().solve(problem)
    assert plan.value_s == pytest.approx(simulate(Problem(graph, platform, problem.costs), plan).value_s)
    runs = [run for server in plan.attrs["symmetric"]["servers"].values() for run in server]
    assert all(run["blocks"] % run["group"] == 0 for run in runs)  # a group's loads hold for whole groups
    assert plan.lower_bound_s <= full.value_s * (1 + 1e-9)
    assert plan.value_s <= full.value_s * SLACK_OVER_FULL[objective]


# ---------------------------------------------------------------------- fallback, errors, determinism
def test_without_repeated_blocks_it_falls_back_and_says_so():
    platform = servers((kind("k", {"A": 0, "B": 0}), 2))
    graph = OpGraph(
        [Kernel(f"k{i}", attrs={"primfunc_hash": str(i)}) for i in range(4)],
        [Edge("k0", "k1", 1.0), Edge("k1", "k2", 1.0), Edge("k2", "k3", 1.0)],
    )
    times = {k: {d: 1.0 + i for i, d in enumerate(platform.device_names)} for k in graph.kernels}
    problem = Problem(graph, platform, table(platform, times))
    plan = Symmetric().solve(problem)
    assert "no sequence of kernels repeats" in plan.attrs["symmetric"]["fallback"]
    assert "split" in plan.attrs["symmetric"]["fallback"]
    assert plan.value_s == pytest.approx(get_solver("split").solve(problem).value_s)


def test_blocks_that_fit_nowhere_are_refused_by_name():
    gpu = kind("node", {"B": 0}, memory={"B": 4.0})
    platform = servers((gpu, 2))
    graph = stacked(3, weight_bytes=3.0, head=False, tail=False)
    with pytest.raises(DivimlInputError, match="memory"):
        Symmetric().solve(Problem(graph, platform, costs_for(graph, platform, {"B": 1.0})))


def test_pipelines_are_refused_naming_the_solvers_that_do_them():
    platform = servers((kind("k", {"A": 0}), 2))
    graph = stacked(2)
    problem = Problem(graph, platform, costs_for(graph, platform, {"A": 1.0}), objective="pipeline", stages=2)
    with pytest.raises(DivimlInputError, match="slicegraph"):
        Symmetric().solve(problem)


def test_its_values_are_the_simulators_where_the_costs_charge_the_executor(caplog):
    """Measured costs make the simulator charge each segment call of the executor; the symmetric
    solver prices its plans through a cost model of its own, which must charge them too (it did not:
    its plans and their offers claimed less than the simulator then said)."""
    platform = servers((kind("node", {"A": 0, "B": 0}), 2))
    graph = stacked(4, "fork")
    plain = costs_for(graph, platform, {"A": 3.0, "B": 1.0})
    costs = TableCostModel(
        platform, plain.compute, executor_segments=True, executor_overheads=ExecutorOverheads(segment_s=0.5)
    )
    problem = Problem(graph, platform, costs, objective="throughput")
    watch = Incumbents(problem)
    with caplog.at_level(logging.WARNING, logger="tvm_diviml.solvers.base"):
        plan = get_solver("symmetric", time_limit_s=3).solve(problem, watch=watch)
    assert "claimed" not in caplog.text
    offered = [event.value_s for event in watch.trace if event.kind == "plan"]
    assert offered and offered[-1] == pytest.approx(simulate(problem, watch.best).value_s, rel=1e-12)
    assert simulate(Problem(graph, platform, plain, objective="throughput"), plan).value_s < plan.value_s


def test_the_same_problem_gives_the_same_plan():
    platform = servers((kind("node", {"A": 0, "B": 0}), 2))
    graph = stacked(3, "fork")  # the MILP improves its symmetric plan (with 4 blocks it spends 10 s proving it)
    problem = Problem(graph, platform, costs_for(graph, platform, {"A": 3.0, "B": 1.0}), objective="throughput")
    first, second = Symmetric(seed=3).solve(problem), Symmetric(seed=3).solve(problem)
    assert first.attrs["symmetric"]["improved_by_milp"] and first.assignment == second.assignment


# ---------------------------------------------------------------------- the zoo's transformers
@pytest.mark.parametrize(
    "spec, layers",
    [
        ("llama:layers=3", 3),
        ("gpt2:layers=3", 3),
        ("bert_base:layers=3", 3),
        ("vit_b16:layers=3", 3),
        ("llama:layers=2,step=decode,cache=8", 2),
    ],
)
def test_blocks_of_the_zoo_transformers_are_their_layers(spec, layers):
    from tvm_diviml.app.workload import load_workload
    from tvm_diviml.zoo import SMALL_OPTIONS

    name, _, given = spec.partition(":")
    options = {**SMALL_OPTIONS[name], **dict(kv.split("=") for kv in given.split(","))}
    workload = load_workload(name + ":" + ",".join(f"{k}={v}" for k, v in options.items()), "servers:2xcpu2")
    graph = workload.graph
    blocks, why = find_blocks(graph, workload.costs, workload.platform)
    assert blocks is not None, why
    assert len(blocks.blocks) == layers
    hashes = [[graph.kernels[k].attrs["primfunc_hash"] for k in block] for block in blocks.blocks]
    assert all(h == hashes[0] for h in hashes)
    assert len(blocks.head) + layers * blocks.block_size + len(blocks.tail) == len(graph.kernels)
    # the embedding opens the model and the classifier or LM head closes it: neither is in a block
    assert graph.topo_order[0] in blocks.head and graph.topo_order[-1] in blocks.tail
