"""The downset DP against brute force: msr-fiddle max-load (mode host_staged) over every ordered split
into contiguous sets, and stage_serial pipelines over every ordered split and choice of stage devices
(test_mtpp's brute force); hand-priced optima, the fallback past the ideal cap, and refusals.

Brute force: every assignment of kernels to devices they may run on, kept when the device graph is
acyclic (exactly the splits whose sets can be ordered with every edge running forward, i.e. ordered
contiguous sets) and the simulator finds it feasible (memory, co-location); the least simulated value.
"""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import Edge, OpGraph
from tvm_diviml.msr_fiddle import read_msr_fiddle
from tvm_diviml.plan import Plan
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, get_solver
from tvm_diviml.toolkit.deadline import Deadline
from tvm_diviml.toolkit.downsets import (
    NO_DEADLINE,
    MaxLoadInstance,
    TooManyIdeals,
    downset_plan,
    enumerate_ideals,
    widest_level,
)
from tvm_diviml.toolkit.pipeline_polish import polish_pipeline, recut_along_orders

from ..bruteforce import best_pipeline
from ..helpers import examples, hand_file, stage_choice_chain
from ..strategies import constrained_pipeline_problems, dag_problems, pipeline_problems


def throughput(graph, platform, costs):
    return Problem(graph, platform, costs, objective="throughput")


def brute_force(problem):
    """The least simulated max load over ordered contiguous splits (inf when none is feasible)."""
    graph = problem.graph
    names = list(graph.kernels)
    best = math.inf
    for devices in itertools.product(*(problem.feasible_devices(k) for k in names)):
        plan = Plan(dict(zip(names, devices)), objective="throughput", mode="host_staged")
        sim = simulate(Problem(graph, problem.platform, problem.costs), plan)
        if sim.feasible and sim.device_graph_acyclic:
            best = min(best, sim.value_s)
    return best


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


@st.composite
def msr_files(draw, max_nodes=6):
    """Small msr-fiddle files: random DAG, one cost per producer, sizes against a memory cap,
    colour classes, nodes the accelerators cannot run, 1-2 accelerators and 0-1 CPUs."""
    n = draw(st.integers(1, max_nodes))
    ids = list(range(1, n + 1))
    cost = {i: draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0])) for i in ids}
    edges = [{"sourceId": i, "destId": j, "cost": cost[i]} for j in ids for i in range(1, j) if draw(st.booleans())]
    cpus = draw(st.integers(0, 1))
    colours = draw(st.lists(st.integers(0, n + 2), min_size=n, max_size=n))
    nodes = [
        {
            "id": i,
            "cpuLatency": float(draw(st.integers(1, 12))),
            "fpgaLatency": float(draw(st.integers(1, 6))),
            "supportedOnFpga": 1 if not cpus else int(draw(st.integers(0, 4)) > 0),
            "size": float(draw(st.integers(0, 4))),
            "colorClass": colours[i - 1],
        }
        for i in ids
    ]
    return {
        "maxFPGAs": draw(st.integers(1, 2)),
        "maxCPUs": cpus,
        "maxSizePerFPGA": float(draw(st.integers(2, 12))),
        "nodes": nodes,
        "edges": edges,
    }


@settings(max_examples=examples(60), deadline=None)
@given(msr_files())
def test_dp_equals_brute_force_on_msr_files(data):
    problem = throughput(*read_msr_fiddle(data))
    best = brute_force(problem)
    solver = get_solver("downsets")
    try:
        problem.validate()
    except DivimlInputError:
        return  # a kernel or group fits nowhere: validate says which
    if math.isinf(best):
        with pytest.raises(DivimlInputError, match="no ordered split"):
            solver.solve(problem)
        return
    plan = solver.solve(problem)
    sim = simulate(problem, plan)
    assert sim.feasible and sim.device_graph_acyclic
    assert plan.value_s == sim.value_s and close(plan.attrs["dp_value_s"], sim.value_s)
    assert close(plan.value_s, best) and plan.optimal
    assert plan.method == "downset DP"
    assert [k for stage in plan.stages for k in stage] and len(plan.stages) == len(plan.stage_devices)
    assert all(plan.assignment[k] == d for stage, d in zip(plan.stages, plan.stage_devices) for k in stage)
    # A bound at the optimum itself skips only sets that cannot be in an optimal split.
    assert close(MaxLoadInstance.of(problem, 10_000).dp(bound_s=best).value_s, best)


