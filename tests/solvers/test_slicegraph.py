"""SliceGraph (MTPP): the slicing DP against brute force and the simulator's ``stage_serial`` mode,
hand-priced heterogeneous stages, the BRKGA around it, the pipeline bounds, and input errors.

Links cost latency + bytes / bandwidth (``unit_platform``); A is the host CPU.
"""

import dataclasses
import itertools
import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.app.workload import load_workload
from tvm_diviml.bounds import lower_bound
from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import OpGraph
from tvm_diviml.platform import Link, Platform
from tvm_diviml.problem import Problem
from tvm_diviml.solvers import get_solver
from tvm_diviml.solvers.slicegraph import SliceGraph, order_by_keys, pipeline_plan, slice_order
from tvm_diviml.toolkit.deadline import Deadline

from ..bruteforce import best_pipeline
from ..helpers import examples, graph_of, hand_chain, pipeline, simulated, table, unit_platform
from ..strategies import DEVICES, dag_problems
from ..strategies import constrained_problems as memory_problems


def period(problem, order, devices, cuts):
    return simulated(problem, pipeline_plan(problem, order, devices, cuts)).value_s


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def kahn_by_priority(graph, priority):
    """The topological order that always takes the ready kernel of least priority."""
    order, placed = [], set()
    while len(order) < len(graph):
        ready = [k for k in graph.kernels if k not in placed and all(e.src in placed for e in graph.pred[k])]
        order.append(min(ready, key=lambda k: priority[k]))
        placed.add(order[-1])
    return order


def ordered_splits(graph, stages):
    """Every valid split into ``stages`` ordered, possibly empty stages, as (order, cuts)."""
    names = graph.topo_order
    for labels in itertools.product(range(stages), repeat=len(names)):
        stage = dict(zip(names, labels))
        if all(stage[e.src] <= stage[e.dst] for e in graph.edges):
            yield sorted(names, key=stage.get), [sum(1 for x in labels if x < b) for b in range(stages + 1)]


def best_split(problem, devices):
    return min(period(problem, order, devices, cuts) for order, cuts in ordered_splits(problem.graph, len(devices)))


@st.composite
def sliced_problems(draw, max_kernels):
    """A pipeline problem on the three-device unit platform and a sequence of distinct stage devices."""
    graph, platform, costs = draw(dag_problems(max_kernels=max_kernels))
    devices = list(draw(st.permutations(DEVICES)))[: draw(st.integers(1, len(DEVICES)))]
    return pipeline(graph, platform, costs, len(devices)), devices


# ---------------------------------------------------------------------- the DP over one order
def dp_against_every_cut(problem, devices, rng):
    """Slice a random topological order with the DP and check it against every way to cut it."""
    order = kahn_by_priority(problem.graph, {k: rng.random() for k in problem.graph.kernels})
    value, cuts = slice_order(problem, order, devices)
    n = len(order)
    brute = min(
        period(problem, order, devices, [0, *inner, n])
        for inner in itertools.combinations_with_replacement(range(n + 1), len(devices) - 1)
    )
    assert close(value, brute)
    return order, value, cuts


@settings(max_examples=examples(60), deadline=None)
@given(sliced_problems(max_kernels=7), st.randoms(use_true_random=False))
def test_dp_is_the_best_slicing_of_one_order(case, rng):
    problem, devices = case
    order, value, cuts = dp_against_every_cut(problem, devices, rng)
    n = len(order)
    assert cuts[0] == 0 and cuts[-1] == n and cuts == sorted(cuts)
    assert close(period(problem, order, devices, cuts), value)


@settings(max_examples=examples(25), deadline=None)
@given(sliced_problems(max_kernels=5))
def test_dp_over_all_orders_reaches_the_best_ordered_split(case):
    problem, devices = case
    orders = nx.all_topological_sorts(problem.graph.to_networkx())
    best_over_orders = min(slice_order(problem, list(order), devices)[0] for order in orders)
    assert close(best_over_orders, best_split(problem, devices))


