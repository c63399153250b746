"""The splitting heuristic with CP-SAT windows: the window model by hand, brute force, its promises.

Links cost 1 s + 1 s per byte (``unit_platform``); A is the host. Each split run with the cpsat
backend starts one OR-Tools process (about a second: most of it importing OR-Tools).
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_diviml.graph import Kernel, OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem
from tvm_diviml.solvers.heft import Heft
from tvm_diviml.solvers.split import Split
from tvm_diviml.synthetic import random_dag
from tvm_diviml.toolkit.cpsat_session import CpsatSession
from tvm_diviml.toolkit.deadline import Deadline
from tvm_diviml.toolkit.latency_model import LatencyModel
from tvm_diviml.toolkit.window_solver import plan_tails
from tvm_diviml.toolkit.windows import Context, list_schedule

from ..bruteforce import best_latency
from ..helpers import examples, graph_of, table, unit_platform
from ..strategies import DEVICES, dag_problems


def solve(problem, **options):
    """Split, and check what every plan promises: its claim is the simulator's value, and it fits."""
    plan = Split(**options).solve(problem)
    sim = simulate(problem, plan)
    assert plan.value_s == pytest.approx(sim.value_s, rel=1e-12, abs=1e-15)
    assert sim.feasible, sim.problems
    return plan


def test_a_window_kernel_fills_an_idle_gap_between_fixed_kernels():
    # f is fixed on A from 2 to 5; w reads nothing and takes 4 s on B and C. With 1.5 s on A it fits
    # in A's idle gap before f and ends at 1.5 (a model that only knows "A is busy until 5" says 4, on
    # B). With 2.5 s on A it does not fit: B, ending at 4 (after f on A: 7.5).
    graph = OpGraph([Kernel("f"), Kernel("w")], [])
    platform = unit_platform()
    context = Context({"f": "A"}, {"f": 5.0}, {"A": 5.0})
    with CpsatSession() as session:
        for on_a, device, end in [(1.5, "A", 1.5), (2.5, "B", 4.0)]:
            problem = Problem(graph, platform, table(platform, {"f": 3, "w": {"A": on_a, "B": 4, "C": 4}}))
            hint = list_schedule(problem, ["w"], context, {"w": "B"})
            solution = session.solve_window(
                problem, ["w"], context, fixed_start_s={"f": 2.0}, hint=hint, until=Deadline.after(10)
            )
            assert solution.optimal and solution.assignment == {"w": device}
            assert solution.finish_s["w"] == solution.objective_s == end
    ready_only = LatencyModel(
        Problem(graph, platform, table(platform, {"f": 3, "w": {"A": 1.5, "B": 4, "C": 4}})), ["w"], context
    ).solve(Deadline.after(10))
    assert ready_only.objective_s == pytest.approx(4.0)


def test_a_fixed_producer_sends_its_largest_tensor_and_tails_extend_the_makespan():
    # p (fixed on B, done at 5) sends 3 bytes to q (fixed on A) and 1 byte to w. The tensor crosses to
    # A once, with 3 bytes: w on A starts at 5 + 1 + 3 = 9 and ends at 10; on C it gets 1 byte at 7 and
    # ends at 9.5; on B 5 + 10 = 15. Pricing w's own edge alone would pick A (8). The tail adds 2.
    graph = graph_of([("p", "q", 3), ("p", "w", 1)])
    platform = unit_platform()
    problem = Problem(graph, platform, table(platform, {"p": 1, "q": 1, "w": {"A": 1, "B": 10, "C": 2.5}}))
    context = Context({"p": "B", "q": "A"}, {"p": 5.0, "q": 10.0}, {"A": 10.0, "B": 5.0})
    with CpsatSession() as session:
        solution = session.solve_window(
            problem,
            ["w"],
            context,
            tail_s={"w": 2.0},
            until=Deadline.after(10),
            hint=list_schedule(problem, ["w"], context, {"w": "B"}, {"w": 2.0}),
        )
    assert solution.optimal and solution.assignment == {"w": "C"}
    assert solution.start_s["w"] == 7.0 and solution.objective_s == 11.5


def test_back_to_back_fixed_runs_with_inexact_times_leave_the_window_feasible():
    # f1 and f2 run back to back on A (0.1-0.3, 0.3-0.7: not binary fractions, so each is rounded
    # outwards to ticks and the two overlap by a tick); w may run only on A, for 1 s: from 0.7 to 1.7.
    graph = OpGraph([Kernel("f1"), Kernel("f2"), Kernel("w", allowed_devices=("A",))], [])
    platform = unit_platform()
    problem = Problem(graph, platform, table(platform, {"f1": 0.2, "f2": 0.4, "w": 1}))
    context = Context({"f1": "A", "f2": "A"}, {"f1": 0.3, "f2": 0.7}, {"A": 0.7})
    with CpsatSession() as session:
        solution = session.solve_window(
            problem,
            ["w"],
            context,
            fixed_start_s={"f1": 0.1, "f2": 0.3},
            hint=list_schedule(problem, ["w"], context, {"w": "A"}),
            until=Deadline.after(10),
        )
    assert solution.optimal and solution.start_s["w"] == pytest.approx(0.7, rel=1e-9)


