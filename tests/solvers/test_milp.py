"""The exact latency MILP, the splitting heuristic and the LP load bound.

Links cost 1 s + 1 s per byte (``unit_platform``); A is the host.
"""

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from tvm_diviml.bounds import lower_bounds, lp_load_bound
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import Edge, Kernel, OpGraph
from tvm_diviml.platform import Device, Link, Platform
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, get_solver
from tvm_diviml.solvers.split import Split
from tvm_diviml.synthetic import random_dag
from tvm_diviml.toolkit.communities import modules
from tvm_diviml.toolkit.deadline import Deadline
from tvm_diviml.toolkit.latency_model import LatencyModel
from tvm_diviml.toolkit.windows import Context, list_schedule

from ..bruteforce import best_latency
from ..helpers import examples, graph_of, table, unit_platform
from ..strategies import dag_problems


def solve(problem, solver="milp", **options):
    """Solve and check the promise every plan makes: its claim is the simulator's value of it."""
    plan = get_solver(solver, **options).solve(problem)
    sim = simulate(problem, plan)
    assert plan.value_s == pytest.approx(sim.value_s, rel=1e-12)
    assert sim.feasible, sim.problems
    return plan, sim


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dag_problems(max_kernels=7))
def test_milp_equals_brute_force_and_bounds_stay_below(case):
    graph, platform, costs = case
    problem = Problem(graph, platform, costs)
    optimum, _ = best_latency(graph, platform, costs)
    plan, _ = solve(problem, time_limit_s=60)
    assert plan.optimal
    assert plan.value_s == pytest.approx(optimum, rel=1e-6, abs=1e-9)
    # The model charges exactly what the simulator charges: at the optimum the two agree.
    assert plan.attrs["milp_objective_s"] == pytest.approx(plan.value_s, rel=1e-6, abs=1e-9)
    assert plan.lower_bound_s <= optimum * (1 + 1e-6) + 1e-9
    for name, bound in lower_bounds(problem).items():
        assert bound <= optimum * (1 + 1e-9) + 1e-12, name


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_both_backends_find_the_fork_optimum(backend):
    # r (1 s everywhere) forks to q and z (4 s on A, 6 s elsewhere); tensors of 1 byte cost 2 s to move.
    # All on A: 1 + 4 + 4 = 9. q alone on B: arrives 3, runs to 9, returns at 11. r and q on B, z on A: q ends
    # at 7 and is home at 9; z arrives at 3 and ends at 7. Nothing beats 9: r + q + return >= 9 off A.
    graph = graph_of([("r", "q", 1), ("r", "z", 1)], output_bytes={"q": 1, "z": 1})
    platform = unit_platform()
    costs = table(platform, {"r": 1, "q": {"A": 4, "B": 6, "C": 6}, "z": {"A": 4, "B": 6, "C": 6}})
    plan, _ = solve(Problem(graph, platform, costs), backend=backend)
    assert plan.optimal and plan.value_s == pytest.approx(9.0)


def test_milp_uses_a_second_device_when_branches_are_long():
    # Two 10 s branches after a 1 s root: on A alone 21 s. Root and z on B (z ends 11, home at 13), q on the
    # host A (the tensor arrives at 3, q ends at 13): 13 s. Root on A needs a return from B: 15 s.
    graph = graph_of([("r", "q", 1), ("r", "z", 1)], output_bytes={"q": 1, "z": 1})
    platform = unit_platform()
    costs = table(platform, {"r": 1, "q": 10, "z": 10})
    plan, sim = solve(Problem(graph, platform, costs))
    assert plan.optimal and plan.value_s == pytest.approx(13.0)
    assert plan.assignment["q"] != plan.assignment["z"]


def test_largest_tensor_rule_is_modelled():
    # u feeds v (1 byte) and w (5 bytes); if both sit on B the tensor crosses once with 5 bytes, so v waits
    # for 1 + 1 + 5 = 7 s as well, not 1 + 1 + 1 = 3 s. The proven optimum must equal the simulator's.
    graph = graph_of([("u", "v", 1), ("u", "w", 5)], output_bytes={"u": 5})
    platform = unit_platform()
    costs = table(
        platform, {"u": {"A": 1, "B": 50, "C": 50}, "v": {"A": 20, "B": 1, "C": 20}, "w": {"A": 20, "B": 1, "C": 20}}
    )
    plan, sim = solve(Problem(graph, platform, costs))
    optimum, _ = best_latency(graph, platform, costs)
    assert plan.optimal and plan.value_s == pytest.approx(optimum)
    assert plan.attrs["milp_objective_s"] == pytest.approx(sim.value_s)