def test_heterogeneous_stages_are_priced_on_their_own_devices():
    problem = hand_chain()
    # B then C: [a] on B = 2 + input 2 + a out 3 = 7; [b, c] on C = 1 + 2 + a in 3 + output 2 = 8.
    # The other cuts: [] | [a, b, c] = 13 + 2 + 2 = 17; [a, b] | [c] = max(7 + 2 + 3, 2 + 3 + 2) = 12; all on B 15.
    assert slice_order(problem, ["a", "b", "c"], ["B", "C"]) == (8.0, [0, 1, 3])
    # C then B: 15, from [] | all on B (11 + 2 + 2) or [a] on C (10 + 2 + 3) | [b, c] on B (9 + 3 + 2 = 14).
    assert slice_order(problem, ["a", "b", "c"], ["C", "B"])[0] == 15.0
    # One stage on the host pays no input or output transfer: all on A = 300.
    assert slice_order(problem, ["a", "b", "c"], ["A"]) == (300.0, [0, 3])


def test_a_tensor_leaves_once_at_its_largest_edge_and_enters_each_stage_once():
    platform = unit_platform(latency=0.0)
    graph = graph_of([("a", "b", 2), ("a", "c", 4), ("b", "c", 1)])
    costs = table(platform, {"a": 1, "b": 1, "c": 1})
    problem = pipeline(graph, platform, costs, 3)
    # Stages [a] | [b] | [c] on B, C, A: a leaves once (4 s), b gets 2, b sends 1, c gets a (4) and b (1).
    plan = pipeline_plan(problem, ["a", "b", "c"], ["B", "C", "A"], [0, 1, 2, 3])
    assert simulated(problem, plan).stage_cost_s == [5.0, 4.0, 6.0]
    assert slice_order(problem, ["a", "b", "c"], ["B", "C", "A"])[0] == 3.0  # everything in one stage


def test_links_that_differ_are_priced_at_the_dearest_so_the_dp_never_understates():
    platform = unit_platform()
    links = dict(platform.links)
    links[("B", "C")] = Link("B", "C", 0.0, 10.0)  # one cheap link among dear ones
    cheap = Platform("uneven", platform.devices, links)
    graph = graph_of([("a", "b", 2), ("b", "c", 2)], inputs=[("x", 1, ["a"])])
    costs = TableCostModel(
        cheap, {"a": {"A": 1, "B": 5, "C": 5}, "b": {"A": 9, "B": 1, "C": 9}, "c": {"A": 9, "B": 9, "C": 1}}
    )
    problem = pipeline(graph, cheap, costs, 3)
    for devices in itertools.permutations(DEVICES):
        value, cuts = slice_order(problem, ["a", "b", "c"], list(devices))
        assert period(problem, ["a", "b", "c"], list(devices), cuts) <= value + 1e-12
    # Stages on B then C send tensors over the cheap B -> C only, but the DP prices the dear C -> B:
    # [a, b] | [c] is 6 + input 2 + b out 3 = 11 to the DP, 6 + 2 + 0.2 = 8.2 to the simulator.
    value, cuts = slice_order(problem, ["a", "b", "c"], ["B", "C"])
    assert (value, cuts) == (11.0, [0, 2, 3])
    assert close(period(problem, ["a", "b", "c"], ["B", "C"], cuts), 8.2)


@st.composite
def constrained_problems(draw):
    """Sliced problems whose kernels may be barred from devices and tied into co-location groups."""
    problem, devices = draw(sliced_problems(max_kernels=6))
    graph = problem.graph
    kernels = [
        dataclasses.replace(
            k,
            allowed_devices=draw(st.sampled_from([None, ("A",), ("B", "C"), ("A", "C")])),
            colocate=draw(st.sampled_from([None, None, "g", "h"])),
        )
        for k in graph.kernels.values()
    ]
    graph = OpGraph(kernels, graph.edges, inputs=graph.inputs)
    return pipeline(graph, problem.platform, problem.costs, problem.stages), devices


