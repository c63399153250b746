"""The latency baselines greedy and HEFT, and the constraint bookkeeping (DeviceBudget, validate).

Hand-computed cases use ``unit_platform``: A is the host CPU; sending b > 0 bytes takes
latency + b / bandwidth (nothing for zero bytes or on one device).
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.bounds import lower_bound
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, get_solver
from tvm_diviml.toolkit.constraints import DeviceBudget, default_reserve
from tvm_diviml.toolkit.list_scheduling import upward_ranks

from ..helpers import examples, graph_of, table, unit_platform
from ..strategies import dag_problems

BOTH = ("greedy", "heft")


def solve(name, graph, platform, costs, **options):
    plan = get_solver(name, **options).solve(Problem(graph, platform, costs))
    return plan, simulate(Problem(graph, platform, costs), plan)


# ---------------------------------------------------------------------- hand-computed schedules
def test_heft_runs_the_branches_of_a_fork_on_two_devices():
    platform = unit_platform(latency=0.0)
    graph = graph_of([("s", "x", 1), ("s", "y", 1), ("x", "t", 1), ("y", "t", 1)])
    costs = table(platform, {"s": 1, "x": 10, "y": 10, "t": 1})
    heft, sim = solve("heft", graph, platform, costs)
    # s A 0-1; x A 1-11; y reaches B at 2, runs 2-12; t on B waits for x (11 + 1) and runs 12-13
    assert heft.assignment == {"s": "A", "x": "A", "y": "B", "t": "B"}
    assert heft.order == {"A": ["s", "x"], "B": ["y", "t"]}
    assert heft.value_s == sim.value_s == 13
    greedy, _ = solve("greedy", graph, platform, costs)
    assert set(greedy.assignment.values()) == {"A"}  # every device ties: the first wins
    assert greedy.value_s == 22


def test_communication_keeps_a_chain_on_one_device():
    platform = unit_platform(latency=1.0)
    graph = graph_of([("a", "b", 5), ("b", "c", 5)])
    costs = table(
        platform, {"a": {"A": 1, "B": 2, "C": 2}, "b": {"A": 3, "B": 1, "C": 3}, "c": {"A": 1, "B": 2, "C": 2}}
    )
    greedy, _ = solve("greedy", graph, platform, costs)
    assert greedy.assignment == {"a": "A", "b": "B", "c": "A"}
    assert greedy.value_s == 1 + 6 + 1 + 6 + 1  # each crossing costs 1 + 5 s
    heft, _ = solve("heft", graph, platform, costs)
    assert heft.assignment == {"a": "A", "b": "A", "c": "A"}
    assert heft.value_s == 5


def test_insertion_fills_an_idle_gap():
    platform = unit_platform(("A", "B"), latency=0.0)
    graph = graph_of([("p", "q", 1), ("q", "z", 1)], kernels=["p", "q", "z", "r"])
    costs = table(
        platform,
        {"p": {"A": None, "B": 5}, "q": {"A": 1, "B": None}, "z": {"A": 10, "B": None}, "r": {"A": 3, "B": None}},
    )
    plan, sim = solve("heft", graph, platform, costs)
    # q waits on A for p's tensor (5 + 1 = 6); r, scheduled last, fits in A's idle 0-6
    assert plan.order == {"A": ["r", "q", "z"], "B": ["p"]}
    assert (sim.start_s["r"], sim.start_s["q"], sim.start_s["z"]) == (0, 6, 7)
    assert plan.value_s == 17  # without insertion r would end at 20


def test_zero_time_kernels_keep_their_dependencies_in_order():
    platform = unit_platform(("A",))
    graph = graph_of([("a", "b", 1), ("b", "c", 1)])
    plan, sim = solve("heft", graph, platform, table(platform, {"a": 0, "b": 0, "c": 0}))
    assert plan.order == {"A": ["a", "b", "c"]}
    assert sim.value_s == 0


def test_model_inputs_start_on_the_host_and_outputs_return_to_it():
    platform = unit_platform(latency=1.0)
    costs = table(platform, {"a": {"A": 10, "B": 1, "C": 1}})
    # input crosses to B in 1 + 4 s, a runs 5-6, its 2-byte output is back at 6 + 3 = 9 < 10 on A
    small = graph_of([], kernels=["a"], inputs=[("x", 4, ["a"])], output_bytes={"a": 2})
    plan, _ = solve("heft", small, platform, costs)
    assert (plan.assignment, plan.value_s) == ({"a": "B"}, 9)
    # a 5-byte output would be back at 6 + 6 = 12: staying on the host (10) is better
    large = graph_of([], kernels=["a"], inputs=[("x", 4, ["a"])], output_bytes={"a": 5})
    plan, _ = solve("heft", large, platform, costs)
    assert (plan.assignment, plan.value_s) == ({"a": "A"}, 10)


def test_a_tensor_that_grows_on_its_way_delays_earlier_consumers():
    platform = unit_platform(("A", "B"), latency=0.0)
    graph = graph_of([("p", "x", 1), ("p", "y", 5)])
    costs = table(platform, {"p": {"A": 1, "B": None}, "x": {"A": None, "B": 1}, "y": {"A": None, "B": 1}})
    plan, sim = solve("heft", graph, platform, costs)
    # HEFT: x starts at 1 + 1 = 2, y at 1 + 5 = 6, done at 7. The simulator sends p's tensor to B
    # once, with the larger edge (5 bytes): it arrives at 6, x runs 6-7 and y 7-8.
    assert plan.attrs["heft_estimate_s"] == 7
    assert plan.value_s == sim.value_s == 8
    # placed after y, x already counts on the 5-byte crossing: no gap before y, x runs 7-8
    swapped = graph_of([("p", "y", 5), ("p", "x", 1)])
    plan, sim = solve("heft", swapped, platform, costs)
    assert plan.order["B"] == ["y", "x"]
    assert plan.attrs["heft_estimate_s"] == plan.value_s == 8


# ---------------------------------------------------------------------- constraints
def test_allowed_devices_and_infinite_costs_are_respected():
    platform = unit_platform()
    graph = OpGraph([Kernel("a", allowed_devices=("C",)), Kernel("b")], [Edge("a", "b", 1)])
    costs = table(platform, {"a": {"A": 1, "B": 1, "C": 9}, "b": {"A": None, "B": 5, "C": None}})
    for name in BOTH:
        plan, sim = solve(name, graph, platform, costs)
        assert plan.assignment == {"a": "C", "b": "B"}
        assert sim.feasible


def test_colocated_kernels_share_a_device():
    platform = unit_platform()
    graph = OpGraph(
        [Kernel("a", colocate="g"), Kernel("b"), Kernel("c", colocate="g")], [Edge("a", "b", 1), Edge("b", "c", 1)]
    )
    costs = table(platform, {"a": {"A": 1, "B": 5, "C": 5}, "b": 1, "c": {"A": 10, "B": 1, "C": 10}})
    greedy, _ = solve("greedy", graph, platform, costs)
    assert greedy.assignment["a"] == greedy.assignment["c"] == "B"  # group time: A 11, B 6, C 15
    heft, sim = solve("heft", graph, platform, costs)
    assert heft.assignment["a"] == heft.assignment["c"]
    assert sim.feasible


def test_heft_places_a_group_by_the_work_it_commits_to_a_device():
    platform = unit_platform(("A", "B"))
    graph = OpGraph([Kernel("a", colocate="g"), Kernel("c", colocate="g")], [Edge("a", "c", 0)])
    costs = table(platform, {"a": {"A": 0, "B": 1}, "c": {"A": 10, "B": 1}})
    plan, _ = solve("heft", graph, platform, costs)
    # a alone finishes first on A (0 < 1), but A would then owe c's 10 s: 0 + 10 > 1 + 1
    assert plan.assignment == {"a": "B", "c": "B"}
    assert plan.value_s == 2


def test_budget_places_a_group_where_all_of_it_runs_and_fits():
    platform = unit_platform(memory=100)
    graph = OpGraph(
        [
            Kernel("z", weights=("wz",)),
            Kernel("a", weights=("wa",), colocate="g"),
            Kernel("c", weights=("wc",), colocate="g", allowed_devices=("A", "B")),
        ],
        [],
        weights={"wz": 30, "wa": 40, "wc": 40},
    )
    budget = DeviceBudget(Problem(graph, platform, table(platform, {"z": 1, "a": 1, "c": 1})))
    assert budget.allowed("a") == ["A", "B"]  # c cannot run on C
    budget.place("z", "A")
    assert budget.allowed("a") == ["B"]  # A would need 30 + 80 for the whole group
    budget.place("a", "B")
    assert budget.weight_bytes_on("B") == 80  # c's weights are reserved with a's
    assert budget.allowed("c") == ["B"]
    with pytest.raises(ValueError, match="may not be placed on 'A'"):
        budget.place("c", "A")


def test_budget_counts_a_shared_weight_once_per_device():
    platform = unit_platform(memory=100)
    shared = graph_of([("a", "b", 1)], weights={"w": 60}, kernel_weights={"a": ["w"], "b": ["w"]})
    costs = table(platform, {"a": 1, "b": 1})
    budget = DeviceBudget(Problem(shared, platform, costs))
    budget.place("a", "A")
    assert budget.allowed("b") == ["A", "B", "C"]
    distinct = graph_of([("a", "b", 1)], weights={"w1": 60, "w2": 60}, kernel_weights={"a": ["w1"], "b": ["w2"]})
    budget = DeviceBudget(Problem(distinct, platform, costs))
    budget.place("a", "A")
    assert budget.allowed("b") == ["B", "C"]


@pytest.mark.parametrize("name", BOTH)
def test_weights_force_a_second_device(name):
    platform = unit_platform(memory=100)
    graph = graph_of([("a", "b", 1)], weights={"w1": 60, "w2": 60}, kernel_weights={"a": ["w1"], "b": ["w2"]})
    plan, sim = solve(name, graph, platform, table(platform, {"a": 1, "b": 1}))
    assert plan.assignment == {"a": "A", "b": "B"}
    assert sim.feasible
    assert plan.value_s == 1 + 2 + 1  # a, one byte to B in 1 + 1 s, b


@pytest.mark.parametrize("name", BOTH)
def test_weights_that_fit_nowhere_name_device_need_and_capacity(name):
    platform = unit_platform(("A", "B"), memory=100)
    graph = graph_of(
        [("a", "b", 1), ("b", "c", 1)],
        weights={"w1": 60, "w2": 60, "w3": 60},
        kernel_weights={"a": ["w1"], "b": ["w2"], "c": ["w3"]},
    )
    problem = Problem(graph, platform, table(platform, {"a": 1, "b": 1, "c": 1}))
    problem.validate()  # each kernel fits alone, and 180 B < 200 B in all
    with pytest.raises(DivimlInputError, match="kernel 'c' fits on no device") as error:
        get_solver(name, exact_fallback=False).solve(problem)
    assert "'A' needs 120 B" in str(error.value) and "'B' needs 120 B" in str(error.value)
    assert "capacity 100 B" in str(error.value)
    with pytest.raises(DivimlInputError, match="the MILP proves that the weights"):  # no placement at all
        get_solver(name).solve(problem)


def test_default_reserve_is_the_largest_working_set_a_device_may_receive():
    platform = unit_platform()
    graph = OpGraph(
        [Kernel("a", output_bytes=10), Kernel("b", output_bytes=7, allowed_devices=("B",))],
        [Edge("a", "b", 10)],
        inputs=[GraphInput("x", 5, ("a",))],
    )
    reserve = default_reserve(Problem(graph, platform, table(platform, {"a": 1, "b": 1})))
    assert reserve == {"A": 15, "B": 17, "C": 15}  # a: 10 out + 5 in; b: 7 out + 10 in


def test_a_default_reserve_that_leaves_no_room_gives_way_to_the_working_sets():
    platform = unit_platform(memory=100)
    # big's 50-byte output makes the default reserve 50 everywhere, and a's 90 B of weights fit nowhere
    # with it; yet big can go elsewhere: the budget then keeps free only the working sets placed
    graph = graph_of([], kernels=["a", "big"], weights={"w": 90}, kernel_weights={"a": ["w"]}, output_bytes={"big": 50})
    costs = table(platform, {"a": 1, "big": {"A": 5, "B": 1, "C": 1}})
    for reserve in (None, {"A": 0}):
        plan = get_solver("greedy", reserve=reserve).solve(Problem(graph, platform, costs))
        assert plan.assignment == {"a": "A", "big": "B"}
        assert simulate(Problem(graph, platform, costs), plan).feasible
    small = unit_platform(memory=80)
    with pytest.raises(DivimlInputError, match="kernel 'a' needs 90 B of weights"):
        get_solver("greedy").solve(Problem(graph, small, table(small, {"a": 1, "big": 1})))
    with pytest.raises(DivimlInputError, match="unknown device 'Z'"):
        get_solver("greedy", reserve={"Z": 1}).solve(Problem(graph, platform, costs))


def skip_connection(memory=100):
    """a's tensor stays live until d: at c, a + b + c = 30 B are live, above every working set (21 B)."""
    platform = unit_platform(memory=memory)
    graph = graph_of(
        [("a", "b", 10), ("b", "c", 10), ("c", "d", 10), ("a", "d", 10)],
        weights={"w": 75},
        kernel_weights={"a": ["w"]},
        output_bytes={"a": 10, "b": 10, "c": 10, "d": 1},
    )
    return graph, platform, table(platform, {"a": 1, "b": 1, "c": 1, "d": 1})


