"""ConcurrentExecutor with pure-Python fakes for the segment calls and the device copies."""

import threading
import time
import weakref
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.runtime.executor import ConcurrentExecutor, SegmentCall, SegmentError, SegmentTimeoutError
from tvm_diviml.segments import segment_boundaries, split_segments

from ..helpers import HANG_GUARD_S, examples, wait_until
from ..strategies import assignments, dag_problems


def executor_of(functions, calls, outputs, *, move=None, timeout_s=10.0):
    """An executor whose segment ``name`` runs ``functions[name](*args)`` (a tuple of results)."""

    def make_caller(device):
        return lambda name, args: functions[name](*args)

    return ConcurrentExecutor(
        calls, outputs, make_caller=make_caller, move=move or (lambda value, device: value), timeout_s=timeout_s
    )


def sleeping(seconds, result=0, spans=None, name=None):
    """A call that sleeps ``seconds``; with ``spans``, it appends (name, start, end) there."""

    def call(*args):
        began = time.perf_counter()
        time.sleep(seconds)
        if spans is not None:
            spans.append((name, began, time.perf_counter()))
        return [result]

    return call


def overlap(first, second) -> bool:
    """Whether two (name, start, end) spans ran at the same time (not: how fast; a loaded machine
    stretches both)."""
    return max(first[1], second[1]) < min(first[2], second[2])


# ---------------------------------------------------------------------- concurrency
def two_branches(left_device, right_device, spans):
    calls = [
        SegmentCall("left", left_device, ["input:x"], ["l"]),
        SegmentCall("right", right_device, ["input:x"], ["r"]),
    ]
    return executor_of(
        {"left": sleeping(0.2, "L", spans, "left"), "right": sleeping(0.2, "R", spans, "right")}, calls, ["l", "r"]
    )


def test_branches_on_two_devices_overlap():
    serial_spans, parallel_spans = [], []
    with two_branches("A", "A", serial_spans) as serial, two_branches("A", "B", parallel_spans) as parallel:
        assert serial.run({"input:x": 1}) == ["L", "R"]
        assert parallel.run({"input:x": 1}) == ["L", "R"]
        assert overlap(*parallel_spans) and not overlap(*serial_spans)
        assert parallel.busy_s["A"] >= 0.2 and parallel.busy_s["B"] >= 0.2
        assert serial.busy_s["A"] >= 0.4
        assert min(parallel.segment_s.values()) >= 0.2


def test_a_device_cycle_still_pipelines_inputs():
    """cpu0 -> cpu1 -> cpu0: while cpu1 works on input i, cpu0 starts input i+1 (a worker takes any
    ready task, not the next one in a fixed order), so the period is the largest device load."""
    spans = []
    functions = {
        "a": sleeping(0.05, spans=spans, name="a"),
        "b": sleeping(0.05, spans=spans, name="b"),
        "c": sleeping(0.001),
    }
    cycle = [
        SegmentCall("a", "cpu0", ["input:x"], ["ta"]),
        SegmentCall("b", "cpu1", ["ta"], ["tb"]),
        SegmentCall("c", "cpu0", ["tb"], ["tc"]),
    ]
    with executor_of(functions, cycle, ["tc"]) as executor:
        assert len(list(executor.stream(({"input:x": 0} for _ in range(8)), in_flight=3))) == 8
    a_spans = [span for span in spans if span[0] == "a"]
    b_spans = [span for span in spans if span[0] == "b"]
    assert sum(overlap(a, b) for a in a_spans for b in b_spans) >= 4  # cpu0 and cpu1 busy at once


# ---------------------------------------------------------------------- values
class Tagged:
    """A fake tensor: which kernel (or input) made it, its number, the device it lives on."""

    def __init__(self, key, number, device):
        self.key, self.number, self.device = key, number, device


def kernel_value(graph, kernel, values):
    """An arithmetic kernel: a function of its position and of what it reads, in a fixed order."""
    number = graph.position[kernel] + 1
    for i, edge in enumerate(graph.pred[kernel]):
        number += (i + 2) * values[edge.src]
    for graph_input in graph.inputs:
        if kernel in graph_input.consumers:
            number += 3 * values[f"input:{graph_input.name}"]
    return number % 100003