@settings(max_examples=examples(60), deadline=None)
@given(constrained_problems())
def test_dp_keeps_kernels_on_allowed_devices_and_groups_together(case):
    problem, devices = case
    order = list(problem.graph.topo_order)
    n = len(order)
    feasible = []
    for inner in itertools.combinations_with_replacement(range(n + 1), len(devices) - 1):
        sim = simulated(problem, pipeline_plan(problem, order, devices, [0, *inner, n]))
        if sim.feasible:
            feasible.append(sim.value_s)
    value, cuts = slice_order(problem, order, devices)
    if not feasible:
        assert value == math.inf
        return
    assert close(value, min(feasible))
    assert simulated(problem, pipeline_plan(problem, order, devices, cuts)).feasible


def test_a_stage_holds_no_more_weights_than_its_device():
    platform = unit_platform(latency=0.0, memory=10)
    graph = graph_of(
        [("a", "b", 0), ("b", "c", 0)],
        weights={"wa": 4, "wb": 4, "wc": 4},
        kernel_weights={"a": ["wa"], "b": ["wb"], "c": ["wc"]},
    )
    costs = table(platform, {"a": 1, "b": 1, "c": 1})
    problem = pipeline(graph, platform, costs, 2)
    # Free transfers: one stage (3 s) would be best, but 12 bytes of weights exceed 10.
    value, cuts = slice_order(problem, ["a", "b", "c"], ["B", "C"])
    assert value == 2.0 and cuts in ([0, 1, 3], [0, 2, 3])
    assert simulated(problem, pipeline_plan(problem, ["a", "b", "c"], ["B", "C"], cuts)).feasible
    assert slice_order(problem, ["a", "b", "c"], ["B"])[0] == math.inf


# ---------------------------------------------------------------------- the solver
def activation_heavy_chain(stages):
    """a -> b -> c, 4 bytes of weights each and 3 of output, every device 10 bytes: two kernels
    fit by their weights (8) but not with their activations (8 + 6), so each stage holds one."""
    platform = unit_platform(latency=0.0, memory=10)
    graph = graph_of(
        [("a", "b", 0), ("b", "c", 0)],
        weights={"wa": 4, "wb": 4, "wc": 4},
        kernel_weights={"a": ["wa"], "b": ["wb"], "c": ["wc"]},
        output_bytes={"a": 3, "b": 3, "c": 3},
    )
    times = {k: {"A": 5.0, "B": 1.0, "C": 1.0} for k in "abc"}
    return pipeline(graph, platform, table(platform, times), stages)


@pytest.mark.parametrize("solver", ["slicegraph", "milp"])
def test_pipeline_plans_leave_room_for_activations(solver):
    problem = activation_heavy_chain(3)
    # by weights alone, [a, b] on B and [c] on C (period 2) would be best; with activations it overflows B
    plan = get_solver(solver, time_limit_s=10).solve(problem)
    sim = simulated(problem, plan)
    assert sim.feasible, sim.problems
    assert plan.value_s == sim.value_s == 5.0 and sorted(map(len, plan.stages)) == [1, 1, 1]


def test_no_slicing_that_fits_with_activations_is_said_so():
    problem = activation_heavy_chain(2)
    assert best_pipeline(problem) == math.inf
    with pytest.raises(DivimlInputError, match="no slicing into at most 2 stages whose every stage fits"):
        SliceGraph(time_limit_s=5).solve(problem)


@settings(max_examples=examples(40), deadline=None)
@given(memory_problems(max_kernels=5), st.integers(1, 3), st.sampled_from(["slicegraph", "downsets"]))
def test_pipeline_solvers_find_a_slicing_that_fits_whenever_one_exists(case, stages, solver):
    """Memory with activations, allowed devices, infinite costs and co-location against the brute
    force: a plan that fits whenever one does (never below the optimum), a clear refusal otherwise."""
    problem = pipeline(*case, stages)
    optimum = best_pipeline(problem)
    if optimum == math.inf:
        with pytest.raises(DivimlInputError):  # validation or the solver: one line either way
            get_solver(solver, time_limit_s=2, seed=0).solve(problem)
        return
    plan = get_solver(solver, time_limit_s=2, seed=0).solve(problem)
    sim = simulated(problem, plan)
    assert sim.feasible, sim.problems
    assert plan.value_s == sim.value_s >= optimum * (1 - 1e-9)
    assert plan.lower_bound_s is None or plan.lower_bound_s <= optimum * (1 + 1e-9)