def test_milp_honours_memory_allowed_devices_and_colocation():
    kernels = [
        Kernel("a", weights=("wa",)),
        Kernel("b", weights=("wb",), allowed_devices=("B", "C")),
        Kernel("c", colocate="g"),
        Kernel("d", colocate="g"),
    ]
    graph = OpGraph(
        kernels,
        [Edge("a", "b", 0), Edge("a", "c", 0), Edge("b", "d", 0), Edge("c", "d", 0)],
        weights={"wa": 60, "wb": 60},
    )
    platform = unit_platform(memory=100, latency=0.0)
    costs = table(
        platform,
        {
            "a": {"A": 1, "B": 1, "C": 1},
            "b": {"A": 1, "B": 9, "C": 1},
            "c": {"A": 5, "B": 1, "C": 5},
            "d": {"A": 1, "B": 9, "C": 1},
        },
    )
    for solver in ("milp", "split"):
        plan, sim = solve(Problem(graph, platform, costs), solver)
        assert plan.assignment["b"] in ("B", "C")
        assert plan.assignment["c"] == plan.assignment["d"]
        assert plan.assignment["a"] != plan.assignment["b"]  # 60 + 60 bytes of weights do not fit in 100


@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_a_default_reserve_that_leaves_no_plan_gives_way_to_the_weights(objective):
    """q (6 B of weights) may run only on B (10 B). r, which may run on A or B, makes an 8 B tensor, so
    the default activation reserve keeps 8 B free on B and leaves q no room: a plan exists all the same
    (r on A, the host without a limit). The exact models solve again with weights alone and find it."""
    graph = OpGraph(
        [
            Kernel("p", output_bytes=8, allowed_devices=("A",)),
            Kernel("q", weights=("wq",), allowed_devices=("B",)),
            Kernel("r", output_bytes=8, allowed_devices=("A", "B")),
        ],
        [],
        weights={"wq": 6},
    )
    devices = [Device("A", {"kind": "llvm"}, "cpu:0"), Device("B", {"kind": "cuda"}, "cuda:0", memory_bytes=10)]
    platform = Platform("two", devices, {(a, b): Link(a, b, 0.0, 1.0) for a in "AB" for b in "AB" if a != b})
    problem = Problem(graph, platform, table(platform, {"p": 1, "q": 1, "r": 1}), objective=objective)
    names = ("milp", "split") + (("cpsat",) if objective == "latency" else ())
    for name in names:
        plan = get_solver(name, time_limit_s=20).solve(problem)
        assert simulate(Problem(graph, platform, problem.costs), plan).feasible, name
        assert plan.assignment == {"p": "A", "q": "B", "r": "A"}, name


@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_an_overflow_excludes_its_kernel_set_not_the_device(objective):
    """a -> b -> c -> d and a -> d, 10 B tensors, a with 75 B of weights, 100 B devices: with everything
    on one device a's tensor is live across c (30 B of activations): 105 B. Raising that device's
    reserve to 30 B would keep a (85 B alone) off it; excluding the set that overflowed does not."""
    graph = graph_of(
        [("a", "b", 10), ("b", "c", 10), ("c", "d", 10), ("a", "d", 10)],
        weights={"w": 75},
        kernel_weights={"a": ["w"]},
        output_bytes={"a": 10, "b": 10, "c": 10, "d": 1},
    )
    platform = unit_platform(memory=100, latency=0.0)
    problem = Problem(graph, platform, table(platform, {"a": 1, "b": 1, "c": 1, "d": 1}), objective=objective)
    plan = get_solver("milp", time_limit_s=20, warm_start=False).solve(problem)
    sim = simulate(Problem(graph, platform, problem.costs), plan)
    assert sim.feasible, sim.problems
    assert len(set(plan.assignment.values())) > 1 and not plan.optimal  # memory binds: no proof claimed


def test_impossible_memory_names_device_need_and_capacity():
    graph = OpGraph([Kernel("a", weights=("w",))], [], weights={"w": 500})
    platform = unit_platform(memory=100)
    with pytest.raises(DivimlInputError, match=r"100 B"):
        get_solver("milp").solve(Problem(graph, platform, table(platform, {"a": 1})))


def test_time_limited_milp_keeps_a_valid_plan_and_bound():
    graph = random_dag(kernels=40, seed=3)
    platform = unit_platform(latency=0.001, bandwidth=1e9)
    costs = table(platform, {k: {"A": 3.0, "B": 1.0 + (i % 3), "C": 2.0} for i, k in enumerate(graph.kernels)})
    problem = Problem(graph, platform, costs)
    plan, _ = solve(problem, time_limit_s=1.0)
    heft, _ = solve(problem, "heft")
    assert plan.value_s <= heft.value_s  # warm-started from the best heuristic
    assert plan.lower_bound_s is None or plan.lower_bound_s <= plan.value_s * (1 + 1e-9)