@st.composite
def staged_problems(draw):
    """A host-staged platform (A the host CPU; B and C priced differently) with model inputs and
    outputs; each producer's edges carry one size, as in the msr-fiddle files."""
    graph, platform, costs = draw(dag_problems(max_kernels=5, transfer_model="host_staged"))
    size = {k: draw(st.integers(0, 4)) for k in graph.kernels}
    graph = OpGraph(
        graph.kernels.values(),
        [Edge(e.src, e.dst, size[e.src]) for e in graph.edges],
        inputs=graph.inputs,
        outputs=graph.outputs,
    )
    return throughput(graph, platform, costs)


@settings(max_examples=examples(40), deadline=None)
@given(staged_problems())
def test_dp_equals_brute_force_with_model_inputs_outputs_and_unlike_devices(problem):
    plan = get_solver("downsets").solve(problem)
    assert plan.value_s == simulate(problem, plan).value_s
    assert close(plan.value_s, brute_force(problem)) and plan.optimal


def test_hand_made_file_optimum():
    """hand_file: 1 -> 2 -> 3 -> 4, 1 -> 3; accelerator 1..4 ms, CPU 10 ms; 3 and 4 share a colour; 30 bytes
    each, 100 per accelerator. Colour-closed ideals: {}, {1}, {1,2}, all; {3,4} must be one set:
    - on an accelerator it costs 3 + 4 + 0.5 (1 enters) + 0.25 (2 enters) = 7.75 ms at best ({2,3,4}: 9.5,
      all four: 120 bytes > 100), on the CPU 20 ms;
    - then {1,2} on the other accelerator: 1 + 2 + 0.5 + 0.25 (both leave) = 3.75 ms.
    So the optimum is 7.75 ms."""
    problem = throughput(*read_msr_fiddle(hand_file()))
    plan = get_solver("downsets").solve(problem)
    assert plan.value_s == pytest.approx(7.75e-3) and plan.optimal
    assert [sorted(stage) for stage in plan.stages] == [["1", "2"], ["3", "4"]]
    assert plan.attrs["ideals"] == 4


def test_ideals_are_closed_under_colour_groups():
    # a -> c, b -> c, a and b grouped: ideals {}, {a, b}, {a, b, c}
    assert sorted(enumerate_ideals([[], [], [0, 1]], [[2], [2], []], [[0, 1]], 10)) == [0, 0b011, 0b111]
    # a diamond 0 -> 1, 0 -> 2, 1 -> 3, 2 -> 3 has 6 ideals
    assert len(enumerate_ideals([[], [0], [0], [1, 2]], [[1, 2], [3], [3], []], [], 10)) == 6


def test_a_level_with_more_subsets_than_the_cap_is_refused_at_once():
    # a source, then 4 kernels that each read it only: 2^4 subsets of that level, 17 ideals in all
    predecessors, successors = [[], [0], [0], [0], [0]], [[1, 2, 3, 4], [], [], [], []]
    assert len(enumerate_ideals(predecessors, successors, [], 17)) == 17
    with pytest.raises(TooManyIdeals, match=r"more than 15 ideals \(4 kernels with no path between any two\)"):
        enumerate_ideals(predecessors, successors, [], 15)


def test_no_more_ideals_are_enumerated_than_their_arrays_fit(monkeypatch):
    from tvm_diviml.toolkit import downsets

    # the star of 5 kernels has 17 ideals; with one tensor and no input, 2 x 5 + 6 x 2 = 22 bytes each
    predecessors, successors, tensors = [[], [0], [0], [0], [0]], [[1, 2, 3, 4], [], [], [], []], [(0, [1, 2, 3, 4])]
    monkeypatch.setattr(downsets, "IDEAL_BYTES", 22 * 17)
    assert len(downsets.build_ideals(predecessors, successors, [], tensors, [], 100)) == 17
    monkeypatch.setattr(downsets, "IDEAL_BYTES", 22 * 16)
    with pytest.raises(TooManyIdeals, match=r"more than 16 ideals: the most whose arrays fit in .* GiB \(5 kernels\)"):
        downsets.build_ideals(predecessors, successors, [], tensors, [], 100)


