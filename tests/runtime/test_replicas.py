"""Replicas and split batches over real ConcurrentExecutors whose segments are Python callables."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.plan import Plan, ReplicaGroup
from tvm_diviml.runtime.executor import ConcurrentExecutor, SegmentCall
from tvm_diviml.runtime.replicas import ReplicaError, ReplicatedRunner, ShareRotation, SplitBatchRunner


class Lane:
    """A one-segment executor computing ``function(x)`` on device ``device``; ``seen`` lists the inputs
    it ran (their first value), so a test can see which lane took what."""

    def __init__(self, device, function, timeout_s=10.0):
        self.seen = []
        self.device = device

        def call(name, args):
            self.seen.append(float(np.asarray(args[0]).ravel()[0]))
            return [function(args[0])]

        self.executor = ConcurrentExecutor(
            [SegmentCall("whole", device, ["input:x"], ["y"])],
            ["y"],
            make_caller=lambda device: call,
            move=lambda value, device: value,
            timeout_s=timeout_s,
        )

    def session(self):
        executor_session = self.executor.session()

        class Session:
            def submit(self, arrays):
                return executor_session.submit({"input:x": arrays[0]})

            def collect(self, ticket):
                return executor_session.collect(ticket)

            def done(self, ticket):
                return executor_session.done(ticket)

            def close(self):
                executor_session.close()

        return Session()

    @property
    def busy_s(self):
        return self.executor.busy_s

    def close(self):
        self.executor.close()


def stream_of(count):
    return [[np.full((2, 3), float(i))] for i in range(count)]


def test_outputs_come_back_in_input_order_whatever_lane_ran_them():
    slow_release = threading.Event()

    def slow(x):  # lane 0 holds its inputs until lane 1 has run ahead
        slow_release.wait(5.0)
        return x * 2

    def fast(x):
        if float(x.ravel()[0]) >= 3:
            slow_release.set()
        return x * 2

    lanes = [Lane("cpu0", slow), Lane("cpu1", fast)]
    with ReplicatedRunner(lanes, [0.5, 0.5], ["cpu0", "cpu1"]) as runner:
        outputs = list(runner.stream(stream_of(8), in_flight=6))
    assert [float(o[0].ravel()[0]) for o in outputs] == [2.0 * i for i in range(8)]
    assert lanes[0].seen and lanes[1].seen  # both lanes ran some


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 10), min_size=1, max_size=4).filter(lambda w: sum(w) > 0), st.integers(1, 60))
def test_share_rotation_honours_shares_within_one(weights, count):
    rotation = ShareRotation(weights)
    picks = [rotation.pick() for _ in range(count)]
    for lane, share in enumerate(rotation.shares):
        assert abs(picks.count(lane) - share * count) <= 1.0 + 1e-9
        if share == 0:
            assert lane not in picks


def test_stream_sends_each_lane_its_share():
    lanes = [Lane("cpu0", lambda x: x), Lane("cpu1", lambda x: x), Lane("gpu", lambda x: x)]
    with ReplicatedRunner(lanes, [0.25, 0.25, 0.5], ["cpu0", "cpu1", "gpu"]) as runner:
        list(runner.stream(stream_of(40), in_flight=4))
        assert dict(runner.sent) == {"cpu0": 10, "cpu1": 10, "gpu": 20}
    assert [len(lane.seen) for lane in lanes] == [10, 10, 20]


def test_next_free_keeps_every_lane_busy():
    lanes = [Lane("cpu0", lambda x: x), Lane("cpu1", lambda x: x)]
    with ReplicatedRunner(lanes, [0.9, 0.1], ["cpu0", "cpu1"], policy="next_free") as runner:
        outputs = list(runner.stream(stream_of(10), in_flight=2))
    assert len(outputs) == 10 and lanes[1].seen  # a small share still takes inputs when free


class ReadyLane:
    """A lane whose inputs are ready at once (``ready``) or only once collected: the driver collects in
    input order, so a fast replica's outputs can wait, done, behind a slow one's input."""

    busy_s: dict = {}

    def __init__(self, ready: bool):
        self.ready, self.seen = ready, []

    def session(self):
        lane = self

        class Session:
            def submit(self, arrays):
                lane.seen.append(float(arrays[0].ravel()[0]))
                return arrays

            def done(self, ticket):
                return lane.ready

            def collect(self, ticket):
                return [ticket[0]]

            def close(self):
                pass

        return Session()

    def close(self):
        pass


def test_next_free_sends_an_input_to_the_replica_whose_inputs_are_done_though_not_collected():
    """Inputs 0 (slow replica, running) and 1 (fast replica, done): input 2 goes to the fast one, whose
    input waits only for input 0 to be collected first (counting uncollected inputs sent it to the slow one)."""
    slow, fast = ReadyLane(ready=False), ReadyLane(ready=True)
    with ReplicatedRunner([slow, fast], [0.5, 0.5], ["slow", "fast"], policy="next_free") as runner:
        outputs = list(runner.stream(stream_of(3), in_flight=3))
    assert [float(o[0].ravel()[0]) for o in outputs] == [0.0, 1.0, 2.0]
    assert slow.seen == [0.0] and fast.seen == [1.0, 2.0]


def test_a_replica_failing_mid_stream_names_it_and_nothing_hangs():
    def breaks_on_five(x):
        if float(x.ravel()[0]) == 5:
            raise RuntimeError("device lost")
        return x

    lanes = [Lane("cpu0", lambda x: x, timeout_s=5.0), Lane("cpu1", breaks_on_five, timeout_s=5.0)]
    runner = ReplicatedRunner(lanes, [0.5, 0.5], ["cpu0", "cpu1"])
    done = []
    with pytest.raises(ReplicaError, match="replica cpu1 failed on input 5: SegmentError: .*device lost") as caught:
        for outputs in runner.stream(stream_of(12), in_flight=4):
            done.append(outputs)
    assert caught.value.replica == "cpu1" and caught.value.input_index == 5
    assert len(done) == 5  # every input before the failure came back
    with runner:  # the lanes still serve a new stream, and close
        assert len(list(runner.stream(stream_of(4), in_flight=2))) == 4


def test_bad_replica_arguments_are_refused():
    lane = Lane("cpu0", lambda x: x)
    with pytest.raises(DivimlInputError, match="one share and one name per lane"):
        ReplicatedRunner([lane], [0.5, 0.5], ["cpu0"])
    with pytest.raises(DivimlInputError, match="unknown replica policy"):
        ReplicatedRunner([lane], [1.0], ["cpu0"], policy="random")
    with pytest.raises(DivimlInputError, match="non-negative"):
        ShareRotation([0.0, 0.0])
    with pytest.raises(DivimlInputError, match="positive integer"):
        ReplicatedRunner([lane], [1.0], ["cpu0"]).stream(stream_of(2), in_flight=0)
    lane.close()


def test_a_split_batch_equals_the_whole_batch():
    lanes = [Lane("cpu0", lambda x: x * 3 + 1), Lane("cpu1", lambda x: x * 3 + 1)]
    batch = np.arange(24, dtype="float32").reshape(4, 6)
    with SplitBatchRunner(lanes, ["copy 0", "copy 1"], [True]) as runner:
        (joined,) = runner([batch])
    np.testing.assert_array_equal(joined, batch * 3 + 1)
    assert len(lanes[0].seen) == len(lanes[1].seen) == 1


def test_copies_on_one_lane_run_as_two_inputs_of_it():
    lane = Lane("cpu0", lambda x: -x)
    batch = np.arange(8, dtype="float32").reshape(4, 2)
    with SplitBatchRunner([lane, lane], ["copy 0", "copy 1"], [True]) as runner:
        outputs = list(runner.stream([[batch], [batch + 1]], in_flight=2))
    np.testing.assert_array_equal(outputs[1][0], -(batch + 1))
    assert len(lane.seen) == 4


def test_routes_of_a_replicated_plan_carry_the_shares():
    plan = Plan(
        {"a": "cpu0", "b": "cpu0", "c": "cpu1"},
        objective="throughput",
        mode="period_overlap",
        replicas=[ReplicaGroup(["b"], {"cpu0": 0.25, "gpu": 0.75}), ReplicaGroup(["c"], {"cpu1": 0.5, "gpu": 0.5})],
    )
    routes = {tuple(sorted(a.items())): share for a, share in plan.routes()}
    assert len(routes) == 4 and abs(sum(routes.values()) - 1) < 1e-12
    assert routes[(("a", "cpu0"), ("b", "gpu"), ("c", "gpu"))] == pytest.approx(0.375)
    assert Plan({"a": "cpu0"}).routes() == [({"a": "cpu0"}, 1.0)]
