"""The simulator against schedules computed by hand, in every cost mode.

Links cost 1 s + 1 s per byte (``unit_platform``) unless a test says otherwise; A is the host CPU.
"""

import itertools

import pytest

from tvm_diviml.cost.base import ExecutorOverheads
from tvm_diviml.plan import Plan, ReplicaGroup
from tvm_diviml.platform import Device, Link, Platform
from tvm_diviml.problem import Problem
from tvm_diviml.simulator import PlanError, simulate

from ..helpers import graph_of, table, unit_platform


def run(graph, platform, costs, assignment, **plan_fields):
    contention = plan_fields.pop("link_contention", False)
    plan = Plan(assignment, **plan_fields)
    return simulate(Problem(graph, platform, costs), plan, link_contention=contention)


def test_chain_on_one_device_is_the_sum_of_its_kernels():
    platform = unit_platform()
    graph = graph_of([("a", "b", 5), ("b", "c", 5)])
    sim = run(graph, platform, table(platform, {"a": 1, "b": 2, "c": 3}), {"a": "A", "b": "A", "c": "A"})
    assert sim.value_s == 6
    assert (sim.start_s, sim.finish_s) == ({"a": 0, "b": 1, "c": 3}, {"a": 1, "b": 3, "c": 6})
    assert sim.transfers == []


def test_chain_crossing_devices_pays_each_transfer():
    platform = unit_platform()
    graph = graph_of([("a", "b", 2), ("b", "c", 3)])
    sim = run(graph, platform, table(platform, {"a": 1, "b": 2, "c": 3}), {"a": "A", "b": "B", "c": "A"})
    # a 0-1; 1+2 s to B -> 4; b 4-6; 1+3 s back -> 10; c 10-13
    assert sim.finish_s == {"a": 1, "b": 6, "c": 13}
    assert sim.value_s == 13


def test_diamond_with_transfers():
    platform = unit_platform()
    graph = graph_of([("s", "x", 2), ("s", "y", 2), ("x", "t", 1), ("y", "t", 3)])
    costs = table(platform, {"s": 1, "x": 2, "y": 4, "t": 1})
    sim = run(graph, platform, costs, {"s": "A", "x": "B", "y": "C", "t": "A"})
    # s 0-1; s reaches B and C at 1+3=4; x 4-6, y 4-8; x back at 6+2=8, y back at 8+4=12; t 12-13
    assert sim.start_s == {"s": 0, "x": 4, "y": 4, "t": 12}
    assert sim.value_s == 13
    assert len(sim.transfers) == 4


def test_fork_branches_run_in_parallel_on_two_devices():
    platform = unit_platform()
    graph = graph_of([("s", "x", 1), ("s", "y", 1), ("x", "t", 1), ("y", "t", 1)])
    costs = table(platform, {"s": 1, "x": 3, "y": 3, "t": 1})
    sim = run(graph, platform, costs, {"s": "A", "x": "A", "y": "B", "t": "A"})
    # x on A 1-4 overlaps y on B 3-6 (s arrives at 1+2); y back at 6+2=8; t 8-9
    assert (sim.start_s["x"], sim.finish_s["x"]) == (1, 4)
    assert (sim.start_s["y"], sim.finish_s["y"]) == (3, 6)
    assert sim.value_s == 9
    serial = run(graph, platform, costs, {k: "A" for k in "sxyt"})
    assert serial.value_s == 8  # here the transfers cost more than the overlap gains


@pytest.mark.parametrize("contention, q_start", [(False, 8), (True, 13)])
def test_link_contention_serialises_transfers_on_one_link(contention, q_start):
    platform = unit_platform()
    graph = graph_of([("p1", "q", 5), ("p2", "q", 5)])
    costs = table(platform, {"p1": 1, "p2": 1, "q": 1})
    sim = run(graph, platform, costs, {"p1": "A", "p2": "A", "q": "B"}, link_contention=contention)
    # p1 0-1 and p2 1-2 on A; each copy takes 6 s: without contention they arrive at 7 and 8,
    # with it the second waits for the first: 7 and 13.
    assert sim.start_s["q"] == q_start
    assert sim.value_s == q_start + 1