def segment_function(graph, seg, calls_by_name):
    call = calls_by_name[seg.name]

    def run(*args):
        assert all(arg.device == seg.device for arg in args), "a tensor was not moved to the segment's device"
        values = {key: arg.number for key, arg in zip(call.reads, args)}
        for kernel in seg.kernels:
            values[kernel] = kernel_value(graph, kernel, values)
        return [Tagged(key, values[key], seg.device) for key in call.writes]

    return run


@settings(max_examples=examples(40), deadline=None)
@given(dag_problems(max_kernels=9).flatmap(lambda p: st.tuples(st.just(p[0]), assignments(p[0]))))
def test_outputs_match_a_serial_evaluation_and_each_tensor_moves_once_per_device(problem):
    graph, assignment = problem
    segments = split_segments(graph, assignment, graph.topo_order)
    boundaries = segment_boundaries(graph, segments)
    calls = [
        SegmentCall(
            seg.name,
            seg.device,
            [f"input:{n}" for n in boundaries[seg.name].inputs] + list(boundaries[seg.name].reads),
            list(boundaries[seg.name].writes),
        )
        for seg in segments
    ]
    calls_by_name = {call.name: call for call in calls}
    moves = []

    def move(value, device):
        moves.append((value.key, device))
        return Tagged(value.key, value.number, device)

    functions = {seg.name: segment_function(graph, seg, calls_by_name) for seg in segments}
    xs = [3, 5, 8]
    with executor_of(functions, calls, graph.outputs, move=move) as executor:
        results = list(executor.stream([{"input:x": Tagged("input:x", x, "host")} for x in xs], in_flight=2))
    for x, result in zip(xs, results):
        values = {"input:x": x}
        for kernel in graph.topo_order:
            values[kernel] = kernel_value(graph, kernel, values)
        assert [t.number for t in result] == [values[k] for k in graph.outputs]
        assert [t.device for t in result] == [assignment[k] for k in graph.outputs]
    expected = {
        (key, call.device)
        for call in calls
        for key in call.reads
        if key.startswith("input:") or assignment[key] != call.device
    }
    assert Counter(moves) == Counter({pair: len(xs) for pair in expected})


def test_a_tensor_is_dropped_once_its_last_reader_is_done():
    """t1 (made on A, read on B) must be gone, on both devices, while the third segment runs."""
    alive = weakref.WeakValueDictionary()
    seen_by_third = []

    def make(key, number, device):
        tensor = Tagged(key, number, device)
        alive[(key, device)] = tensor
        return tensor

    functions = {
        "first": lambda x: [make("t1", x.number + 1, "A")],
        "second": lambda t1: [make("t2", t1.number * 2, "B")],
        "third": lambda t2: (seen_by_third.append(sorted(alive.keys())), [make("out", t2.number + 1, "A")])[1],
    }
    calls = [
        SegmentCall("first", "A", ["input:x"], ["t1"]),
        SegmentCall("second", "B", ["t1"], ["t2"]),
        SegmentCall("third", "A", ["t2"], ["out"]),
    ]
    with executor_of(functions, calls, ["out"], move=lambda v, d: make(v.key, v.number, d)) as executor:
        [out] = executor.run({"input:x": Tagged("input:x", 4, "host")})
    assert out.number == 11
    assert seen_by_third == [[("t2", "A"), ("t2", "B")]]


# ---------------------------------------------------------------------- streams
def test_stream_yields_in_input_order_when_later_inputs_finish_first():
    finished = []
    lock = threading.Lock()
    second_of_1_done = threading.Event()

    def slow_first(x):
        if x == 0:  # input 1, in flight too, finishes its second segment first
            second_of_1_done.wait(HANG_GUARD_S)
        with lock:
            finished.append(("first", x))
        return [x + 1]

    def fast_second(x):
        with lock:
            finished.append(("second", x))
        if x == 1:
            second_of_1_done.set()
        return [10 * x]

    calls = [SegmentCall("first", "A", ["input:x"], ["a"]), SegmentCall("second", "B", ["input:x"], ["b"])]
    with executor_of(
        {"first": slow_first, "second": fast_second}, calls, ["a", "b"], timeout_s=2 * HANG_GUARD_S
    ) as executor:
        results = list(executor.stream(({"input:x": i} for i in range(10)), in_flight=3))
    assert results == [[i + 1, 10 * i] for i in range(10)]
    assert finished.index(("second", 1)) < finished.index(("first", 0)), "no input overtook another"


