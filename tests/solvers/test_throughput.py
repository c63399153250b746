"""Throughput placement (period_overlap): the exact MILP, the balancing greedy, split, replicas.

Links cost latency + bytes / bandwidth (``unit_platform``: 1 s + 1 s per byte unless told); A is
the host. The brute force enumerates every assignment and takes the simulator's period.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_diviml.bounds import lp_load_bound
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import Edge, Kernel, OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, get_solver
from tvm_diviml.solvers.replicas import whole_model_replicas
from tvm_diviml.synthetic import random_dag
from tvm_diviml.toolkit.deadline import Deadline
from tvm_diviml.toolkit.throughput_model import ThroughputModel

from ..bruteforce import best_period
from ..helpers import examples, graph_of, table, unit_platform
from ..strategies import dag_problems


def period_optimum(problem, fixed=None):
    return best_period(problem.graph, problem.platform, problem.costs, fixed)


def solve(problem, solver, **options):
    """Solve and check the promise every plan makes: its claim is the simulator's value of it."""
    plan = get_solver(solver, **options).solve(problem)
    sim = simulate(problem, plan)
    assert (plan.objective, plan.mode) == ("throughput", "period_overlap")
    assert plan.value_s == pytest.approx(sim.value_s, rel=1e-12)
    assert sim.feasible, sim.problems
    return plan


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dag_problems(max_kernels=6), st.sampled_from([1.0, 0.25]))
def test_milp_equals_brute_force_and_every_claim_is_simulated(case, compute_scale):
    graph, platform, costs = case
    # Scaled-down compute lets transfers (inputs, tensors, outputs) set the period more often.
    costs = table(
        platform, {k: {d: costs.compute_s(k, d) * compute_scale for d in platform.device_names} for k in graph.kernels}
    )
    problem = Problem(graph, platform, costs, objective="throughput")
    optimum = period_optimum(problem)
    plan = solve(problem, "milp", time_limit_s=60)
    assert plan.optimal
    assert plan.value_s == pytest.approx(optimum, rel=1e-6, abs=1e-9)
    # The model charges exactly what the simulator charges: at the optimum the two agree.
    assert plan.attrs["milp_objective_s"] == pytest.approx(plan.value_s, rel=1e-6, abs=1e-9)
    assert plan.lower_bound_s <= optimum * (1 + 1e-6) + 1e-9
    assert lp_load_bound(problem) <= optimum * (1 + 1e-9)
    for name in ("greedy", "split"):
        assert solve(problem, name, time_limit_s=20).value_s >= optimum * (1 - 1e-9)
    replicated = solve(problem, "replicas", time_limit_s=20, base="greedy")
    assert replicated.value_s >= lp_load_bound(problem) * (1 - 1e-9)  # the bound that holds with replicas


def test_a_tensor_crosses_once_per_device_at_its_largest_edge():
    # u on A feeds v (1 byte) and w (5 bytes), both best on B: link A->B carries u's tensor once at 5 bytes
    # (1 + 5 = 6 s), not 2 + 6 s. With v and w on B, B's load is 2 s: the period is 6 s. Keeping w on A
    # instead costs 10 s there. u, v, w all on A: 1 + 10 + 10 = 21 s. So 6 s is the optimum.
    graph = graph_of([("u", "v", 1), ("u", "w", 5)])
    platform = unit_platform()
    costs = table(
        platform, {"u": {"A": 1, "B": 50, "C": 50}, "v": {"A": 10, "B": 1, "C": 10}, "w": {"A": 10, "B": 1, "C": 10}}
    )
    problem = Problem(graph, platform, costs, objective="throughput")
    plan = solve(problem, "milp")
    assert plan.optimal and plan.value_s == pytest.approx(6.0) == pytest.approx(period_optimum(problem))
    assert plan.assignment == {"u": "A", "v": "B", "w": "B"}