def test_tensor_consumed_twice_on_one_remote_device_is_sent_once():
    platform = unit_platform()
    graph = graph_of([("p", "q1", 4), ("p", "q2", 2)])
    sim = run(graph, platform, table(platform, {"p": 1, "q1": 1, "q2": 1}), {"p": "A", "q1": "B", "q2": "B"})
    assert len(sim.transfers) == 1
    assert sim.link_busy_s == {("A", "B"): 5}  # 1 + 4 bytes, the larger edge
    assert sim.finish_s == {"p": 1, "q1": 7, "q2": 8}


def test_model_inputs_start_on_the_host_and_outputs_return_to_it():
    platform = unit_platform()
    graph = graph_of([], kernels=["a"], inputs=[("x", 3, ["a"])], output_bytes={"a": 2})
    sim = run(graph, platform, table(platform, {"a": 1}), {"a": "B"})
    # input 1+3 s to B -> 4; a 4-5; output 1+2 s back to A -> 8
    assert sim.start_s["a"] == 4
    assert sim.value_s == 8
    on_host = run(graph, platform, table(platform, {"a": 1}), {"a": "A"})
    assert on_host.value_s == 1


def test_plan_order_is_followed_and_a_deadlocking_order_is_rejected():
    platform = unit_platform()
    graph = graph_of([("a", "b", 0)], kernels=["a", "b", "c"])
    costs = table(platform, {"a": 1, "b": 1, "c": 5})
    sim = run(graph, platform, costs, {"a": "A", "b": "A", "c": "A"}, order={"A": ["c", "a", "b"]})
    assert sim.start_s == {"c": 0, "a": 5, "b": 6}
    with pytest.raises(PlanError, match="deadlocks"):
        run(graph, platform, costs, {"a": "A", "b": "A", "c": "A"}, order={"A": ["b", "a", "c"]})
    with pytest.raises(PlanError, match="every kernel exactly once"):
        run(graph, platform, costs, {"a": "A", "b": "A", "c": "A"}, order={"A": ["a", "b"]})


def test_period_overlap_bound_by_a_link():
    platform = unit_platform()
    graph = graph_of([("a", "b", 10)])
    costs = table(platform, {"a": 1, "b": 1})
    sim = run(graph, platform, costs, {"a": "A", "b": "B"}, objective="throughput", mode="period_overlap")
    assert sim.link_busy_s == {("A", "B"): 11}
    assert sim.device_busy_s == {"A": 1, "B": 1}
    assert sim.value_s == 11
    local = run(graph, platform, costs, {"a": "A", "b": "A"}, objective="throughput", mode="period_overlap")
    assert local.value_s == 2


def test_period_overlap_replicas_share_the_stream():
    platform = unit_platform()
    graph = graph_of([("a", "b", 10)], inputs=[("x", 1, ["a"])])
    costs = table(platform, {"a": {"A": 9, "B": 4, "C": 8}, "b": {"A": 9, "B": 2, "C": 4}})
    whole = ReplicaGroup(["a", "b"], {"B": 2 / 3, "C": 1 / 3})
    sim = run(
        graph, platform, costs, {"a": "B", "b": "B"}, objective="throughput", mode="period_overlap", replicas=[whole]
    )
    # B takes 2/3 of the stream: 2/3 * 6 = 4; C 1/3 * 12 = 4; the a -> b tensor never leaves a replica;
    # the input goes from the host A to B 2/3 of the time (1 + 1 byte = 2 s) and to C 1/3.
    assert sim.device_busy_s == pytest.approx({"B": 4, "C": 4})
    assert sim.link_busy_s == pytest.approx({("A", "B"): 4 / 3, ("A", "C"): 2 / 3})
    assert sim.value_s == pytest.approx(4)
    with pytest.raises(PlanError, match="period_overlap"):
        run(graph, platform, costs, {"a": "B", "b": "B"}, replicas=[whole])