def test_a_pipeline_that_fits_only_with_the_gpus_nearly_idle_is_found():
    """14 random kernels, both GPUs of paper-node given 45% of the memory the
    model needs on one device, 3 stages. Slicing used to call it infeasible (a device whose activation
    reserve passed its memory could not even take an empty stage)."""
    from tvm_diviml.cost.roofline import RooflineCostModel
    from tvm_diviml.presets import load_platform
    from tvm_diviml.synthetic import random_dag

    graph = random_dag(kernels=14, seed=9)
    whole = graph.weight_bytes(graph.kernels) + sum(k.output_bytes for k in graph.kernels.values())
    spec = load_platform("paper-node").to_json()
    for device in spec["devices"][1:]:  # the GPUs; the CPU keeps its 192 GiB
        device["memory_bytes"] = 0.45 * whole
    platform = Platform.from_json(spec)
    problem = pipeline(graph, platform, RooflineCostModel(graph, platform), 3)
    for solver in ("downsets", "slicegraph"):
        plan = get_solver(solver, time_limit_s=10, seed=0).solve(problem)
        assert simulated(problem, plan).feasible


def test_slicegraph_finds_the_device_order_no_seed_has():
    # C is the fastest device overall, so the seeds put C first; the best pipeline runs a on B, then b, c on C:
    # [a] on B = 2 + input 2 + out 3 = 7; [b, c] on C = 2 + in 3 + output 2 = 7. C first is at best 15.
    problem = hand_chain(c_on_b=8.0, c_on_c=1.0)
    plan = SliceGraph(population=20, generations=10, seed=0).solve(problem)
    assert (plan.value_s, plan.stages, plan.stage_devices) == (7.0, [["a"], ["b", "c"]], ["B", "C"])
    assert plan.assignment == {"a": "B", "b": "C", "c": "C"}


def test_the_first_population_holds_the_program_order_on_the_fastest_devices():
    # B (11 s of work) is faster than C (13 s), so one seed slices a, b, c over B then C: 8 (hand-priced above).
    problem = hand_chain()
    plan = SliceGraph(population=9, generations=0).solve(problem)
    assert (plan.value_s, plan.stage_devices, plan.attrs["generations"]) == (8.0, ["B", "C"], 0)


def test_a_deadline_passed_stops_the_first_population_after_one_decode():
    """On 10,000 kernels one decode takes seconds: the 48 of the first population took 170 s of a
    60 s limit. With the deadline already passed, one chromosome (the program order) is decoded."""
    problem = hand_chain()
    plan = SliceGraph(population=9).solve(problem, deadline=Deadline.after(0.0))
    assert (plan.attrs["decodes"], plan.attrs["stopped"], plan.value_s) == (1, "time_limit", 8.0)
    assert plan.value_s == simulated(problem, plan).value_s


@settings(max_examples=examples(30), deadline=None)
@given(sliced_problems(max_kernels=5), st.integers(0, 3))
def test_slicegraph_claims_the_simulated_value_and_repeats_itself(case, seed):
    problem, _ = case
    first = SliceGraph(population=8, generations=4, seed=seed).solve(problem)
    again = SliceGraph(population=8, generations=4, seed=seed).solve(problem)
    assert (first.stages, first.stage_devices, first.value_s) == (again.stages, again.stage_devices, again.value_s)
    sim = simulated(problem, first)
    assert first.mode == "stage_serial" and first.value_s == sim.value_s and sim.feasible
    assert len(first.stages) <= problem.stages and len(set(first.stage_devices)) == len(first.stage_devices)
    assert first.value_s >= lower_bound(problem) * (1 - 1e-12)