@settings(max_examples=examples(40), deadline=None)
@given(
    st.integers(1, 9).flatmap(
        lambda n: st.tuples(st.just(n), st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))))
    )
)
def test_the_widest_level_never_refuses_a_graph_within_the_cap(case):
    """Against the enumeration itself: 2 ** widest_level never exceeds the ideals counted."""
    n, pairs = case
    edges = {(min(a, b), max(a, b)) for a, b in pairs if a != b}
    predecessors = [[u for u, w in edges if w == v] for v in range(n)]
    successors = [[w for u, w in edges if u == v] for v in range(n)]
    assert 2 ** widest_level(predecessors) <= len(enumerate_ideals(predecessors, successors, [], 2**n + 1))


def test_a_family_keeps_the_ideals_that_hold_groups_whole_and_both_ends():
    from tvm_diviml.toolkit.downsets import build_ideals

    # a -> c, b -> c, a and b grouped: {a} splits the group; the empty and the full ideal are added
    chain = ([[], [], [0, 1]], [[2], [2], []], [[0, 1]], [(0, [2]), (1, [2])], [])
    ideals = build_ideals(*chain, max_ideals=10, family=[0b001, 0b011])
    assert [int(sum(1 << i for i in map(int, row.nonzero()[0]))) for row in ideals.members] == [0, 0b011, 0b111]
    with pytest.raises(TooManyIdeals, match="a family of more than 2 ideals"):
        build_ideals(*chain, max_ideals=2, family=[0b011])


@settings(max_examples=examples(30), deadline=None)
@given(pipeline_problems())
def test_the_dp_over_a_family_of_every_ideal_is_the_full_dp(problem):
    full = MaxLoadInstance.of(problem, 10_000)
    graph = problem.graph
    index = {k: i for i, k in enumerate(graph.topo_order)}
    predecessors = [[index[e.src] for e in graph.pred[k]] for k in graph.topo_order]
    successors = [[index[e.dst] for e in graph.succ[k]] for k in graph.topo_order]
    every = enumerate_ideals(predecessors, successors, [], 10_000)
    assert close(MaxLoadInstance.of(problem, 10_000, family=every).search()[0].value_s, full.search()[0].value_s)


def test_past_the_cap_it_falls_back_to_slicegraph():
    problem = throughput(*read_msr_fiddle(hand_file()))
    plan = get_solver("downsets", max_ideals=2, fallback_options={"generations": 3}).solve(problem)
    assert plan.method == "slicegraph (fallback)" and "more than 2 ideals" in plan.attrs["fallback_reason"]
    assert plan.value_s == simulate(problem, plan).value_s
    assert plan.value_s >= 7.75e-3 * (1 - 1e-12)


def test_refuses_latency_and_period_overlap_throughput():
    from ..helpers import graph_of, table, unit_platform

    platform = unit_platform()
    graph = graph_of([("a", "b", 1)])
    with pytest.raises(DivimlInputError, match="host_staged") as error:
        get_solver("downsets").solve(throughput(graph, platform, table(platform, {"a": 1, "b": 1})))
    assert "milp" in error.value.hint
    with pytest.raises(DivimlInputError, match="throughput"):
        get_solver("downsets").solve(Problem(graph, platform, table(platform, {"a": 1, "b": 1}), objective="latency"))


def test_real_files_solve_exactly(msr_fiddle_dir):
    import json
    import os

    for name in ("LayerGraphs/bert24_inference.json", "LayerGraphs/resnet50_inference.json"):
        path = os.path.join(msr_fiddle_dir, "throughput-inputs", name)
        graph, platform, costs = read_msr_fiddle(json.load(open(path)))
        problem = throughput(graph, platform, costs)
        plan = get_solver("downsets").solve(problem)
        sim = simulate(Problem(graph, platform, costs), plan)
        assert plan.optimal and sim.feasible and plan.value_s == sim.value_s
        single = get_solver("fastest_single_device").solve(problem)
        assert plan.value_s <= single.value_s


# ---------------------------------------------------------------------- stage_serial pipelines
@settings(max_examples=examples(40), deadline=None)
@given(pipeline_problems())
def test_pipeline_dp_is_the_brute_force_optimum(problem):
    optimum = best_pipeline(problem)
    plan = get_solver("downsets").solve(problem)
    sim = simulate(problem, plan)
    assert sim.feasible and plan.value_s == sim.value_s and (plan.objective, plan.mode) == ("pipeline", "stage_serial")
    assert plan.optimal and close(plan.value_s, optimum) and close(plan.lower_bound_s, optimum)
    assert len(plan.stages) <= problem.stages and len(set(plan.stage_devices)) == len(plan.stage_devices)