def test_period_overlap_independent_replica_groups_exchange_tensors():
    platform = unit_platform(latency=0.0)
    graph = graph_of([("a", "b", 10)])
    costs = table(platform, {"a": 1, "b": 1})
    plan_a = ReplicaGroup(["a"], {"A": 0.5, "B": 0.5})
    sim = run(
        graph, platform, costs, {"a": "A", "b": "B"}, objective="throughput", mode="period_overlap", replicas=[plan_a]
    )
    # half the inputs make a on A and must send 10 bytes to b on B; the other half are local
    assert sim.link_busy_s == pytest.approx({("A", "B"): 5})
    assert sim.device_busy_s == pytest.approx({"A": 0.5, "B": 1.5})


def test_stage_serial_charges_in_and_out_transfers_once_per_tensor():
    platform = unit_platform()
    graph = graph_of([("a", "b", 2), ("a", "c", 3), ("a", "d", 2), ("b", "d", 1), ("c", "d", 1)])
    costs = table(platform, {"a": 1, "b": 2, "c": 3, "d": 4})
    assignment = {"a": "A", "b": "A", "c": "B", "d": "B"}
    sim = run(
        graph,
        platform,
        costs,
        assignment,
        objective="pipeline",
        mode="stage_serial",
        stages=[["a", "b"], ["c", "d"]],
        stage_devices=["A", "B"],
    )
    # stage 0: work 3 + a out once (1+3) + b out (1+1) = 9; stage 1: work 7 + a in once (1+3) + b in (1+1) = 13
    assert sim.stage_cost_s == [9, 13]
    assert sim.value_s == 13


def test_stage_serial_rejects_an_edge_back_to_an_earlier_stage():
    platform = unit_platform()
    graph = graph_of([("a", "b", 1)])
    costs = table(platform, {"a": 1, "b": 1})
    with pytest.raises(PlanError, match="back to"):
        run(
            graph,
            platform,
            costs,
            {"a": "B", "b": "A"},
            objective="pipeline",
            mode="stage_serial",
            stages=[["b"], ["a"]],
            stage_devices=["A", "B"],
        )
    with pytest.raises(PlanError, match="in no stage"):
        run(
            graph,
            platform,
            costs,
            {"a": "A", "b": "A"},
            objective="pipeline",
            mode="stage_serial",
            stages=[["a"]],
            stage_devices=["A"],
        )


def test_host_staged_accelerators_pay_transfers_cpus_do_not():
    platform = unit_platform(latency=0.0, transfer_model="host_staged")
    graph = graph_of([("a", "b", 2), ("b", "c", 3), ("a", "c", 1)])
    costs = table(platform, {"a": 1, "b": 1, "c": 1})
    sim = run(graph, platform, costs, {"a": "A", "b": "B", "c": "C"}, objective="throughput", mode="host_staged")
    # A (CPU): work 1. B: work 1 + a in (2) + b out once (3) = 6. C: work 1 + b in (3) + a in (1) = 5.
    assert sim.device_busy_s == {"A": 1, "B": 6, "C": 5}
    assert sim.value_s == 6


def test_memory_counts_shared_weights_once_plus_peak_live_activations():
    platform = unit_platform(memory=100)
    graph = graph_of(
        [("a", "b", 10), ("b", "c", 20)],
        weights={"w1": 100, "w2": 50},
        kernel_weights={"a": ["w1"], "b": ["w1"], "c": ["w2"]},
        output_bytes={"a": 10, "b": 20, "c": 5},
    )
    sim = run(graph, platform, table(platform, {"a": 1, "b": 1, "c": 1}), {"a": "A", "b": "A", "c": "B"})
    # A: w1 once (100) + a and b live together (30); B: w2 (50) + b received (20) + c (5)
    assert sim.memory_bytes == {"A": 130, "B": 75}
    assert not sim.feasible
    assert any("'A' needs" in p for p in sim.problems)


def test_allowed_devices_and_colocation_are_checked():
    from tvm_diviml.graph import Edge, Kernel, OpGraph

    platform = unit_platform()
    graph = OpGraph([Kernel("a", allowed_devices=("A",), colocate="g"), Kernel("b", colocate="g")], [Edge("a", "b", 1)])
    costs = table(platform, {"a": 1, "b": 1})
    sim = run(graph, platform, costs, {"a": "B", "b": "C"})
    assert not sim.feasible
    assert any("may not run on 'B'" in p for p in sim.problems)
    assert any("co-location group 'g'" in p for p in sim.problems)
    assert run(graph, platform, costs, {"a": "A", "b": "A"}).feasible