def test_activations_above_the_reserve_are_repaired():
    graph, platform, costs = skip_connection()
    assert set(default_reserve(Problem(graph, platform, costs)).values()) == {21}
    everything_on_a = simulate(Problem(graph, platform, costs), Plan({k: "A" for k in graph.kernels}))
    assert everything_on_a.memory_bytes["A"] == 75 + 30  # greedy's first attempt
    plan, sim = solve("greedy", graph, platform, costs)
    # second attempt, A reserving 30 B: a (75 B of weights) moves to B, the rest stays on A
    assert plan.assignment == {"a": "B", "b": "A", "c": "A", "d": "A"}
    assert sim.feasible


def test_a_plan_that_still_overflows_is_returned_for_the_simulator_to_flag():
    graph, platform, costs = skip_connection()
    plan, sim = solve("heft", graph, platform, costs, exact_fallback=False)
    # HEFT keeps b, c, d beside a each time; A, then B, get a 30 B reserve, and the third try uses C
    assert set(plan.assignment.values()) == {"C"}
    assert plan.value_s == sim.value_s
    assert sim.problems == ["device 'C' needs 105 B, has 100 B"]
    # by default the MILP then places the model: each overflow it sees excludes that set of kernels on
    # that device, and a plan with a's weights apart from the skip connection's tensors fits
    plan, sim = solve("heft", graph, platform, costs)
    assert "the exact MILP placed the model" in plan.attrs["weaker_method"]
    assert sim.feasible and len(set(plan.assignment.values())) > 1