@pytest.mark.parametrize("in_flight", [1, 3])
def test_stream_keeps_at_most_in_flight_inputs_started_and_consumes_lazily(in_flight):
    started, pulled = set(), []

    def record(x):
        started.add(x)
        return [x]

    def inputs():
        for i in range(8):
            pulled.append(i)
            yield {"input:x": i}

    calls = [SegmentCall("a", "A", ["input:x"], ["a"]), SegmentCall("b", "B", ["a"], ["b"])]
    with executor_of({"a": record, "b": lambda a: [a]}, calls, ["b"]) as executor:
        for j, result in enumerate(executor.stream(inputs(), in_flight=in_flight)):
            assert result == [j]
            # the workers run ahead: every input in flight besides j starts while the caller holds j
            ahead = set(range(j + 1, min(j + in_flight, 8)))
            wait_until(lambda ahead=ahead: ahead <= started, f"inputs {sorted(ahead)} started while {j} is held")
            assert max(started) <= j + in_flight - 1 and len(pulled) <= j + in_flight


# ---------------------------------------------------------------------- failures
def test_a_failing_segment_surfaces_with_its_name_and_the_executor_recovers():
    def fragile(x):
        if x < 0:
            raise ValueError("negative input")
        return [x]

    calls = [
        SegmentCall("fine", "A", ["input:x"], ["a"]),
        SegmentCall("fragile", "B", ["input:x"], ["b"]),
        SegmentCall("join", "A", ["a", "b"], ["c"]),
    ]
    with executor_of(
        {"fine": lambda x: [x], "fragile": fragile, "join": lambda a, b: [a + b]}, calls, ["c"], timeout_s=5.0
    ) as executor:
        with pytest.raises(SegmentError, match="segment 'fragile' on device 'B'.*negative input") as info:
            executor.run({"input:x": -1})
        assert isinstance(info.value.__cause__, ValueError) and info.value.segment == "fragile"
        assert executor.run({"input:x": 2}) == [4]


def test_a_wrong_number_of_results_is_an_error_of_that_segment():
    calls = [SegmentCall("pair", "A", ["input:x"], ["a", "b"])]
    with executor_of({"pair": lambda x: [x]}, calls, ["a"]) as executor:
        with pytest.raises(SegmentError, match="'pair'.*returned 1 values, expected 2"):
            executor.run({"input:x": 1})


@pytest.mark.parametrize("read_by_another", [True, False])
def test_a_hung_call_hits_the_timeout_with_its_name(read_by_another, caplog):
    release, returned = threading.Event(), threading.Event()

    def stuck(x):
        release.wait(10)
        returned.set()
        return [x]

    calls = [SegmentCall("stuck", "B", ["input:x"], ["s"])]
    if read_by_another:
        calls.append(SegmentCall("after", "A", ["s"], ["t"]))
    before = threading.active_count()
    executor = executor_of({"stuck": stuck, "after": lambda s: [s]}, calls, [calls[-1].writes[0]], timeout_s=0.3)
    with pytest.raises(SegmentTimeoutError, match="segment 'stuck' on device 'B'") as info:
        executor.run({"input:x": 1})
    assert not returned.is_set() and info.value.segment == "stuck"  # raised while the call still hangs
    executor.close()  # does not wait for the hung worker, says so
    assert "diviml-B did not stop" in caplog.text
    release.set()  # the call returns; its worker then ends by itself
    wait_until(lambda: threading.active_count() <= before, "the hung worker ended once its call returned")
    assert threading.active_count() == before


CROSSING = [SegmentCall("make", "A", ["input:x"], ["a"]), SegmentCall("use", "B", ["a"], ["b"])]
CROSSING_FUNCTIONS = {"make": lambda x: [x], "use": lambda a: [a * 10]}