def test_plan_that_does_not_fit_the_graph_or_platform_is_rejected():
    platform = unit_platform()
    graph = graph_of([("a", "b", 1)])
    costs = table(platform, {"a": 1, "b": 1})
    with pytest.raises(PlanError, match="unassigned"):
        run(graph, platform, costs, {"a": "A"})
    with pytest.raises(PlanError, match="unknown device 'Z'"):
        run(graph, platform, costs, {"a": "A", "b": "Z"})
    with pytest.raises(PlanError, match="does not have"):
        run(graph, platform, costs, {"a": "A", "b": "A", "zz": "A"})


def test_device_graph_cycle_is_reported():
    platform = unit_platform()
    graph = graph_of([("a", "b", 1), ("b", "c", 1)])
    costs = table(platform, {"a": 1, "b": 1, "c": 1})
    assert not run(graph, platform, costs, {"a": "A", "b": "B", "c": "A"}).device_graph_acyclic
    assert run(graph, platform, costs, {"a": "A", "b": "B", "c": "B"}).device_graph_acyclic


# ---------------------------------------------------------------------- latency as the executor runs it
def executor_table(platform, times):
    costs = table(platform, times)
    costs.executor_segments = True  # costs measured here: plans are priced as the executor runs them
    return costs


def test_executor_hands_a_segments_tensors_on_when_its_call_returns():
    """a and a2 form one segment on A; b on B reads a, but only once the segment's call has returned."""
    platform = unit_platform()
    graph = graph_of([("a", "a2", 1), ("a", "b", 1)])
    times = {"a": 1, "a2": 5, "b": 1}
    assignment = {"a": "A", "a2": "A", "b": "B"}
    assert run(graph, platform, table(platform, times), assignment).value_s == 6  # kernel by kernel
    sim = run(graph, platform, executor_table(platform, times), assignment)
    # segment A: a 0-1, a2 1-6, both handed on at 6; B copies a (1 + 1 s): 6-8, then b 8-9
    assert sim.value_s == 9
    assert sim.start_s == {"a": 0, "a2": 1, "b": 8} and sim.finish_s == {"a": 6, "a2": 6, "b": 9}
    assert [(t.tensor, t.src, t.dst, t.start_s, t.end_s) for t in sim.transfers] == [("a", "A", "B", 6, 8)]


def test_executor_charges_each_crossing_its_measured_link_time():
    platform = unit_platform()
    graph = graph_of([("a", "b", 2), ("b", "c", 3)])
    times = {"a": 1, "b": 2, "c": 3}
    alone = run(graph, platform, executor_table(platform, times), {"a": "A", "b": "A", "c": "A"}).value_s
    crossing = run(graph, platform, executor_table(platform, times), {"a": "A", "b": "B", "c": "A"}).value_s
    assert alone == 6
    assert crossing - alone == pytest.approx(platform.transfer_s(2, "A", "B") + platform.transfer_s(3, "B", "A"))


def test_executor_charges_its_overheads_per_segment_call_and_per_inference():
    """a b c d alternating over A and B: four segments and three crossings; two halves: two and one."""
    platform = unit_platform()
    graph = graph_of([("a", "b", 2), ("b", "c", 3), ("c", "d", 1)])
    times = {"a": 1, "b": 2, "c": 3, "d": 1}
    halves, alternating = {"a": "A", "b": "A", "c": "B", "d": "B"}, {"a": "A", "b": "B", "c": "A", "d": "B"}
    overheads = ExecutorOverheads(run_s=0.25, segment_s=0.5, handoff_s=0.125)

    def priced(assignment, charged):
        costs = executor_table(platform, times)
        if charged:
            costs.executor_overheads = overheads
        return run(graph, platform, costs, assignment).value_s

    for assignment, segments in ((halves, 2), (alternating, 4)):
        assert priced(assignment, True) - priced(assignment, False) == pytest.approx(0.25 + segments * 0.5)
    # two more crossings: their link times (the measured links include the hand-off) and two more calls
    extra_links = platform.transfer_s(2, "A", "B") + platform.transfer_s(1, "A", "B")
    assert priced(alternating, True) - priced(halves, True) == pytest.approx(extra_links + 2 * 0.5)