def test_other_objectives_are_refused_with_a_pointer():
    platform = unit_platform()
    graph = graph_of([("a", "b", 1)])
    with pytest.raises(DivimlInputError, match="greedy") as error:  # greedy does throughput too
        get_solver("heft").solve(Problem(graph, platform, table(platform, {"a": 1, "b": 1}), objective="throughput"))
    assert error.value.field == "objective"
    for name in BOTH:
        with pytest.raises(DivimlInputError, match="slicegraph") as error:
            get_solver(name).solve(
                Problem(graph, platform, table(platform, {"a": 1, "b": 1}), objective="pipeline", stages=2)
            )
        assert error.value.field == "objective"


# ---------------------------------------------------------------------- Problem.validate
def validate(graph, platform):
    Problem(graph, platform, table(platform, {k: 1 for k in graph.kernels})).validate()


def test_validate_names_a_kernel_too_heavy_for_every_device_it_may_use():
    platform = unit_platform(memory=100)
    with pytest.raises(DivimlInputError, match=r"kernel 'a' needs 150 B of weights.*'A', has 100 B"):
        validate(graph_of([], kernels=["a"], weights={"w": 150}, kernel_weights={"a": ["w"]}), platform)
    restricted = OpGraph([Kernel("a", weights=("w",), allowed_devices=("B",))], [], weights={"w": 150})
    with pytest.raises(DivimlInputError, match="'B', has 100 B"):
        validate(restricted, platform)
    validate(restricted, unit_platform(memory=None))