def test_a_failing_move_names_the_tensor_and_the_segment_and_the_executor_recovers():
    broken = {"now": True}

    def move(value, device):
        if broken["now"] and device == "B":
            raise ConnectionError("link down")
        return value

    with executor_of(CROSSING_FUNCTIONS, CROSSING, ["b"], move=move, timeout_s=5.0) as executor:
        with pytest.raises(
            SegmentError, match="segment 'use' on device 'B' could not move tensor 'a'.*link down"
        ) as info:
            executor.run({"input:x": 1})
        assert info.value.segment == "use" and isinstance(info.value.__cause__, ConnectionError)
        broken["now"] = False
        assert executor.run({"input:x": 2}) == [20]


def test_a_hung_move_hits_the_timeout_naming_the_tensor():
    release = threading.Event()

    def move(value, device):
        if device == "B":
            release.wait(10)
        return value

    executor = executor_of(CROSSING_FUNCTIONS, CROSSING, ["b"], move=move, timeout_s=0.3)
    try:
        with pytest.raises(SegmentTimeoutError, match="segment 'use' on device 'B' has waited .* for tensor 'a'"):
            executor.run({"input:x": 1})
    finally:
        release.set()
        executor.close()


def test_a_failure_with_inputs_in_flight_stops_the_stream_and_the_executor_recovers():
    started = []

    def fragile(x):
        started.append(x)
        if x == 2:
            raise ValueError("bad input")
        time.sleep(0.01)
        return [x]

    calls = [SegmentCall("fragile", "A", ["input:x"], ["a"]), SegmentCall("next", "B", ["a"], ["b"])]
    with executor_of({"fragile": fragile, "next": lambda a: [a]}, calls, ["b"], timeout_s=5.0) as executor:
        seen = []
        with pytest.raises(SegmentError, match="segment 'fragile'.*input 2.*bad input") as info:
            for outputs in executor.stream(({"input:x": i} for i in range(100)), in_flight=4):
                seen.append(outputs[0])
        assert info.value.input_index == 2 and seen == [0, 1][: len(seen)]  # the failure ends the stream at once
        assert max(started) < 2 + 4  # nothing past the inputs in flight was started
        assert executor.run({"input:x": 7}) == [7]


def test_a_stream_abandoned_early_starts_nothing_more():
    started = []

    def work(x):
        started.append(x)
        time.sleep(0.01)
        return [x]

    calls = [SegmentCall("work", "A", ["input:x"], ["a"]), SegmentCall("next", "B", ["a"], ["b"])]
    with executor_of({"work": work, "next": lambda a: [a]}, calls, ["b"], timeout_s=5.0) as executor:
        stream = executor.stream(({"input:x": i} for i in range(100)), in_flight=3)
        assert [next(stream) for _ in range(2)] == [[0], [1]]
        stream.close()
        time.sleep(0.1)  # time for the workers to go on if they would
        assert len(started) <= 2 + 3
        assert executor.run({"input:x": 5}) == [5]


def test_a_caller_that_cannot_be_made_fails_the_run():
    def make_caller(device):
        raise OSError("no such device")

    calls = [SegmentCall("a", "A", ["input:x"], ["a"])]
    with ConcurrentExecutor(calls, ["a"], make_caller=make_caller, move=lambda v, d: v, timeout_s=5) as executor:
        with pytest.raises(SegmentError, match="caller for device 'A'.*no such device"):
            executor.run({"input:x": 1})


# ---------------------------------------------------------------------- threads and input checks
def test_one_caller_per_device_made_in_its_worker_and_close_joins_the_threads():
    made = []

    def make_caller(device):
        home = threading.current_thread()
        made.append((device, home.name))

        def call(name, args):
            assert threading.current_thread() is home
            return [args[0] + 1]

        return call

    calls = [SegmentCall(f"s{i}", device, [f"t{i}"], [f"t{i + 1}"]) for i, device in enumerate("ABCA")]
    before = threading.active_count()
    executor = ConcurrentExecutor(calls, ["t4"], make_caller=make_caller, move=lambda v, d: v, timeout_s=5)
    assert threading.active_count() == before + 3
    assert [executor.run({"t0": i}) for i in range(3)] == [[4], [5], [6]]
    executor.close()
    assert threading.active_count() == before
    assert sorted(made) == [("A", "diviml-A"), ("B", "diviml-B"), ("C", "diviml-C")]
    with pytest.raises(RuntimeError, match="closed"):
        executor.run({"t0": 0})