def test_streams_charge_each_device_a_segment_call_per_segment():
    """In period modes every device pays segment_s per segment call of one inference, one device or
    several (a stream always runs on the executor); costs not measured here pay nothing."""
    platform = unit_platform()
    graph = graph_of([("a", "b", 2), ("b", "c", 3), ("c", "d", 1)])
    times = {"a": 1, "b": 2, "c": 3, "d": 1}
    halves, alternating = {"a": "A", "b": "A", "c": "B", "d": "B"}, {"a": "A", "b": "B", "c": "A", "d": "B"}

    def loads(assignment, mode, costs, **fields):
        return run(graph, platform, costs, assignment, mode=mode, **fields).device_busy_s

    charged = executor_table(platform, times)
    charged.executor_overheads = ExecutorOverheads(run_s=0.25, segment_s=0.5, handoff_s=0.125)
    plain = table(platform, times)
    for assignment, per_device in (
        (halves, {"A": 1, "B": 1}),
        (alternating, {"A": 2, "B": 2}),
        (dict.fromkeys(times, "A"), {"A": 1}),
    ):
        with_calls, without = loads(assignment, "period_overlap", charged), loads(assignment, "period_overlap", plain)
        assert {d: with_calls[d] - without[d] for d in with_calls} == pytest.approx(
            {d: 0.5 * n for d, n in per_device.items()}
        )
    stages = {"stages": [["a", "b"], ["c", "d"]], "stage_devices": ["A", "B"]}
    with_calls = run(graph, platform, charged, halves, mode="stage_serial", **stages)
    without = run(graph, platform, plain, halves, mode="stage_serial", **stages)
    assert [x - y for x, y in zip(with_calls.stage_cost_s, without.stage_cost_s)] == pytest.approx([0.5, 0.5])
    assert with_calls.value_s == pytest.approx(without.value_s + 0.5)


def two_cpus():
    """Two CPU devices of one machine (A the host), 1 s + 1 s per byte between them."""
    devices = [Device(name, {"kind": "llvm"}, "cpu:0") for name in ("A", "B")]
    return Platform("cpus", devices, {(a, b): Link(a, b, 1.0, 1.0) for a in "AB" for b in "AB" if a != b})


def corun_table(platform, times, factor):
    costs = executor_table(platform, times)
    costs.executor_overheads = ExecutorOverheads(corun_factor=factor)
    return costs


def test_co_running_cpu_workers_stretch_only_the_time_they_overlap():
    """Two branches of the input, one per CPU device: where b1 and b2 run at once they take 1.5x; in a
    chain across the devices nothing overlaps and nothing is stretched; GPUs never co-run."""
    platform = two_cpus()
    graph = graph_of([("b1", "c", 1), ("b2", "c", 1)], inputs=[("x", 1, ("b1", "b2"))])
    times = {"b1": 4, "b2": 4, "c": 1}
    split = {"b1": "A", "b2": "B", "c": "A"}
    plain = run(graph, platform, corun_table(platform, times, 1.0), split)
    stretched = run(graph, platform, corun_table(platform, times, 1.5), split)
    # b1 0-4 on A; B copies x (1 + 1 s): 0-2, b2 2-6; they overlap 2-4, half of each: x1.25 each
    assert (plain.finish_s["b1"], plain.finish_s["b2"]) == (4, 6)
    assert (stretched.finish_s["b1"], stretched.finish_s["b2"]) == pytest.approx((5, 7))
    assert stretched.value_s - plain.value_s == pytest.approx(1.0)  # c waits for b2's copy: 1 s later
    chain = graph_of([("a", "b", 1), ("b", "c", 1)])
    across = {"a": "A", "b": "B", "c": "A"}
    chain_times = {"a": 1, "b": 4, "c": 1}
    assert (
        run(chain, platform, corun_table(platform, chain_times, 1.5), across).value_s
        == run(chain, platform, corun_table(platform, chain_times, 1.0), across).value_s
    )
    gpus = unit_platform(("A", "B"))  # A a CPU, B a GPU
    assert (
        run(graph, gpus, corun_table(gpus, times, 1.5), split).value_s
        == run(graph, gpus, corun_table(gpus, times, 1.0), split).value_s
    )