def test_validate_names_a_group_too_heavy_for_its_devices():
    platform = unit_platform(memory=100)
    graph = OpGraph(
        [Kernel("a", weights=("w1",), colocate="g"), Kernel("b", weights=("w2",), colocate="g")],
        [],
        weights={"w1": 60, "w2": 60},
    )
    with pytest.raises(DivimlInputError, match=r"group 'g' needs 120 B of weights.*'A', has 100 B"):
        validate(graph, platform)


def test_validate_compares_all_weights_with_all_memory():
    platform = unit_platform(memory=100)
    names = [f"k{i}" for i in range(6)]
    graph = OpGraph([Kernel(n, weights=(f"w{n}",)) for n in names], [], weights={f"w{n}": 60 for n in names})
    with pytest.raises(
        DivimlInputError,
        match=r"need 360 B, more than all devices hold together: 300 B "
        r"\('A' 100 B, 'B' 100 B, 'C' 100 B\)",
    ):
        validate(graph, platform)
    validate(
        OpGraph([Kernel(n, weights=(f"w{n}",)) for n in names[:5]], [], weights={f"w{n}": 60 for n in names[:5]}),
        platform,
    )


# ---------------------------------------------------------------------- properties
@settings(max_examples=examples(80), deadline=None)
@given(data=st.data(), name=st.sampled_from(BOTH))
def test_claims_equal_the_simulator(data, name):
    graph, platform, costs = data.draw(dag_problems())
    problem = Problem(graph, platform, costs)
    plan = get_solver(name).solve(problem)
    sim = simulate(Problem(graph, platform, costs), plan)
    assert (plan.solver, plan.mode, plan.optimal) == (name, "latency", False)
    assert plan.value_s == sim.value_s and sim.feasible
    assert sorted(k for run in plan.order.values() for k in run) == sorted(graph.kernels)
    assert plan.value_s >= lower_bound(problem) - 1e-9
    assert get_solver(name).solve(problem).order == plan.order  # deterministic