@settings(max_examples=examples(30), deadline=None)
@given(st.one_of(pipeline_problems(max_kernels=4, uneven_links=True), constrained_pipeline_problems()))
def test_pipeline_dp_bounds_every_plan_where_it_relaxes_links_and_memory(problem):
    """Links that differ (the DP prices the cheapest), shared weights (split among their users) and
    activations (not counted): the DP's value stays a lower bound, and optimal means the optimum."""
    optimum = best_pipeline(problem)
    try:
        problem.validate()
        plan = downset_plan(problem, 10_000)
    except DivimlInputError:  # validate names what fits nowhere; the DP finds no ordered split
        assert optimum == math.inf
        return
    assert plan.lower_bound_s <= optimum * (1 + 1e-9)
    if not plan.infeasible:
        assert plan.value_s >= optimum * (1 - 1e-9)
    if plan.optimal:
        assert close(plan.value_s, optimum)
    solved = get_solver("downsets").solve(problem)
    assert simulate(problem, solved).feasible
    assert solved.lower_bound_s <= optimum * (1 + 1e-9) <= solved.value_s * (1 + 2e-9)


def test_pipeline_hand_chain_optimum():
    # [a] on B = 2 + input 2 + a out 3 = 7; [b, c] on C = 2 + a in 3 + output 2 = 7 (test_mtpp).
    plan = get_solver("downsets").solve(stage_choice_chain())
    assert (plan.value_s, plan.stages, plan.stage_devices, plan.optimal) == (7.0, [["a"], ["b", "c"]], ["B", "C"], True)
    assert plan.lower_bound_s == 7.0 and plan.attrs["prices_exact"]


def test_pipeline_stage_count_caps_the_sets():
    two = stage_choice_chain()
    problem = Problem(two.graph, two.platform, two.costs, objective="pipeline", stages=1)
    one = get_solver("downsets").solve(problem)
    assert len(one.stages) == 1 and one.optimal and one.value_s == best_pipeline(problem) > 7.0


@settings(max_examples=examples(40), deadline=None)
@given(pipeline_problems(), st.integers(0, 2))
def test_polishing_never_loses_and_a_window_of_every_device_reaches_the_optimum(problem, seed):
    rough = get_solver("slicegraph", seed=seed, time_limit_s=5, generations=1).solve(problem)
    polished = polish_pipeline(problem, rough, Deadline.after(30))
    sim = simulate(problem, polished)
    assert sim.feasible and polished.value_s == sim.value_s <= rough.value_s
    assert len(polished.stages) <= problem.stages and len(set(polished.stage_devices)) == len(polished.stages)
    if problem.stages == len(problem.platform.devices):  # one window holds every stage and device
        assert close(polished.value_s, best_pipeline(problem))


@settings(max_examples=examples(30), deadline=None)
@given(pipeline_problems(), st.integers(0, 2))
def test_a_recut_along_orders_is_better_or_nothing(problem, seed):
    import random

    rough = get_solver("slicegraph", seed=seed, time_limit_s=5, generations=1).solve(problem)
    sim = simulate(problem, rough)
    step = recut_along_orders(problem, rough, sim, Deadline.after(30), random.Random(seed), 0.7)
    if step is not None:
        better, trial = step
        assert trial.feasible and trial.value_s <= sim.value_s and len(better.stages) <= problem.stages
        assert trial.value_s == simulate(problem, better).value_s


def test_orders_find_what_windows_alone_miss(monkeypatch):
    """randwire_ws:nodes=12 on gpu8 as 8 stages, from a one-generation SliceGraph plan: no window of
    1-3 stages helps; re-cuts along orders do, never below the DP's optimum."""
    from tvm_diviml.app.workload import load_workload
    from tvm_diviml.toolkit import pipeline_polish

    workload = load_workload("randwire_ws:nodes=12,stages=1,seed=0", "gpu8", "roofline")
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="pipeline", stages=8)
    optimum = get_solver("downsets").solve(problem).value_s
    rough = get_solver("slicegraph", generations=1, time_limit_s=5).solve(problem)
    with_orders = polish_pipeline(problem, rough, Deadline.after(60))
    monkeypatch.setattr(pipeline_polish, "STALE_ROUNDS", 0)
    windows_only = polish_pipeline(problem, rough, Deadline.after(60))
    assert optimum * (1 - 1e-9) <= with_orders.value_s < windows_only.value_s * (1 - 1e-6)


