"""The brute-force latency oracle: hand-computed optima, and an unpruned enumeration on small graphs.

Links cost 1 s + 1 s per byte (``unit_platform``); A is the host.
"""

import itertools

import networkx as nx
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.graph import Kernel, OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.problem import Problem
from tvm_diviml.simulator import simulate

from ..bruteforce import best_latency
from ..helpers import examples, graph_of, table, unit_platform
from ..strategies import DEVICES, assignments, dag_problems


def test_order_on_a_device_matters():
    # b and a share A; c (B only) waits for a's tensor: 1 + 1 byte. Running b first gives
    # b 0-5, a 5-6, c 8-13; running a first gives a 0-1, b 1-6, c 3-8.
    platform = unit_platform()
    graph = graph_of([("a", "c", 1)], kernels=["b", "a", "c"])
    costs = table(platform, {"b": {"A": 5}, "a": {"A": 1}, "c": {"B": 5}})
    value, plan = best_latency(graph, platform, costs)
    assert value == 8 and plan.value_s == 8
    assert plan.order["A"] == ["a", "b"]
    assert simulate(Problem(graph, platform, costs), Plan(plan.assignment)).value_s == 13  # graph order: b first


def test_a_tensor_crosses_once_with_its_largest_edge():
    # s (A only) feeds x with 1 byte and y (B only) with 3. x on A: s 0-1, x 1-10 -> 10. x on B: the
    # tensor crosses once with 3 bytes, arriving at 1 + 1 + 3 = 5 for both: y 5-7, x 7-8 -> 8
    # (charging x its own edge alone would claim x 3-4 and 7).
    platform = unit_platform()
    graph = graph_of([("s", "x", 1), ("s", "y", 3)])
    costs = table(platform, {"s": {"A": 1}, "x": {"A": 9, "B": 1}, "y": {"B": 2}})
    value, plan = best_latency(graph, platform, costs)
    assert value == 8
    assert plan.assignment == {"s": "A", "x": "B", "y": "B"}


def test_inputs_leave_and_outputs_return_to_the_host():
    # One kernel reading a 3-byte input and returning 2 bytes. A: 9. B: input at 1 + 3 = 4, runs
    # 4-5, result home at 5 + 1 + 2 = 8. C: 4-6, home at 9.
    platform = unit_platform()
    graph = graph_of([], kernels=["s"], inputs=[("in", 3, ["s"])], output_bytes={"s": 2})
    costs = table(platform, {"s": {"A": 9, "B": 1, "C": 2}})
    value, plan = best_latency(graph, platform, costs)
    assert (value, plan.assignment) == (8, {"s": "B"})


def test_allowed_devices_and_colocation_are_kept():
    # Three independent 4 s kernels would finish at 4 on three devices; p and q must share one
    # device (8), r may run only on C.
    platform = unit_platform()
    graph = OpGraph([Kernel("p", colocate="g"), Kernel("q", colocate="g"), Kernel("r", allowed_devices=("C",))], [])
    costs = table(platform, {"p": 4, "q": 4, "r": {"A": 1, "B": 1, "C": 4}})
    value, plan = best_latency(graph, platform, costs)
    assert value == 8
    assert plan.assignment["p"] == plan.assignment["q"] and plan.assignment["r"] == "C"


def every_plan_latency(graph, platform, costs) -> float:
    """No pruning: every assignment with every global topological order, each simulated."""
    orders = list(nx.all_topological_sorts(graph.to_networkx()))
    best = float("inf")
    for devices in itertools.product(DEVICES, repeat=len(graph)):
        assignment = dict(zip(graph.kernels, devices))
        seen = set()
        for order in orders:
            per_device = tuple(tuple(k for k in order if assignment[k] == d) for d in DEVICES)
            if per_device not in seen:
                seen.add(per_device)
                plan = Plan(assignment, order={d: list(ks) for d, ks in zip(DEVICES, per_device) if ks})
                best = min(best, simulate(Problem(graph, platform, costs), plan).value_s)
    return best


@settings(max_examples=examples(30), deadline=None)
@given(dag_problems(max_kernels=5))
def test_pruned_search_equals_every_plan(problem):
    graph, platform, costs = problem
    value, plan = best_latency(graph, platform, costs)
    assert value == every_plan_latency(graph, platform, costs)
    assert simulate(Problem(graph, platform, costs), plan).value_s == value


@settings(max_examples=examples(20), deadline=None)
@given(data=st.data())
def test_no_plan_beats_the_oracle(data):
    graph, platform, costs = data.draw(dag_problems(max_kernels=7))
    value, plan = best_latency(graph, platform, costs)
    assert simulate(Problem(graph, platform, costs), plan).value_s == value
    other = Plan(data.draw(assignments(graph)))
    assert simulate(Problem(graph, platform, costs), other).value_s >= value