@settings(max_examples=examples(60), deadline=None)
@given(problem=dag_problems())
def test_greedy_puts_every_kernel_on_a_fastest_device(problem):
    graph, platform, costs = problem
    plan = get_solver("greedy").solve(Problem(graph, platform, costs))
    for kernel, device in plan.assignment.items():
        assert costs.compute_s(kernel, device) == min(costs.compute_s(kernel, d) for d in platform.device_names)


@settings(max_examples=examples(80), deadline=None)
@given(problem=dag_problems())
def test_heft_estimate_is_the_simulated_value_when_each_tensor_has_one_size(problem):
    graph, platform, costs = problem
    plan = get_solver("heft").solve(Problem(graph, platform, costs))
    # the simulator never starts a kernel earlier than HEFT assumed
    assert plan.value_s >= plan.attrs["heft_estimate_s"] - 1e-9
    uniform = OpGraph(
        graph.kernels.values(),
        [Edge(e.src, e.dst, graph.kernels[e.src].output_bytes) for e in graph.edges],
        inputs=graph.inputs,
    )
    plan = get_solver("heft").solve(Problem(uniform, platform, costs))
    assert plan.value_s == pytest.approx(plan.attrs["heft_estimate_s"], rel=1e-12, abs=1e-12)


def test_upward_rank_is_the_mean_cost_path_to_the_end():
    platform = unit_platform(latency=1.0)
    graph = graph_of([("a", "b", 2)], output_bytes={"b": 4})
    ranks = upward_ranks(Problem(graph, platform, table(platform, {"a": {"A": 1, "B": 2, "C": 3}, "b": 3})))
    returned = (0 + 5 + 5) / 3  # b's output back to the host A, averaged over devices
    assert ranks["b"] == pytest.approx(3 + returned)
    assert ranks["a"] == pytest.approx(2 + (1 + 2) + ranks["b"])


@settings(max_examples=examples(40), deadline=None)
@given(problem=dag_problems())
def test_upward_ranks_decrease_along_every_edge(problem):
    graph, platform, costs = problem
    ranks = upward_ranks(Problem(graph, platform, costs))
    for edge in graph.edges:
        assert ranks[edge.src] > ranks[edge.dst]  # compute times are at least 1 s


def test_heft_inserts_into_a_gap_only_within_its_window_of_intervals():
    from tvm_diviml.toolkit.list_scheduling import INSERTION_WINDOW, Timeline

    def timeline(gap_after):  # back-to-back unit intervals, one idle unit after ``gap_after`` of them
        line = Timeline()
        for i in range(INSERTION_WINDOW + 10):
            start = float(i) + (i >= gap_after)
            line.insert(i, start, start + 1.0, f"k{i}")
        return line

    near = timeline(gap_after=5)
    assert near.earliest_slot(0.0, 1.0) == (5, 5.0)  # the gap [5, 6)
    far = timeline(gap_after=INSERTION_WINDOW + 5)
    assert far.earliest_slot(0.0, 1.0) == (INSERTION_WINDOW + 10, INSERTION_WINDOW + 11.0)  # appended


def test_a_list_schedule_is_made_once_per_problem_and_each_caller_gets_its_own_copy():
    from tvm_diviml.toolkit.list_scheduling import heft_placement, list_schedule_plan

    graph = graph_of([("a", "b", 1), ("a", "c", 1), ("b", "d", 1), ("c", "d", 1)])
    platform = unit_platform()
    problem = Problem(graph, platform, table(platform, {"a": 1, "b": 2, "c": 2, "d": 1}))
    first = list_schedule_plan(problem, heft_placement, "heft")
    first.assignment["a"] = "nowhere"
    second = list_schedule_plan(problem, heft_placement, "heft")
    assert second.assignment["a"] != "nowhere"
    assert second.assignment == get_solver("heft").solve(Problem(graph, platform, problem.costs)).assignment