def test_bad_segment_lists_and_inputs_are_refused():
    ok = [SegmentCall("a", "A", ["input:x"], ["a"])]
    with pytest.raises(DivimlInputError, match="does not come before"):
        executor_of({}, [SegmentCall("b", "B", ["a"], ["b"])] + ok, ["b"])
    with pytest.raises(DivimlInputError, match="both write 'a'"):
        executor_of({}, ok + [SegmentCall("b", "B", [], ["a"])], ["a"])
    with executor_of({"a": lambda x: [x]}, ok, ["a"]) as executor:
        with pytest.raises(DivimlInputError, match="lacks \\['input:x'\\]") as info:
            executor.run({"input:y": 1})
        assert info.value.field == "inputs"
        with pytest.raises(DivimlInputError, match="in_flight"):
            executor.stream([], in_flight=0)


# ---------------------------------------------------------------------- overheads
def test_the_overhead_fit_recovers_known_costs_and_never_goes_negative():
    from tvm_diviml.profiling.overheads import fit_executor_overheads

    def seconds_per_run(segments, devices):  # 50 us per inference, 10 us per call, 40 us per hand-off
        return 50e-6 + 10e-6 * segments + (40e-6 * (segments - 1) if devices > 1 else 0.0)

    fitted = fit_executor_overheads(seconds_per_run)
    assert fitted.run_s == pytest.approx(50e-6) and fitted.segment_s == pytest.approx(10e-6)
    assert fitted.handoff_s == pytest.approx(40e-6)
    noisy = fit_executor_overheads(lambda segments, devices: 5e-6 if devices > 1 else 40e-6 / segments)
    assert noisy.run_s == 40e-6 and noisy.segment_s == 0.0 and noisy.handoff_s == 0.0


def test_the_corun_fit_is_a_ratio_of_medians_never_below_one():
    from tvm_diviml.profiling.overheads import fit_corun_factor

    assert fit_corun_factor([1.0, 1.0, 9.0], [1.5, 1.5, 2.0]) == 1.5
    assert fit_corun_factor([1.0, 1.0], [0.9, 0.9]) == 1.0


def test_the_corun_measurement_sees_two_workers_on_one_core(monkeypatch):
    """Pinned to the same core, the pair takes turns: each call about twice as long. A test worker
    beside it on that core shrinks the ratio (1.35 once under `make test`), so it has three tries."""
    from tvm_diviml.profiling import overheads as executor
    from tvm_diviml.runtime import vm

    core = vm.usable_cores()[:1]
    if not core:
        pytest.skip("this OS cannot pin threads")
    monkeypatch.setattr(executor, "usable_cores", lambda: core * 2)
    assert any(executor.corun_factor(samples=4, rounds=1) > 1.4 for _ in range(3))


def test_the_real_executor_overheads_are_timed():
    """Each figure is a difference of timings, which a busy core can swamp (run_s came out 0 once
    under `make test` beside another worker), so it has three tries."""
    from tvm_diviml.profiling.overheads import executor_overheads

    def plausible(measured):
        return 0 < measured.run_s < 0.1 and 0 <= measured.segment_s < 0.1 and 0 <= measured.handoff_s < 0.1

    assert any(plausible(executor_overheads(repeats=20, rounds=1)) for _ in range(3))


def test_a_streams_period_is_timed_between_its_outputs_not_from_the_start(monkeypatch):
    """A fake stream on a fake clock: the devices fill in 50 ms, then an output every 10 ms."""
    from tvm_diviml.runtime import measure

    clock = [0.0]
    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])

    class FakeRunner:
        def stream(self, inputs, in_flight):
            for index, _ in enumerate(inputs):
                clock[0] += 0.050 if index == 0 else 0.010
                yield []

    assert measure.time_stream(FakeRunner(), [[]] * 16, in_flight=2) == pytest.approx(0.010)
    with pytest.raises(ValueError, match="two inputs"):
        measure.time_stream(FakeRunner(), [[]], in_flight=1)