def test_inputs_and_outputs_load_the_host_links():
    # One kernel, 1 s on B, 5 s on A (the host). On B it reads a 2-byte input (1 + 2 = 3 s on A->B) and
    # returns a 3-byte output (1 + 3 = 4 s on B->A): period 4 s, better than 5 s on A.
    graph = graph_of([], kernels=["k"], inputs=[("x", 2, ["k"])], outputs=["k"], output_bytes={"k": 3})
    platform = unit_platform(("A", "B"))
    problem = Problem(graph, platform, table(platform, {"k": {"A": 5, "B": 1}}), objective="throughput")
    plan = solve(problem, "milp")
    assert plan.assignment == {"k": "B"} and plan.value_s == pytest.approx(4.0) and plan.optimal


def test_memory_allowed_devices_and_colocation_are_respected():
    # Weights of 6 bytes on devices that hold 10: one weight per device, but p and q share theirs. r may
    # run only on C; p and q (3 s each) must share a device; s takes 2 s on C and 7 s elsewhere. Without
    # memory s would join r on C (period 6); with it C holds only r's weight, so s runs 7 s on the GPU
    # that p and q leave free: period 7.
    kernels = [
        Kernel("p", weights=("wp",), colocate="pq"),
        Kernel("q", weights=("wp",), colocate="pq"),
        Kernel("r", weights=("wr",), allowed_devices=("C",)),
        Kernel("s", weights=("ws",)),
    ]
    graph = OpGraph(
        kernels, [Edge("p", "q", 0), Edge("q", "r", 0), Edge("r", "s", 0)], weights={"wp": 6, "wr": 6, "ws": 6}
    )
    platform = unit_platform(memory=10)
    costs = table(platform, {"p": 3, "q": 3, "r": 4, "s": {"A": 7, "B": 7, "C": 2}})
    problem = Problem(graph, platform, costs, objective="throughput")
    plan = solve(problem, "milp")
    assert plan.assignment["r"] == "C" and plan.assignment["p"] == plan.assignment["q"] != plan.assignment["s"] != "C"
    assert plan.value_s == pytest.approx(period_optimum(problem)) == pytest.approx(7.0)
    # Memory can bind, so the model is a restriction: no bound and no proof.
    assert plan.attrs["memory_restricts_bound"] and not plan.optimal and plan.lower_bound_s is None
    for name in ("greedy", "split", "replicas"):
        other = solve(problem, name, time_limit_s=20)
        assert other.assignment["r"] == "C" and other.value_s >= 7.0 - 1e-9


def test_whole_model_replicas_split_the_stream_by_speed():
    # One kernel, 3 s on A and 1 s on B, no transfers: B alone takes 1 s a period; with shares 1/4 and
    # 3/4 (speeds 1/3 and 1) A works 3/4 s and B 3/4 s per input, so the period is 0.75 s.
    graph = graph_of([], kernels=["k"])
    platform = unit_platform(("A", "B"))
    problem = Problem(graph, platform, table(platform, {"k": {"A": 3, "B": 1}}), objective="throughput")
    plan = solve(problem, "replicas", base="milp")
    assert plan.value_s == pytest.approx(0.75)
    assert plan.replicas_option == "whole_model"
    assert plan.replicas[0].shares == pytest.approx({"A": 0.25, "B": 0.75})
    assert whole_model_replicas(problem).value_s == pytest.approx(0.75)


def test_stage_replicas_spread_the_bottleneck_stage():
    # a (1 s) runs only on A; b takes 3 s anywhere; the edge is free. Without replicas the best is a on A,
    # b on B: 3 s. Only A can run the whole model, so no whole-model replicas. Giving b's stage a share y on
    # A: A works 1 + 3y, B 3(1 - y), equal at y = 1/3: period 2 s.
    graph = OpGraph([Kernel("a", allowed_devices=("A",)), Kernel("b")], [Edge("a", "b", 0)])
    platform = unit_platform(("A", "B"))
    problem = Problem(graph, platform, table(platform, {"a": 1, "b": 3}), objective="throughput")
    assert solve(problem, "milp").value_s == pytest.approx(3.0)
    plan = solve(problem, "replicas", base="milp")
    assert plan.replicas_option == "stages" and plan.attrs["option_values_s"]["whole_model"] is None
    assert plan.value_s == pytest.approx(2.0)
    assert [g.kernels for g in plan.replicas] == [["b"]]
    assert plan.replicas[0].shares == pytest.approx({"A": 1 / 3, "B": 2 / 3})