def test_plan_tails_charge_successors_and_the_next_kernel_on_each_device():
    # w (0-1 on A) feeds s2 (3 s on B) with 1 byte, which arrives at 3; s1 (4 s) follows w on A.
    # w on A: s1 next on A (4), s2 after a transfer (2 + 3) -> 5. On B: s2 is next there and reads
    # locally -> 3. On C: nothing after it there, s2 after a transfer -> 5.
    graph = graph_of([("w", "s2", 1)], kernels=["w", "s1", "s2"])
    platform = unit_platform()
    problem = Problem(graph, platform, table(platform, {"w": 1, "s1": 4, "s2": 3}))
    plan = Plan({"w": "A", "s1": "A", "s2": "B"}, order={"A": ["w", "s1"], "B": ["s2"]})
    sim = simulate(Problem(graph, platform, problem.costs), plan)
    assert plan_tails(problem, plan, sim, ["w"], ["s1", "s2"]) == {"w": {"A": 5.0, "B": 3.0, "C": 5.0}}


@pytest.mark.parametrize("backend", ["cpsat", "highs"])
def test_sweeps_keep_every_promise_with_either_backend(backend):
    graph = random_dag(kernels=14, seed=5)
    platform = unit_platform(latency=0.5, bandwidth=2.0)
    costs = table(
        platform, {k: {"A": 3.0, "B": 1.0 + i % 3, "C": 2.0 - i % 2 * 0.5} for i, k in enumerate(graph.kernels)}
    )
    problem = Problem(graph, platform, costs)
    plan = solve(problem, module_size=4, backend=backend, series=False)  # the windows, not the series
    assert plan.attrs["split_backend"] == backend and plan.attrs["windows_solved"] > plan.attrs["modules"]
    assert plan.value_s <= Heft().solve(problem).value_s


def test_split_equals_brute_force_when_one_window_is_the_whole_graph():
    graph = random_dag(kernels=7, seed=11)
    platform = unit_platform(latency=0.5, bandwidth=2.0)
    costs = table(
        platform, {k: {"A": 2.0 + i % 3, "B": 1.0 + (i * 5) % 4, "C": 3.0 - i % 2} for i, k in enumerate(graph.kernels)}
    )
    optimum, _ = best_latency(graph, platform, costs)
    plan = solve(Problem(graph, platform, costs), module_size=8, series=False)
    assert plan.attrs["modules"] == 1
    assert plan.value_s == pytest.approx(optimum, rel=1e-9)


@settings(max_examples=examples(5), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dag_problems(max_kernels=6))
def test_split_equals_brute_force_on_tiny_graphs(case):  # ~1.2 s an example: one OR-Tools process each
    graph, platform, costs = case
    optimum, _ = best_latency(graph, platform, costs)
    plan = solve(Problem(graph, platform, costs), module_size=6)
    assert plan.value_s == pytest.approx(optimum, rel=1e-9, abs=1e-12)


@st.composite
def problems_with_free_kernels(draw):
    """dag_problems where some kernels cost nothing on some devices: zero-length runs tie at one
    start time, the case where ordering by start could deadlock."""
    graph, platform, costs = draw(dag_problems(max_kernels=8))
    free = draw(st.sets(st.sampled_from([(k, d) for k in graph.kernels for d in DEVICES])))
    times = {k: {d: 0.0 if (k, d) in free else costs.compute_s(k, d) for d in DEVICES} for k in graph.kernels}
    return graph, platform, table(platform, times)


@pytest.mark.slow
@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems_with_free_kernels(), st.integers(2, 3))
def test_many_small_windows_keep_every_promise(case, module_size):  # 20-30 s
    graph, platform, costs = case
    problem = Problem(graph, platform, costs)
    plan = solve(problem, module_size=module_size)
    assert plan.value_s <= Heft().solve(problem).value_s


def test_split_is_deterministic_for_a_seed_and_never_worse_than_heft():
    graph = random_dag(kernels=48, seed=2)
    platform = unit_platform(latency=0.01, bandwidth=100.0)
    costs = table(
        platform, {k: {"A": 4.0, "B": 1.0 + (i % 4), "C": 1.0 + (i % 3)} for i, k in enumerate(graph.kernels)}
    )
    problem = Problem(graph, platform, costs)
    first = solve(problem, module_size=12, seed=3, workers=1, module_time_limit_s=20, series=False, whole_up_to=0)
    again = solve(problem, module_size=12, seed=3, workers=1, module_time_limit_s=20, series=False, whole_up_to=0)
    assert first.attrs["windows_proven"] == first.attrs["windows_solved"]  # no window stopped by the clock
    assert (first.assignment, first.order, first.value_s) == (again.assignment, again.order, again.value_s)
    assert first.value_s <= Heft().solve(problem).value_s
    assert first.attrs["modules"] >= 4 and first.attrs["split_backend"] == "cpsat"


def test_past_the_deadline_split_keeps_its_quick_plan_without_building_modules():
    """At scale, fixing each module costs O(kernels): once the time is up, the best list schedule stands."""
    from tvm_diviml.toolkit.heuristics import best_heuristic

    graph = random_dag(80, seed=3)
    platform = unit_platform()
    problem = Problem(graph, platform, table(platform, {k: {"A": 3.0, "B": 1.0, "C": 2.0} for k in graph.kernels}))
    plan = Split(series=False).solve(problem, deadline=Deadline.after(0))
    assert plan.attrs["modules"] == 0
    assert simulate(problem, plan).feasible
    assert plan.value_s == best_heuristic(problem).value_s
    assert Split(series=False, time_limit_s=30).solve(problem).attrs["modules"] > 0