def test_the_fallback_polishes_slicegraph_past_the_cap():
    from tvm_diviml.app.workload import load_workload

    workload = load_workload("randwire_ws:nodes=12,stages=1,seed=0", "gpu4", "roofline")
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="pipeline", stages=4)
    exact = get_solver("downsets").solve(problem)
    fallback = get_solver("downsets", max_ideals=2, fallback_options={"generations": 1}).solve(problem)
    assert exact.optimal and "more than 2 ideals" in fallback.attrs["fallback_reason"]
    assert fallback.value_s <= fallback.attrs.get("slicegraph_value_s", fallback.value_s)
    assert exact.value_s <= fallback.value_s * (1 + 1e-9)


@settings(max_examples=examples(30), deadline=None)
@given(pipeline_problems(), st.floats(1.0, 2.0))
def test_a_known_plans_period_spares_passes_not_the_optimum(problem, slack):
    """Any period at or above the optimum (a plan's) as the first bound: the same value, no more passes."""
    instance = MaxLoadInstance.of(problem, 10_000)
    plain, plain_passes = instance.search()
    seeded, seeded_passes = instance.search(upper_s=plain.value_s * slack)
    assert close(seeded.value_s, plain.value_s) and seeded_passes <= plain_passes
    first_bound = 1.25 * instance.quantum * instance.key[-1] / instance.max_sets
    if plain.value_s * slack <= 1.5 * first_bound:
        assert seeded_passes == 1


def test_a_dp_table_past_its_cells_is_refused(monkeypatch):
    import tvm_diviml.toolkit.downsets as downsets_module

    monkeypatch.setattr(downsets_module, "MAX_DP_CELLS", 10)
    with pytest.raises(TooManyIdeals, match="a DP table of more than 10 cells"):
        MaxLoadInstance.of(stage_choice_chain(), 10_000)
    fallback = get_solver("downsets", fallback_options={"generations": 1}).solve(stage_choice_chain())
    assert "DP table" in fallback.attrs["fallback_reason"] and fallback.value_s >= 7.0


def test_the_pair_count_of_a_pass_and_a_pass_that_cannot_end_in_time(monkeypatch):
    """A pass whose pairs would take past the deadline is refused before it begins: no DP pass runs
    (counted, not timed, so that a loaded machine cannot fail it)."""
    import numpy as np

    import tvm_diviml.toolkit.downsets as downsets_module
    from tvm_diviml.app.workload import load_workload

    workload = load_workload("randwire_ws:nodes=12,stages=1,seed=0", "gpu4", "roofline")
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="pipeline", stages=4)
    instance = MaxLoadInstance.of(problem, 10_000)
    bound = 0.5 * instance.quantum * instance.key[-1]
    members = instance.ideals.members
    within = instance.key[:, None] - instance.key[None, :] <= bound / instance.quantum
    subset = ~(members[None, :, :] & ~members[:, None, :]).any(axis=2)  # [i, j]: J within I
    exact = int(np.count_nonzero(np.tril(subset & within, k=-1)))
    assert instance.pairs_within(bound, every=1) == exact > 0
    monkeypatch.setattr(downsets_module, "PAIRS_PER_S", 1.0)  # a pair a second: nothing fits in 60 s
    real_dp, passes = MaxLoadInstance.dp, []

    def counted_pass(instance, *args, **kwargs):
        passes.append(args)
        return real_dp(instance, *args, **kwargs)

    monkeypatch.setattr(MaxLoadInstance, "dp", counted_pass)
    with pytest.raises(TimeoutError, match="pairs of ideals"):
        instance.search(deadline=Deadline.after(60))
    assert not passes  # refused at once: the DP never began
    assert len(instance.search()[0].sets) and passes  # without a deadline the same search runs its passes
    fallback = get_solver("downsets", time_limit_s=5, fallback_options={"generations": 1}).solve(problem)
    assert "pairs of ideals" in fallback.attrs["fallback_reason"]