def test_window_model_with_the_rest_fixed_equals_brute_force():
    graph = random_dag(7, seed=3)
    platform = unit_platform(latency=0.5, bandwidth=2e5)
    times = {
        k: {d: 1.0 + (i * 7 + j * 3) % 5 for j, d in enumerate(platform.device_names)}
        for i, k in enumerate(graph.topo_order)
    }
    problem = Problem(graph, platform, table(platform, times), objective="throughput")
    window = graph.topo_order[2:5]
    fixed = {k: platform.device_names[i % 3] for i, k in enumerate(graph.topo_order) if k not in window}
    model = ThroughputModel(problem, window, fixed)
    found = model.solve(Deadline.after(30))
    assert found.optimal and set(found.assignment) == set(window)
    plan = Plan({**fixed, **found.assignment}, objective="throughput", mode="period_overlap")
    value = simulate(Problem(graph, platform, problem.costs), plan).value_s
    assert found.period_s == pytest.approx(value, rel=1e-6)
    assert value == pytest.approx(period_optimum(problem, fixed), rel=1e-6)


def test_split_is_deterministic_and_never_worse_than_greedy():
    graph = random_dag(24, seed=5)
    platform = unit_platform(latency=1e-5, bandwidth=1e9)
    times = {
        k: {d: (1 + (i * 5 + j * 7) % 9) * 1e-4 for j, d in enumerate(platform.device_names)}
        for i, k in enumerate(graph.topo_order)
    }
    problem = Problem(graph, platform, table(platform, times), objective="throughput")
    first = solve(problem, "split", seed=3, module_size=8, time_limit_s=60)
    again = solve(problem, "split", seed=3, module_size=8, time_limit_s=60)
    greedy = solve(problem, "greedy")
    assert first.assignment == again.assignment and first.value_s == again.value_s
    assert first.value_s <= greedy.value_s
    assert first.attrs["modules"] > 1 and first.attrs["windows_solved"] >= first.attrs["modules"]


def test_host_staged_platforms_are_refused_with_a_pointer():
    graph = graph_of([("a", "b", 1)])
    platform = unit_platform(transfer_model="host_staged")
    problem = Problem(graph, platform, table(platform, {"a": 1, "b": 1}), objective="throughput")
    for name in ("milp", "greedy", "split", "replicas"):
        with pytest.raises(DivimlInputError) as error:
            get_solver(name).solve(problem)
        assert "downsets" in error.value.hint


def test_the_load_lp_takes_identical_devices_as_one_class_of_their_size():
    # Six 1 s kernels, each a 1-byte model output (2 s back to the host A), on A and three identical
    # devices B, C, D: each of those takes at most T / 2 of the kernels (its link returns 2 s a kernel),
    # A takes T, so T + 3T / 2 = 6: 2.4. The period at best is 3 (A three kernels, the others one each).
    platform = unit_platform(devices=("A", "B", "C", "D"))
    graph = graph_of([], kernels=list("uvwxyz"), output_bytes={k: 1 for k in "uvwxyz"})
    problem = Problem(graph, platform, table(platform, {k: 1 for k in "uvwxyz"}), objective="throughput")
    assert lp_load_bound(problem) == pytest.approx(2.4, rel=1e-5) and period_optimum(problem) == pytest.approx(3.0)
    alike = Problem(graph, platform, table(platform, {k: 1 for k in "uvwxyz"}), objective="latency")
    assert lp_load_bound(alike) == pytest.approx(6 / 4, rel=1e-5)  # no host terms: all four one class
