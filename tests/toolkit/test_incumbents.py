"""The best plan and bound of a solve as they improve (``toolkit.incumbents``), as ``plan_model`` and the
CLI report them, and an interrupted solve that keeps its best plan."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings

from tvm_diviml import planning
from tvm_diviml.app.workload import load_workload
from tvm_diviml.plan import Plan
from tvm_diviml.planning import plan_model
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem, get_solver
from tvm_diviml.solvers.base import Solver
from tvm_diviml.toolkit.incumbents import Incumbents

from ..helpers import HANG_GUARD_S, Lines
from ..strategies import assignments, dag_problems


def random_problem(kernels: int, platform: str = "paper-node", objective: str = "latency") -> Problem:
    workload = load_workload(f"random:kernels={kernels},seed=3", platform, "roofline")
    return Problem(workload.graph, workload.platform, workload.costs, objective=objective)


@settings(max_examples=30, deadline=None)
@given(dag_problems(max_kernels=6).flatmap(lambda p: assignments(p[0]).map(lambda a: (p, a))))
def test_only_a_better_feasible_plan_is_kept_and_its_value_is_the_simulators(case):
    (graph, platform, costs), assignment = case
    problem = Problem(graph, platform, costs, objective="latency")
    watch = Incumbents(problem)
    one_device = Plan({k: "A" for k in graph.kernels})
    watch.offer(one_device, "first")
    watch.offer(Plan(assignment), "second")
    values = [
        simulate(problem, Plan({k: "A" for k in graph.kernels})).value_s,
        simulate(problem, Plan(assignment)).value_s,
    ]
    assert watch.best_value_s == min(values)
    assert watch.best.value_s == simulate(problem, watch.best).value_s
    assert [event.by for event in watch.trace] == (["first", "second"] if values[1] < values[0] else ["first"])


def test_the_kept_plan_is_a_copy_that_the_solver_cannot_change_afterwards():
    problem = random_problem(6)
    watch = Incumbents(problem)
    plan = get_solver("heft").solve(problem)
    watch.offer(plan, "heft")
    first = next(iter(plan.assignment))
    plan.assignment[first] = "cpu" if plan.assignment[first] != "cpu" else "rtx2080ti"
    assert watch.best.assignment[first] != plan.assignment[first]


def test_a_bound_is_kept_only_where_it_rises_and_an_infeasible_offer_is_ignored():
    problem = random_problem(6)
    watch = Incumbents(problem)
    watch.bound(2e-3, "a")
    watch.bound(1e-3, "lower")
    watch.bound(float("inf"), "infinite")
    watch.offer(Plan({k: "nowhere" for k in problem.graph.kernels}), "unknown devices")
    assert watch.lower_bound_s == 2e-3 and watch.best is None
    assert [event.by for event in watch.trace] == ["a"] and watch.first_plan() is None


def test_split_reports_every_improvement_and_ends_on_the_plan_it_returns():
    problem = random_problem(60)
    solved = plan_model(problem, "split", time_limit_s=12)  # 9 improvements here, 2 in 8 s
    plans = [event for event in solved.trace if event.kind == "plan"]
    assert plans[0].by.startswith("split: list schedule")
    values = [event.value_s for event in plans]
    assert len(values) >= 2
    assert all(later < earlier for earlier, later in zip(values, values[1:]))
    assert values[-1] == pytest.approx(solved.simulation.value_s, rel=1e-12)
    bounds = [event.lower_bound_s for event in solved.trace]
    assert bounds == sorted(bounds) and bounds[-1] == pytest.approx(solved.bound_s, rel=1e-12)
    assert [event.at_s for event in solved.trace] == sorted(event.at_s for event in solved.trace)


def solved_pipeline(solver: str, model: str, time_limit_s: float):
    """``plan_model`` on a 4-stage pipeline of ``model`` over gpu4, and its plan events."""
    workload = load_workload(model, "gpu4", "roofline")
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="pipeline", stages=4)
    solved = plan_model(problem, solver, time_limit_s=time_limit_s)
    return solved, [event for event in solved.trace if event.kind == "plan"]


def test_slicegraph_reports_its_search_and_ends_on_the_plan_it_returns():
    solved, plans = solved_pipeline("slicegraph", "random:kernels=40,seed=2", 3)
    assert plans[0].by == "slicegraph: search"
    values = [event.value_s for event in plans]
    assert all(later < earlier for earlier, later in zip(values, values[1:]))
    assert values[-1] == pytest.approx(solved.simulation.value_s, rel=1e-12)


def test_a_pipeline_has_a_plan_before_the_downset_dp_ends():
    solved, plans = solved_pipeline("downsets", "random:kernels=60,seed=5", 8)
    assert plans[0].by == "downsets: one order sliced"
    assert plans[-1].value_s == pytest.approx(solved.simulation.value_s, rel=1e-12)
    assert solved.simulation.value_s <= plans[0].value_s


def test_the_symmetric_plan_is_reported_before_the_milp_improves_it():
    workload = load_workload("llama:layers=4,hidden=128,intermediate=352", "servers:2xpaper-node", "roofline")
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="throughput")
    solved = plan_model(problem, "symmetric", time_limit_s=20)
    assert solved.trace[0].by == "symmetric: list schedules of one block on servers"  # before any larger group's solve
    assert solved.trace[0].at_s < solved.plan.solve_s
    alone = get_solver("symmetric", time_limit_s=20).solve(problem)  # no one to offer to: no first plan
    assert solved.plan.value_s == pytest.approx(alone.value_s, rel=1e-9)


def test_a_symmetric_latency_plan_comes_from_list_schedules_before_any_group_solve():
    workload = load_workload("llama:layers=4,hidden=128,intermediate=352", "servers:2xpaper-node", "roofline")
    problem = Problem(workload.graph, workload.platform, workload.costs, objective="latency")
    solved = plan_model(problem, "symmetric", time_limit_s=20)
    first = solved.trace[0]
    assert first.by == "symmetric: list schedules of one block on servers"
    assert first.at_s < solved.plan.solve_s and first.value_s >= solved.simulation.value_s
    alone = get_solver("symmetric", time_limit_s=20).solve(problem)  # the first plan changes nothing after it
    assert solved.plan.value_s == pytest.approx(alone.value_s, rel=1e-9)


def test_an_interrupt_during_the_solve_keeps_the_best_plan_found_so_far():
    problem = random_problem(60)

    raised = []

    def interrupt_at_the_first_plan(event):
        if not raised:
            raised.append(event)
            raise KeyboardInterrupt

    solved = plan_model(
        problem, "split", time_limit_s=20, listener=interrupt_at_the_first_plan, interrupt_keeps_best=True
    )
    assert solved.status == "interrupted" and solved.plan.solver == "split"
    assert raised[0].kind == "plan" and solved.simulation.value_s == pytest.approx(raised[0].value_s, rel=1e-12)
    assert 0 < solved.bound_s <= solved.value_s


def test_a_plan_offered_on_the_way_beats_a_worse_return_and_keeps_the_solves_name_and_time(monkeypatch):
    problem = random_problem(30)
    heft = get_solver("heft").solve(problem)

    class OffersThenReturnsWorse(Solver):
        name = "offers_then_returns_worse"
        inputs = ("watch",)

        def place(self, problem, deadline, *, watch=None):
            watch.offer(heft, "heft")
            time.sleep(0.2)
            kernels = problem.graph.kernels
            slowest = max(
                problem.platform.device_names, key=lambda d: sum(problem.costs.compute_s(k, d) for k in kernels)
            )
            return Plan({k: slowest for k in problem.graph.kernels}, objective="latency", mode=problem.mode)

    named = OffersThenReturnsWorse.name
    monkeypatch.setattr(
        planning,
        "get_solver",
        lambda name, **options: OffersThenReturnsWorse(**options) if name == named else get_solver(name, **options),
    )
    solved = plan_model(problem, "offers_then_returns_worse", time_limit_s=5)
    assert solved.plan.assignment == heft.assignment and solved.simulation.value_s == heft.value_s
    assert solved.plan.solver == "offers_then_returns_worse" and solved.plan.solve_s >= 0.2


def test_an_interrupt_before_any_plan_goes_on(monkeypatch):
    from tvm_diviml import planning

    class Interrupted:
        def solve(self, *args, **kwargs):
            raise KeyboardInterrupt

    monkeypatch.setattr(planning, "get_solver", lambda *args, **kwargs: Interrupted())
    with pytest.raises(KeyboardInterrupt):
        plan_model(random_problem(8), "split", time_limit_s=5, interrupt_keeps_best=True)


def test_without_interrupt_keeps_best_an_interrupt_goes_on_though_a_plan_was_found():
    def interrupt(event):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        plan_model(random_problem(60), "split", time_limit_s=20, listener=interrupt)


def test_ctrl_c_during_diviml_plan_prints_the_best_plan_so_far_and_its_gap(tmp_path):
    """Ctrl-C once the progress lines show a plan of the solver's own (split searches on for long after
    it): the command ends with that plan, its gap and the progress. The moment is that line, never a
    time; the limit is far past the hang guard, so a run that ignored the interrupt fails the test."""
    out = tmp_path / "plan.json"
    command = [sys.executable, "-m", "tvm_diviml.cli", "plan", "random:kernels=60,seed=1", "--platform", "paper-node"]
    command += ["--time-limit", "3600", "--json", str(out)]
    with open(tmp_path / "stdout.txt", "w") as stdout:
        process = subprocess.Popen(
            command,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            # a background job (CI) inherits SIGINT ignored, and Python then keeps it so: restore the default
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        progress = Lines(process.stderr)
        progress.wait_for("   (split: ")  # a best plan line of the solver's: it is still solving
        process.send_signal(signal.SIGINT)
        progress.rest()
        process.wait(timeout=HANG_GUARD_S)
    finally:
        process.kill()
    stdout, stderr = (tmp_path / "stdout.txt").read_text(), progress.tail(10_000)
    assert process.returncode == 0, stderr
    assert "stopped by an interrupt: the best plan found until then" in stdout
    assert "gap:" in stdout and "[" in stderr and "best plan" in stderr
    row = json.loads(out.read_text())
    assert row["interrupted"] and row["progress"] and row["gap"] is not None


def test_the_bound_searches_show_on_the_progress_lines_as_they_start(capsys):
    """A solve's bound phase may take most of its limit without improving anything for a long while:
    each search says when it starts and for how long it may run, and the report gives its time."""
    from tvm_diviml.cli.output import ProgressLines

    events = []
    show = ProgressLines()
    solved = plan_model(
        random_problem(40), "heft", time_limit_s=4, bound_time_limit_s=1, listener=lambda e: (events.append(e), show(e))
    )
    phases = [event for event in events if event.kind == "phase"]
    assert [event.by.split(",")[0] for event in phases] == [
        "bound: the series decomposition",
        "bound: overlap_branching",
    ]
    assert all(", up to " in event.by for event in phases)
    first_plan = next(event for event in events if event.kind == "plan")
    assert first_plan.at_s <= phases[0].at_s <= phases[1].at_s
    assert 0 < solved.bounds_s and solved.trace == events
    printed = capsys.readouterr().err
    assert all(f"{event.by} ..." in printed for event in phases)