def test_streams_on_two_busy_cpu_devices_pay_the_corun_factor_on_their_kernels():
    platform = two_cpus()
    graph = graph_of([("a", "b", 1), ("b", "c", 1)])
    times = {"a": 1, "b": 2, "c": 3}
    halves = {"a": "A", "b": "A", "c": "B"}
    stages = {"stages": [["a", "b"], ["c"]], "stage_devices": ["A", "B"]}
    for mode, fields in (("period_overlap", {}), ("stage_serial", stages)):
        plain = run(graph, platform, corun_table(platform, times, 1.0), halves, mode=mode, **fields)
        stretched = run(graph, platform, corun_table(platform, times, 1.5), halves, mode=mode, **fields)
        assert {d: stretched.device_busy_s[d] - plain.device_busy_s[d] for d in "AB"} == pytest.approx(
            {"A": 0.5 * 3, "B": 0.5 * 3}
        ), mode
    alone = dict.fromkeys(times, "A")  # one device: nothing co-runs
    assert (
        run(graph, platform, corun_table(platform, times, 1.5), alone, mode="period_overlap").value_s
        == run(graph, platform, corun_table(platform, times, 1.0), alone, mode="period_overlap").value_s
    )


def test_executor_copies_a_tensor_once_per_device_and_inputs_from_the_host():
    platform = unit_platform()
    graph = graph_of([("a", "b", 4), ("a", "c", 4), ("b", "d", 1), ("c", "d", 1)], inputs=[("x", 2, ("a",))])
    costs = executor_table(platform, {"a": 1, "b": 1, "c": 1, "d": 1})
    sim = run(graph, platform, costs, {"a": "B", "b": "A", "c": "A", "d": "A"})
    # x to B: 0-3, a 3-4; A copies a once (1 + 4): 4-9, b 9-10, c 10-11, d 11-12
    assert sim.value_s == 12
    assert [(t.tensor, t.dst) for t in sim.transfers] == [("x", "B"), ("a", "A")]


def test_a_plan_scored_again_on_the_same_problem_is_not_simulated_again(monkeypatch):
    import tvm_diviml.simulator as simulator

    platform = unit_platform()
    graph = graph_of([("a", "b", 2), ("b", "c", 3)])
    problem = Problem(graph, platform, table(platform, {"a": 1, "b": 2, "c": 3}))
    scored = []
    real = simulator._latency
    monkeypatch.setattr(simulator, "_latency", lambda *args: scored.append(args[3].assignment) or real(*args))
    crossing = {"a": "A", "b": "B", "c": "A"}
    first = simulate(problem, Plan(dict(crossing)))
    first.value_s = -1.0  # a caller's change to its copy reaches no one else
    again = simulate(problem, Plan(dict(reversed(crossing.items()))))  # the same plan, built anew
    assert again.value_s == 13 and len(scored) == 1
    assert simulate(problem, Plan({"a": "A", "b": "A", "c": "A"})).value_s == 6 and len(scored) == 2
    assert simulate(problem, Plan(dict(crossing)), link_contention=True).value_s == 13 and len(scored) == 3
    other = Problem(graph, platform, table(platform, {"a": 2, "b": 2, "c": 3}))  # new prices: a new problem
    assert simulate(other, Plan(dict(crossing))).value_s == 14 and len(scored) == 4
    for devices in itertools.product("ABC", repeat=3):  # 27 plans: only the last KEPT_SIMULATIONS are kept
        simulate(problem, Plan(dict(zip("abc", devices))))
    assert len(problem.memo["simulations"]) == simulator.KEPT_SIMULATIONS
    scored.clear()
    simulate(problem, Plan(dict(crossing)))
    assert len(scored) == 1


# ---------------------------------------------------------------------- streams as the executor runs them
def stream_problem(segment_s=0.0, run_s=0.0, latency=0.0):
    """a -> b -> c on two identical devices, 1 s a kernel, links free unless ``latency``; costs of the
    executor given."""
    from tvm_diviml.cost.table import TableCostModel

    platform = unit_platform(("A", "B"), latency=latency, bandwidth=1e18)
    costs = TableCostModel(
        platform,
        {k: {"A": 1.0, "B": 1.0} for k in "abc"},
        executor_segments=segment_s > 0,
        executor_overheads=ExecutorOverheads(run_s=run_s, segment_s=segment_s),
    )
    return Problem(graph_of([("a", "b", 1), ("b", "c", 1)]), platform, costs, objective="throughput")