@settings(max_examples=examples(60), deadline=None)
@given(sliced_problems(max_kernels=7), st.randoms(use_true_random=False), st.floats(0.2, 1.5), st.integers(1, 4))
def test_a_slicing_priced_up_to_a_period_is_exact_up_to_it_and_a_slicing_past_it(case, rng, share, rows):
    """``upper`` leaves out stages of more work; the DP taken a few segment ends at a time (``rows``)
    finds the same slicing as in one block."""
    import tvm_diviml.toolkit.stage_costs as stage_costs

    problem, devices = case
    costs = stage_costs.StageCosts(problem)
    names = kahn_by_priority(problem.graph, {k: rng.random() for k in problem.graph.kernels})
    order = np.array([costs.names.index(k) for k in names], dtype=np.int64)
    value, cuts, exact = costs.slice(order, devices)
    upper = share * value if math.isfinite(value) else share
    banded, banded_cuts, _ = costs.slice(order, devices, upper)
    assert banded >= value * (1 - 1e-12)
    if value <= upper or banded <= upper:
        assert close(banded, value)
    if math.isfinite(banded) and exact:
        assert close(banded, period(problem, names, devices, banded_cuts))
    stage_costs.DP_ROWS, default = rows, stage_costs.DP_ROWS
    try:
        again, again_banded = costs.slice(order, devices), costs.slice(order, devices, upper)
        assert again[0] == value and again_banded[0] == banded  # the cuts of an infeasible order mean nothing
        assert math.isinf(value) or again[1] == cuts
        assert math.isinf(banded) or again_banded[1] == banded_cuts
    finally:
        stage_costs.DP_ROWS = default


@settings(max_examples=examples(25), deadline=None)
@given(sliced_problems(max_kernels=5))
def test_pipeline_bounds_lie_below_the_optimum(case):
    problem, _ = case
    optimum = min(best_split(problem, list(devices)) for devices in itertools.permutations(DEVICES, problem.stages))
    assert lower_bound(problem) <= optimum * (1 + 1e-12)


def test_slicegraph_on_a_generated_model_uses_every_gpu_it_may():
    workload = load_workload("random:kernels=40,seed=3", "gpu4", "roofline")
    problem = pipeline(workload.graph, workload.platform, workload.costs, 3)
    plan = get_solver("slicegraph", seed=1, time_limit_s=30).solve(problem)
    assert plan.value_s == simulated(problem, plan).value_s
    assert plan.value_s <= period(problem, list(problem.graph.topo_order), ["gpu0"], [0, 40])  # one GPU
    assert len(plan.stages) == 3 and plan.attrs["dp_exact"]
    assert math.isclose(plan.attrs["dp_value_s"], plan.value_s, rel_tol=1e-9)


# ---------------------------------------------------------------------- errors
def test_slicegraph_refuses_other_objectives_and_too_many_stages():
    problem = hand_chain()
    with pytest.raises(DivimlInputError, match="pipeline"):
        SliceGraph().solve(Problem(problem.graph, problem.platform, problem.costs, objective="latency"))
    with pytest.raises(DivimlInputError, match="4 stages need 4 devices") as error:
        SliceGraph().solve(pipeline(problem.graph, problem.platform, problem.costs, 4))
    assert error.value.field == "stages"


@pytest.mark.parametrize(
    "order, devices, message",
    [
        (["b", "a", "c"], ["B"], "before its input"),
        (["a", "b"], ["B"], "every kernel"),
        (["a", "b", "z"], ["B"], "unknown kernel 'z'"),
        (["a", "b", "c"], ["B", "B"], "repeat"),
        (["a", "b", "c"], ["Q"], "unknown device 'Q'"),
        (["a", "b", "c"], [], "at least one"),
    ],
)
def test_slice_order_rejects_bad_orders_and_devices(order, devices, message):
    with pytest.raises(DivimlInputError, match=message):
        slice_order(hand_chain(), order, devices)


@pytest.mark.parametrize(
    "options, field",
    [
        ({"population": 2}, "population"),
        ({"elite_fraction": 0.6, "mutant_fraction": 0.4}, "elite_fraction"),
        ({"inheritance_bias": 0.3}, "inheritance_bias"),
        ({"generations": -1}, "generations"),
    ],
)
def test_slicegraph_rejects_bad_options(options, field):
    with pytest.raises(DivimlInputError) as error:
        SliceGraph(**options)
    assert error.value.field == field


