"""Solvers: claims equal the simulator, and baselines equal brute force."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.plan import Plan
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, get_solver, mode_for
from tvm_diviml.solvers.base import Solver

from ..helpers import examples, graph_of, table, unit_platform
from ..strategies import DEVICES, dag_problems


@settings(max_examples=examples(60), deadline=None)
@given(data=st.data(), objective=st.sampled_from(["latency", "throughput", "pipeline"]))
def test_fastest_single_device_is_the_best_device_alone(data, objective):
    graph, platform, costs = data.draw(dag_problems())
    problem = Problem(graph, platform, costs, objective=objective, stages=3)
    plan = get_solver("fastest_single_device").solve(problem)
    assert plan.mode == problem.mode and plan.solver == "fastest_single_device"
    assert plan.value_s == simulate(Problem(graph, platform, costs), plan).value_s
    alone = []
    for device in DEVICES:
        candidate = Plan(
            {k: device for k in graph.kernels},
            objective=objective,
            mode=problem.mode,
            stages=[graph.topo_order] if objective == "pipeline" else None,
            stage_devices=[device] if objective == "pipeline" else None,
        )
        alone.append(simulate(Problem(graph, platform, costs), candidate).value_s)
    assert plan.value_s == min(alone)
    assert [plan.attrs["per_device"][d]["value_s"] for d in DEVICES] == alone


def test_single_device_skips_devices_that_cannot_hold_the_model():
    platform = unit_platform(memory=50)
    graph = graph_of([("a", "b", 1)], weights={"w": 60}, kernel_weights={"a": ["w"]})
    costs = table(platform, {"a": {"A": 5, "B": 1, "C": 1}, "b": 1})
    with pytest.raises(DivimlInputError, match="no single device can run the whole model"):
        get_solver("fastest_single_device").solve(Problem(graph, platform, costs))
    big = unit_platform(memory=None)
    plan = get_solver("fastest_single_device").solve(
        Problem(graph, big, table(big, {"a": {"A": 5, "B": 1, "C": 1}, "b": 1}))
    )
    assert set(plan.assignment.values()) == {"B"}


def test_unknown_solver_and_objective_are_named():
    with pytest.raises(DivimlInputError, match="unknown solver 'magic'"):
        get_solver("magic")
    with pytest.raises(DivimlInputError, match="unknown objective"):
        mode_for("speed", unit_platform())
    assert mode_for("throughput", unit_platform(transfer_model="host_staged")) == "host_staged"
    assert mode_for("throughput", unit_platform()) == "period_overlap"


def test_a_call_hands_its_inputs_only_to_the_solvers_that_declare_them():
    # heft declares none: a hint and a session pass it by (a place(problem, deadline) would refuse
    # them); cpsat declares both and starts from the hint where it finds nothing better.
    platform = unit_platform()
    graph = graph_of([("a", "b", 1), ("a", "c", 1)])
    problem = Problem(graph, platform, table(platform, {"a": 1, "b": 2, "c": 2}))
    hint = Plan({"a": "A", "b": "A", "c": "B"})
    assert get_solver("heft").inputs == () and set(get_solver("cpsat").inputs) == {"hint", "session"}
    heft = get_solver("heft").solve(problem, hint=hint, session=object())
    assert heft.assignment == get_solver("heft").solve(problem).assignment
    with pytest.raises(DivimlInputError, match="unassigned"):  # the hint reached cpsat, which checked it
        get_solver("cpsat").solve(problem, hint=Plan({"a": "A"}))


def test_a_claim_the_simulator_refutes_loses_its_proof_of_optimality(caplog):
    """A solver that claims less than the simulator says proved optimality of the claim, not of the
    plan: the report must not call the plan optimal unless its bound meets the simulator's value."""

    class Overclaims(Solver):
        name = "overclaims"

        def place(self, problem, deadline):
            plan = Plan({k: "A" for k in problem.graph.kernels}, objective=problem.objective, mode=problem.mode)
            plan.value_s = plan.lower_bound_s = 1.0
            plan.optimal = True
            return plan

    platform = unit_platform()
    problem = Problem(graph_of([("a", "b", 1)]), platform, table(platform, {"a": 1, "b": 1}))
    plan = Overclaims().solve(problem)
    assert "overclaims claimed 1 s, the simulator says 2 s" in caplog.text
    assert plan.value_s == 2.0 and not plan.optimal
