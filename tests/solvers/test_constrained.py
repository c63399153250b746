"""Every latency and throughput solver under the constraints real problems carry (memory against
weights and live activations, co-location, allowed devices, infinite costs, links that differ by
direction and pair), against the memory-aware brute force of ``bruteforce.py``.

Each solver returns a plan the simulator finds feasible whenever one exists (a list schedule whose
commitments leave no room hands the model to the exact MILP, and says so), or says in one clear
error that none does; its claim is the simulator's value; its value is never below the optimum and
its lower bound never above it; a claim of optimality is the optimum. The exact solvers (the MILP
and CP-SAT) prove the optimum wherever memory cannot bind (their memory model is a restriction).
"""

import math

import pytest
from hypothesis import HealthCheck, given, settings

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.plan import Plan
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, get_solver

from ..bruteforce import best_latency, best_period
from ..helpers import examples
from ..strategies import constrained_problems

RELATIVE = 1e-9
LATENCY_SOLVERS = ("milp", "cpsat", "split", "heft", "greedy")
THROUGHPUT_SOLVERS = ("milp", "split", "greedy")
EXACT = {"milp", "cpsat"}


def memory_is_unlimited(platform) -> bool:
    return all(device.memory_bytes is None for device in platform.devices)


def best_single_device(problem: Problem) -> float:
    """The fastest feasible plan that runs everything on one device (inf where none can)."""
    values = [
        simulate(
            problem,
            Plan(dict.fromkeys(problem.graph.kernels, device), objective=problem.objective, mode=problem.mode),
        )
        for device in problem.platform.device_names
    ]
    return min((sim.value_s for sim in values if sim.feasible), default=math.inf)


def check_single_device(optimum: float, problem: Problem) -> None:
    """The baseline is the fastest single device that can run the model, or a clear refusal."""
    expected = best_single_device(problem)
    solver = get_solver("fastest_single_device")
    if math.isinf(expected):
        with pytest.raises(DivimlInputError, match="no single device can run the whole model"):
            solver.solve(problem)
        return
    plan = solver.solve(problem)
    assert plan.value_s == pytest.approx(expected, rel=1e-12) and plan.value_s >= optimum * (1 - RELATIVE)


def check_against(optimum: float, problem: Problem, name: str) -> None:
    """What solver ``name`` must do on ``problem``, whose brute-force optimum is ``optimum``."""
    solver = get_solver(name, time_limit_s=30)
    if math.isinf(optimum):  # a one-line refusal, or a plan the simulator calls infeasible
        try:
            plan = solver.solve(problem)
        except DivimlInputError as refused:
            assert "\n" not in str(refused), name
            return
        assert not simulate(problem, plan).feasible, name
        return
    plan = solver.solve(problem)
    sim = simulate(problem, plan)
    assert sim.feasible, (name, sim.problems)
    assert plan.value_s == pytest.approx(sim.value_s, rel=1e-12), name
    assert plan.value_s >= optimum * (1 - RELATIVE), name
    if plan.lower_bound_s is not None:  # list schedules claim no bound
        assert plan.lower_bound_s <= optimum * (1 + RELATIVE) + 1e-12, (name, plan.lower_bound_s, optimum)
    if plan.optimal:
        assert plan.value_s == pytest.approx(optimum, rel=1e-6), name
    if name in EXACT and memory_is_unlimited(problem.platform):
        assert plan.optimal and plan.value_s == pytest.approx(optimum, rel=1e-6), name


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(constrained_problems(max_kernels=5))
def test_latency_solvers_under_constraints(case):  # ~2 s an example: CP-SAT runs in a process
    graph, platform, costs = case
    optimum, _ = best_latency(graph, platform, costs)
    problem = Problem(graph, platform, costs)
    for name in LATENCY_SOLVERS:
        check_against(optimum, problem, name)
    check_single_device(optimum, problem)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(constrained_problems(max_kernels=5))
def test_throughput_solvers_under_constraints(case):
    graph, platform, costs = case
    optimum = best_period(graph, platform, costs)
    problem = Problem(graph, platform, costs, objective="throughput")
    for name in THROUGHPUT_SOLVERS:
        check_against(optimum, problem, name)
    check_single_device(optimum, problem)