def whole_model_on(shares):
    """a, b and c replicated on the devices of ``shares``."""
    return Plan(
        dict.fromkeys("abc", "A"),
        objective="throughput",
        mode="period_overlap",
        replicas=[ReplicaGroup(list("abc"), shares)],
    )


@pytest.mark.parametrize("in_flight", [1, 2, 3, 7])
def test_a_stream_is_no_faster_than_its_load_or_its_inputs_in_flight_allow(in_flight):
    from tvm_diviml.simulator import stream_price

    problem = stream_problem()
    pipeline = Plan({"a": "A", "b": "B", "c": "B"}, objective="throughput", mode="period_overlap")
    price = stream_price(problem, pipeline, in_flight)
    assert price.load_s == simulate(problem, pipeline).value_s == 2.0
    assert price.latency_s == 3.0
    assert price.period_s == max(2.0, 3.0 / in_flight) and price.in_flight == in_flight


def test_a_pipeline_stream_hands_its_tensors_over_while_its_stages_compute():
    """The stages' devices carry their kernels; the hand-off of a's tensor to B loads the link A -> B,
    as the executor's workers start their next input meanwhile."""
    from tvm_diviml.simulator import stream_price

    problem = stream_problem(latency=0.5)
    pipeline = Plan(
        {"a": "A", "b": "B", "c": "B"},
        objective="pipeline",
        mode="stage_serial",
        stages=[["a"], ["b", "c"]],
        stage_devices=["A", "B"],
    )
    assert simulate(problem, pipeline).value_s == 2.5  # stage B: its kernels and a's tensor in
    price = stream_price(problem, pipeline, in_flight=3)
    assert price.load_s == 2.0 and price.period_s == 2.0


@pytest.mark.parametrize("in_flight", [None, 1, 3])
@pytest.mark.parametrize("segment_s", [0.0, 0.1])
def test_a_one_device_stream_is_one_inference_after_another(in_flight, segment_s):
    """One device runs one VM, one input at a time: the period is its latency as a one-device latency
    plan (none of the concurrent executor's overheads), one in flight."""
    from tvm_diviml.simulator import stream_price

    problem = stream_problem(segment_s=segment_s, run_s=0.05 if segment_s else 0.0)
    alone = Plan(dict.fromkeys("abc", "B"), objective="throughput", mode="period_overlap")
    latency = simulate(problem, Plan(dict.fromkeys("abc", "B"))).value_s
    price = stream_price(problem, alone, in_flight)
    assert price.period_s == price.latency_s == pytest.approx(latency) and price.in_flight == 1
    assert latency == pytest.approx(3.0)


def test_the_stream_chooses_enough_inputs_in_flight_to_keep_its_busiest_device_busy():
    from tvm_diviml.simulator import STREAM_SLACK, stream_price

    problem = stream_problem()
    price = stream_price(problem, whole_model_on({"A": 0.5, "B": 0.5}))
    assert price.load_s == 1.5 and price.latency_s == 3.0  # each input runs the whole model on one device
    assert price.in_flight == 2 + STREAM_SLACK and price.period_s == 1.5


def test_replicas_pay_their_routes_segment_calls_by_share_and_the_driver_bounds_the_stream():
    from tvm_diviml.simulator import stream_price

    problem = stream_problem(segment_s=0.1, run_s=0.05)
    whole = whole_model_on({"A": 0.75, "B": 0.25})
    sim = simulate(problem, whole)
    assert sim.device_busy_s["A"] == pytest.approx(0.75 * 3.1) and sim.device_busy_s["B"] == pytest.approx(0.25 * 3.1)
    # the driver's work shares the host's one core with the host's own load (A is the host CPU)
    slow_driver = stream_problem(segment_s=0.1, run_s=50.0)
    assert stream_price(slow_driver, whole).period_s == pytest.approx(0.75 * 3.1 + 50.0)