# ---------------------------------------------------------------------- host_staged (msr-fiddle max load)
@st.composite
def host_staged_problems(draw, max_kernels):
    """Throughput on a host_staged platform (A the host CPU pays nothing; B and C pay their copies)
    and a sequence of distinct devices for the sets."""
    graph, platform, costs = draw(dag_problems(max_kernels=max_kernels, transfer_model="host_staged"))
    devices = list(draw(st.permutations(DEVICES)))[: draw(st.integers(1, len(DEVICES)))]
    return Problem(graph, platform, costs, objective="throughput"), devices


@settings(max_examples=examples(60), deadline=None)
@given(host_staged_problems(max_kernels=7), st.randoms(use_true_random=False))
def test_host_staged_dp_is_the_best_slicing_of_one_order(case, rng):
    """Each stage priced as host_staged charges it: the DP's value is the simulated one, and the best."""
    problem, devices = case
    order, value, cuts = dp_against_every_cut(problem, devices, rng)
    plan = pipeline_plan(problem, order, devices, cuts)
    assert plan.mode == "host_staged" and plan.objective == "throughput"
    assert close(simulated(problem, plan).value_s, value)


@settings(max_examples=examples(15), deadline=None)
@given(host_staged_problems(max_kernels=6), st.integers(0, 3))
def test_slicegraph_host_staged_claim_is_the_simulated_value(case, seed):
    problem, _ = case
    plan = SliceGraph(seed=seed, population=8, generations=3).solve(problem)
    assert plan.mode == "host_staged" and plan.value_s == simulated(problem, plan).value_s
    assert plan.attrs["dp_exact"] and close(plan.attrs["dp_value_s"], plan.value_s)
    assert len(plan.stages) <= len(problem.platform.devices)


def test_slicegraph_refuses_period_overlap_throughput_and_points_to_its_solvers():
    problem = hand_chain()
    with pytest.raises(DivimlInputError, match="host_staged") as error:
        SliceGraph().solve(Problem(problem.graph, problem.platform, problem.costs, objective="throughput"))
    assert all(name in error.value.hint for name in ("milp", "split", "greedy", "replicas"))


@settings(max_examples=examples(60), deadline=None)
@given(
    st.integers(1, 9).flatmap(
        lambda n: st.tuples(
            st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2 * n),
            st.lists(st.integers(0, 3), min_size=n, max_size=n),
            st.lists(st.floats(0, 1, exclude_max=True), min_size=n, max_size=n),
        )
    )
)
def test_group_aware_decode_gives_a_topological_order(case):
    pairs, labels, keys = case
    n = len(labels)
    successors = [[] for _ in range(n)]
    indegree = [0] * n
    for a, b in pairs:
        if a < b:
            successors[a].append(b)
            indegree[b] += 1
    groups = [[v for v in range(n) if labels[v] == label] for label in set(labels)]
    order = order_by_keys(successors, indegree, keys, groups)
    assert sorted(order) == list(range(n))
    position = {v: i for i, v in enumerate(order)}
    assert all(position[a] < position[b] for a in range(n) for b in successors[a])


def test_group_aware_decode_keeps_weights_beside_their_operator():
    """Weights w1, w2 (no inputs) belong to op 3's group; a long chain 0 -> 4 -> 5 -> 3 runs beside them.
    By keys alone the weights would come first, and no cut could fall between them and 3."""
    successors = [[4], [3], [3], [], [5], [3]]  # 0 -> 4 -> 5 -> 3, 1 -> 3, 2 -> 3
    indegree = [0, 0, 0, 3, 1, 1]
    keys = [0.5, 0.1, 0.2, 0.9, 0.6, 0.7]
    assert order_by_keys(successors, indegree, keys) == [1, 2, 0, 4, 5, 3]
    assert order_by_keys(successors, indegree, keys, [[1, 2, 3]]) == [0, 4, 5, 1, 2, 3]
    # once 1 is placed, its group-mate 3 goes before 2, whose key is smaller
    assert order_by_keys([[1, 2, 3], [], [], []], [0, 1, 1, 1], [0.0, 0.1, 0.2, 0.9], [[1, 3]]) == [0, 1, 3, 2]
    assert order_by_keys([[1, 2, 3], [], [], []], [0, 1, 1, 1], [0.0, 0.1, 0.2, 0.9]) == [0, 1, 2, 3]