def test_window_with_fixed_context_waits_for_release_and_busy_devices():
    # p (already on B, done at 5) feeds w; device A is busy until 8. w on A: 8 + 1 = 9 (the tensor arrives at 7);
    # w on B: 5 + 4 = 9 as well, C: 5 + 2 + 4 = 11.
    graph = graph_of([("p", "w", 1)])
    platform = unit_platform()
    costs = table(platform, {"p": 1, "w": {"A": 1, "B": 4, "C": 4}})
    problem = Problem(graph, platform, costs)
    context = Context({"p": "B"}, {"p": 5.0}, {"A": 8.0, "B": 5.0})
    solution = LatencyModel(problem, ["w"], context).solve(Deadline.after(10))
    assert solution.optimal and solution.objective_s == pytest.approx(9.0)
    heuristic = list_schedule(problem, ["w"], context, {"w": "C"})
    assert heuristic.start_s["w"] == pytest.approx(7.0) and heuristic.objective_s == pytest.approx(11.0)


def test_lp_load_bound_by_hand():
    # One kernel, 1 s on A and 3 s on B and C: split 3/5 : 1/5 : 1/5 gives every device 0.6 s.
    graph = graph_of([], kernels=["k"])
    platform = unit_platform()
    problem = Problem(graph, platform, table(platform, {"k": {"A": 1, "B": 3, "C": 3}}))
    assert lp_load_bound(problem) == pytest.approx(0.6, rel=1e-5)
    assert lp_load_bound(problem) <= 0.6


def test_the_load_lp_bound_stays_past_the_deadline_on_small_graphs_only(monkeypatch):
    from tvm_diviml.bounds import BOUNDS

    graph = graph_of([], kernels=["k"])
    platform = unit_platform()
    problem = Problem(graph, platform, table(platform, {"k": {"A": 1, "B": 3, "C": 3}}))
    spent = Deadline.after(0.0)
    # B and C are interchangeable and one kernel needs one of them: the LP over A and B gives 1 / (1 + 1/3)
    assert lower_bounds(problem, deadline=spent)["lp_load"] == pytest.approx(0.75, rel=1e-5)
    monkeypatch.setitem(BOUNDS, "lp_load", replace(BOUNDS["lp_load"], late_up_to=0))  # as past the threshold
    assert "lp_load" not in lower_bounds(problem, deadline=spent)


def test_split_modules_are_contiguous_capped_and_acyclic():
    graph = random_dag(kernels=120, seed=5)
    platform = unit_platform(latency=0.001, bandwidth=1e9)
    problem = Problem(graph, platform, table(platform, {k: 1.0 for k in graph.kernels}))
    pieces = modules(problem, {k: graph.position[k] % 7 for k in graph.kernels}, module_size=10)
    assert sorted(k for piece in pieces for k in piece) == sorted(graph.kernels)
    assert all(len(piece) <= 10 for piece in pieces)
    flat = [k for piece in pieces for k in piece]
    where = {k: i for i, k in enumerate(flat)}
    assert all(where[e.src] < where[e.dst] for e in graph.edges)  # a topological order: acyclic quotient


def test_split_rejects_bad_options():
    with pytest.raises(DivimlInputError, match="module_size"):
        Split(module_size=1)
    with pytest.raises(DivimlInputError, match="backend"):
        Split(backend="gurobi")
    graph = graph_of([("a", "b", 1)], inputs=[("x", 1, ["a"])])
    platform = unit_platform()
    with pytest.raises(DivimlInputError, match="objective"):
        Split().solve(Problem(graph, platform, table(platform, {"a": 1, "b": 1}), objective="pipeline", stages=2))


@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_constraints_that_cannot_all_hold_are_called_infeasible(objective):
    """Four co-location groups of 6 bytes, three devices of 10: each device holds one group at most."""
    kernels = [Kernel(f"k{i}", weights=(f"w{i}",), colocate=f"g{i // 2}") for i in range(8)]
    graph = OpGraph(kernels, [Edge(f"k{i}", f"k{i + 1}", 1) for i in range(7)], weights={f"w{i}": 3 for i in range(8)})
    platform = unit_platform(memory=10)
    problem = Problem(graph, platform, table(platform, {f"k{i}": 1 for i in range(8)}), objective=objective)
    with pytest.raises(DivimlInputError, match="no plan satisfies the constraints"):
        get_solver("milp", time_limit_s=20).solve(problem)