def test_a_dp_stopped_after_an_unproven_pass_keeps_that_pass_s_plan(monkeypatch):
    """randwire_ws:nodes=12 on gpu8 as 8 stages: the first pass (1.25 x the average load) finds a split
    above its bound; the clock stops the second. The solver starts from that split where it beats
    SliceGraph, and never ends above it."""
    from tvm_diviml.app.workload import load_workload
    from tvm_diviml.toolkit.downsets import DpStopped

    workload = load_workload("randwire_ws:nodes=12,stages=1,seed=0", "gpu8", "roofline")
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="pipeline", stages=8)
    real_dp, calls = MaxLoadInstance.dp, []

    def stopped_on_the_second_pass(instance, bound_s=math.inf, deadline=NO_DEADLINE):
        calls.append(bound_s)
        if len(calls) > 1:
            raise TimeoutError("stopped for the test")
        return real_dp(instance, bound_s, deadline)

    monkeypatch.setattr(MaxLoadInstance, "dp", stopped_on_the_second_pass)
    with pytest.raises(DpStopped, match="stopped for the test") as stop:
        downset_plan(problem, 10_000)
    first = stop.value.plan
    assert first is not None and first.value_s > calls[0] and first.method == "downset DP, stopped"
    assert first.value_s == simulate(problem, first).value_s
    calls.clear()
    solved = get_solver("downsets", time_limit_s=10, fallback_options={"generations": 1}).solve(problem)
    assert "stopped for the test" in solved.attrs["fallback_reason"]
    assert solved.value_s <= first.value_s * (1 + 1e-9) and not solved.optimal


def test_a_polish_move_begun_near_the_deadline_ends_at_it():
    """Building a family's arrays took 7-9 s on 10,000 kernels past a polish's deadline: it stops there."""
    import random

    from tvm_diviml.app.workload import load_workload

    workload = load_workload("randwire_ws:nodes=12,stages=1,seed=0", "gpu4", "roofline")
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="pipeline", stages=4)
    assert len(MaxLoadInstance.of(problem, 10_000).ideals) > 2  # no deadline: built
    with pytest.raises(TimeoutError):
        MaxLoadInstance.of(problem, 10_000, deadline=Deadline.after(0))
    rough = get_solver("slicegraph", generations=1, time_limit_s=5).solve(problem)
    sim = simulate(problem, rough)
    assert recut_along_orders(problem, rough, sim, Deadline.after(0), random.Random(0), 0.7) is None


def test_the_fallback_goes_on_recombining_and_polishing_until_rounds_in_a_row_find_nothing(monkeypatch):
    """Rounds with seeds of their own while time is left: one that improves resets the count, and
    STALE_RECOMBINATIONS in a row that do not end the fallback well before its deadline; every gain is offered."""
    import tvm_diviml.solvers.downsets as downsets
    from tvm_diviml.app.workload import load_workload
    from tvm_diviml.toolkit.incumbents import Incumbents

    workload = load_workload("randwire_ws:nodes=12,stages=1,seed=0", "gpu4", "roofline")
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="pipeline", stages=4)
    seeds = []

    def recombine(problem, plan, deadline, seed=0):
        seeds.append(seed)
        if len(seeds) != 3:
            return None
        better = plan.copy()
        better.value_s = plan.value_s * 0.9  # a gain in the third round only
        return better

    monkeypatch.setattr(downsets, "recombine_stages", recombine)
    monkeypatch.setattr(downsets, "polish_pipeline", lambda problem, plan, deadline, seed=0: plan)
    offers = []
    watch = Incumbents(problem)
    monkeypatch.setattr(watch, "offer", lambda plan, by, value_s=None: offers.append((by, plan.value_s)))
    deadline = Deadline.after(600)
    plan = get_solver("downsets", max_ideals=2, seed=5, fallback_options={"generations": 1}).solve(
        problem, deadline=deadline, watch=watch
    )
    assert seeds == list(range(5, 5 + 3 + downsets.STALE_RECOMBINATIONS)) and deadline.left() > 500
    assert "blocks recombined" in plan.method
    gains = [value for by, value in offers if by == "downsets: blocks recombined and re-cut"]
    assert len(gains) == 1 and gains[0] < simulate(problem, plan).value_s  # the fake gain, as claimed
