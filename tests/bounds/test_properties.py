"""Properties of the simulator and the bounds on random DAGs (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.bounds import lower_bounds
from tvm_diviml.plan import Plan
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem

from ..helpers import examples
from ..strategies import DEVICES, assignments, dag_problems


def critical_path_at_fastest(graph, costs):
    finish = {}
    for kernel in graph.topo_order:
        fastest = min(costs.compute_s(kernel, d) for d in DEVICES)
        finish[kernel] = max((finish[e.src] for e in graph.pred[kernel]), default=0.0) + fastest
    return max(finish.values())


@settings(max_examples=examples(150), deadline=None)
@given(data=st.data(), contention=st.booleans())
def test_latency_between_critical_path_and_total_work(data, contention):
    graph, platform, costs = data.draw(dag_problems())
    assignment = data.draw(assignments(graph))
    sim = simulate(Problem(graph, platform, costs), Plan(assignment), link_contention=contention)
    work = sum(costs.compute_s(k, d) for k, d in assignment.items())
    moved = sum(t.end_s - t.start_s for t in sim.transfers)
    assert critical_path_at_fastest(graph, costs) - 1e-9 <= sim.value_s <= work + moved + 1e-9
    for edge in graph.edges:  # dependencies honoured
        assert sim.start_s[edge.dst] >= sim.finish_s[edge.src] - 1e-9
    for device in DEVICES:  # one kernel at a time per device
        spans = sorted((sim.start_s[k], sim.finish_s[k]) for k, d in assignment.items() if d == device)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))


@settings(max_examples=examples(100), deadline=None)
@given(data=st.data())
def test_contention_never_makes_latency_shorter(data):
    graph, platform, costs = data.draw(dag_problems())
    plan = Plan(data.draw(assignments(graph)))
    free = simulate(Problem(graph, platform, costs), plan).value_s
    assert simulate(Problem(graph, platform, costs), plan, link_contention=True).value_s >= free - 1e-9


def _random_stage_plan(data, graph):
    order = graph.topo_order
    stages = data.draw(st.integers(1, min(len(DEVICES), len(order))))
    cuts = (
        sorted(
            data.draw(st.lists(st.integers(1, len(order) - 1), min_size=stages - 1, max_size=stages - 1, unique=True))
        )
        if len(order) > 1
        else []
    )
    bounds = [0, *cuts, len(order)]
    slices = [order[a:b] for a, b in zip(bounds, bounds[1:])]
    devices = data.draw(st.permutations(DEVICES))[: len(slices)]
    assignment = {k: devices[i] for i, s in enumerate(slices) for k in s}
    return Plan(assignment, objective="pipeline", mode="stage_serial", stages=slices, stage_devices=list(devices))


@settings(max_examples=examples(150), deadline=None)
@given(data=st.data(), objective=st.sampled_from(["latency", "throughput", "pipeline", "host_staged"]))
def test_every_lower_bound_is_below_every_plan(data, objective):
    transfer_model = "host_staged" if objective == "host_staged" else "direct"
    objective = "throughput" if objective == "host_staged" else objective
    graph, platform, costs = data.draw(dag_problems(transfer_model=transfer_model))
    problem = Problem(graph, platform, costs, objective=objective, stages=len(DEVICES))
    if objective == "pipeline":
        plan = _random_stage_plan(data, graph)
    else:
        plan = Plan(data.draw(assignments(graph)), objective=objective, mode=problem.mode)
    value = simulate(Problem(graph, platform, costs), plan).value_s
    for name, bound in lower_bounds(problem).items():
        assert bound <= value + 1e-9, name
