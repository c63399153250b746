"""The concurrent runner on real TVM builds (tiny zoo models, the cpu2 platform): every placed build,
whatever its segments, gives the single-device reference's outputs, for one input and for a stream
with several inputs in flight, in input order; and an exported build runs the same after loading.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys

import networkx as nx
import numpy as np
import pytest

from tvm_diviml.passes import apply_plan, build, extract
from tvm_diviml.plan import Plan
from tvm_diviml.presets import get_platform
from tvm_diviml.runtime import vm
from tvm_diviml.runtime.concurrent import ConcurrentRunner
from tvm_diviml.runtime.placement import Placement
from tvm_diviml.runtime.routed import RoutedBuild
from tvm_diviml.runtime.vm import PlacedExecutable
from tvm_diviml.zoo import SMALL_OPTIONS, build_model
from tvm_diviml.zoo.reference import run_reference

CPU2 = get_platform("cpu2")
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
CHAIN = {"branches": 1, "depth": 6, "hidden": 32, "batch": 2}  # twin_branch as one chain of 7 kernels
STREAM_SEEDS = range(6)
TINY_BERT = {"layers": 1, "seq": 8, "hidden": 32, "heads": 2, "intermediate": 64, "vocab": 100}  # compiles in ~2 s


@dataclasses.dataclass
class Case:
    model: object  # BuiltModel
    extraction: object  # Extraction
    references: dict[int, list]  # input seed -> run_reference's outputs

    @property
    def weights(self) -> list[np.ndarray]:
        return [w for _, w in self.model.params]

    def build(self, assignment: dict[str, str]) -> PlacedExecutable:
        return build(apply_plan(self.model.mod, Plan(assignment), CPU2, extraction=self.extraction))


def make_case(name: str, options: dict, seeds=(0,)) -> Case:
    model = build_model(name, options)
    return Case(
        model,
        extract(model.mod, model.entry),
        {seed: run_reference(model, model.sample_inputs(seed)) for seed in seeds},
    )


def assert_matches(outputs, reference) -> None:
    assert len(outputs) == len(reference)
    for got, want in zip(outputs, reference):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, **TOLERANCE)


def alternating(order: list[str]) -> dict[str, str]:
    return {k: ("cpu0", "cpu1")[i % 2] for i, k in enumerate(order)}


def seeded_random(order: list[str], seed: int = 0) -> dict[str, str]:
    rng = random.Random(seed)
    return {k: rng.choice(("cpu0", "cpu1")) for k in order}


@pytest.fixture(scope="module")
def chain() -> Case:
    """A chain model with a reference for every stream input; the inputs' outputs all differ, so a
    result delivered for the wrong input cannot pass."""
    case = make_case("twin_branch", CHAIN, seeds=STREAM_SEEDS)
    firsts = [case.references[s][0] for s in STREAM_SEEDS]
    assert all(not np.allclose(a, b) for i, a in enumerate(firsts) for b in firsts[i + 1 :])
    return case


def assert_stream_matches(runner: ConcurrentRunner, case: Case, in_flight: int) -> None:
    inputs = [case.model.sample_inputs(seed) for seed in STREAM_SEEDS]
    results = list(runner.stream(inputs, in_flight=in_flight))
    assert len(results) == len(STREAM_SEEDS)
    for seed, outputs in zip(STREAM_SEEDS, results):
        assert_matches(outputs, case.references[seed])


@pytest.mark.parametrize(
    "name, options, make_assignment",
    [
        pytest.param("twin_branch", SMALL_OPTIONS["twin_branch"], alternating, id="twin_branch-alternating"),
        pytest.param("vit_b16", SMALL_OPTIONS["vit_b16"], seeded_random, id="vit_b16-random", marks=pytest.mark.slow),
        # two outputs: the sequence and the pooled tensor
        pytest.param("bert_base", TINY_BERT, seeded_random, id="bert_base-random"),
    ],
)
def test_latency_plan_gives_the_reference_outputs(name, options, make_assignment):
    case = make_case(name, options)
    assignment = make_assignment(case.extraction.graph.topo_order)
    assert set(assignment.values()) == {"cpu0", "cpu1"}
    with ConcurrentRunner(case.build(assignment), case.weights) as runner:
        assert_matches(runner(case.model.sample_inputs(0)), case.references[0])
    if name == "bert_base":
        assert len(case.references[0]) == 2


@pytest.fixture(scope="module")
def chain_latency_build(chain) -> PlacedExecutable:
    return chain.build(seeded_random(chain.extraction.graph.topo_order, seed=3))


@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_stream_gives_each_input_its_outputs_in_input_order(chain, chain_latency_build, in_flight):
    assert len(chain_latency_build.placement.segments) >= 2
    with ConcurrentRunner(chain_latency_build, chain.weights) as runner:
        assert_stream_matches(runner, chain, in_flight)


def test_one_vm_streams_one_input_after_another_in_input_order_and_counts_its_busy_time(chain):
    """A one-device build's stream runs in one VM on the calling thread (``open_runner``), whatever
    the inputs in flight asked; its busy time is the stream's time in calls."""
    from tvm_diviml.profiling.timing import open_runner, stream_in_flight

    built = chain.build(dict.fromkeys(chain.extraction.graph.kernels, "cpu1"))
    with open_runner(built, chain.weights) as runner:
        assert isinstance(runner, vm.SingleVMRunner) and stream_in_flight(built, 4) == 1
        assert_stream_matches(runner, chain, in_flight=4)
        ((device, busy),) = runner.busy_s.items()
        assert device == "cpu1" and busy > 0


def device_graph(build: PlacedExecutable) -> nx.DiGraph:
    """Devices, with an edge A -> B when a segment on B reads what a segment on A wrote."""
    writer = {key: seg["device"] for seg in build.placement.segments for key in seg["writes"]}
    graph = nx.DiGraph()
    for seg in build.placement.segments:
        graph.add_edges_from(
            (writer[key], seg["device"]) for key in seg["reads"] if key in writer and writer[key] != seg["device"]
        )
    return graph


def test_plan_whose_device_graph_has_a_cycle_streams_correctly(chain):
    """cpu0 -> cpu1 -> cpu0 along the chain: cpu0's worker holds the first and the last segment, so
    with several inputs in flight it must interleave the inputs' segments without deadlocking."""
    order = chain.extraction.graph.topo_order
    third = len(order) // 3
    built = chain.build({k: "cpu1" if third <= i < 2 * third else "cpu0" for i, k in enumerate(order)})
    assert [seg["device"] for seg in built.placement.segments] == ["cpu0", "cpu1", "cpu0"]
    assert not nx.is_directed_acyclic_graph(device_graph(built))
    with ConcurrentRunner(built, chain.weights, timeout_s=60) as runner:
        assert_stream_matches(runner, chain, in_flight=3)


@pytest.fixture(scope="module")
def pipeline_build(chain) -> PlacedExecutable:
    """Two stages: the first half of the topological order on cpu0, the second on cpu1."""
    order = chain.extraction.graph.topo_order
    return chain.build({k: "cpu0" if i < len(order) // 2 else "cpu1" for i, k in enumerate(order)})


def test_two_stage_pipeline_is_two_segments_and_streams_in_order(chain, pipeline_build):
    segments = pipeline_build.placement.segments
    order = chain.extraction.graph.topo_order
    assert [seg["device"] for seg in segments] == ["cpu0", "cpu1"]
    assert [k for seg in segments for k in seg["kernels"]] == order
    with ConcurrentRunner(pipeline_build, chain.weights) as runner:
        assert_stream_matches(runner, chain, in_flight=2)
        busy = runner.busy_s
    assert set(busy) == {"cpu0", "cpu1"} and all(seconds > 0 for seconds in busy.values())


def test_exported_build_loads_and_runs_concurrently(chain, pipeline_build, tmp_path):
    path = pipeline_build.export(str(tmp_path / "chain.so"))
    loaded = PlacedExecutable.load(path)
    assert dataclasses.replace(loaded.placement, library_sha256=None, versions={}) == pipeline_build.placement
    with ConcurrentRunner(loaded, chain.weights) as runner:
        assert_stream_matches(runner, chain, in_flight=2)


@pytest.mark.parametrize("kind", ["both devices", "cpu1 only"])
def test_busy_time_is_positive_for_each_device_used_and_only_those(chain, chain_latency_build, kind):
    built = (
        chain_latency_build
        if kind == "both devices"
        else chain.build(dict.fromkeys(chain.extraction.graph.topo_order, "cpu1"))
    )
    used = set(built.placement.assignment.values())
    with ConcurrentRunner(built, chain.weights) as runner:
        assert_matches(runner(chain.model.sample_inputs(0)), chain.references[0])
        busy = runner.busy_s
    assert set(busy) == used and all(seconds > 0 for seconds in busy.values())


def placement_of(devices: list[tuple[str, str, int | None]]) -> Placement:
    names, specs, threads = (list(x) for x in zip(*devices))
    return Placement(
        entry="main",
        devices=names,
        tvm_devices=specs,
        num_threads=threads,
        inputs=[],
        weight_params=[],
        num_params=0,
        weight_ids=[],
        transform_params=None,
        constant_ids=[],
        constants_func=None,
        num_outputs=1,
        copies_per_run=0,
    )


def test_the_kernels_devices_come_from_the_assignment_or_an_older_placements_segments():
    placement = placement_of([("cpu0", "cpu:0", 1), ("gpu", "cuda:0", None), ("cpu1", "cpu:0", 1)])
    placement.assignment = {"a": "cpu1", "b": "gpu"}
    assert placement.kernel_devices == ["gpu", "cpu1"]  # the VM's order; the host holds no kernel
    placement.assignment, placement.segments = {}, [{"device": "cpu1"}]
    assert placement.kernel_devices == ["cpu1"]


def test_cpu_workers_get_cores_of_their_own_when_they_fit(monkeypatch):
    monkeypatch.setattr(vm, "_ALLOWED_CPUS", frozenset({2, 3, 5}))
    two = placement_of([("cpu0", "cpu:0", 1), ("gpu", "cuda:0", None), ("cpu1", "cpu:0", 2)])
    assert vm.worker_cores(two) == {"cpu0": [2], "cpu1": [3, 5]}  # the GPU's worker stays free
    assert vm.worker_cores(placement_of([("cpu0", "cpu:0", 2), ("cpu1", "cpu:0", 2)])) == {}  # 4 threads, 3 cores
    monkeypatch.setattr(vm, "_ALLOWED_CPUS", None)  # an OS that cannot pin
    assert vm.worker_cores(two) == {}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin two workers apart")
def test_running_workers_are_pinned_apart_and_the_caller_stays_free(chain, chain_latency_build):
    """Unpinned, both workers were often woken on one core and ran one after the other."""
    caller = os.sched_getaffinity(0)
    with ConcurrentRunner(chain_latency_build, chain.weights) as runner:
        assert_matches(runner(chain.model.sample_inputs(0)), chain.references[0])
        cores = [os.sched_getaffinity(t.native_id) for t in runner.executor._threads]
    assert len(cores) == 2 and all(len(c) == 1 for c in cores) and cores[0] != cores[1]
    assert os.sched_getaffinity(0) == caller


def test_replicas_on_the_cpus_read_one_copy_of_the_weights(chain):
    """Each replica with its own copy ran 1.18x as long side by side as alone; the copies' outputs stay
    the reference's."""
    builds = [chain.build(dict.fromkeys(chain.extraction.graph.topo_order, d)) for d in ("cpu0", "cpu1")]
    routed = RoutedBuild(builds, [0.5, 0.5], ["cpu0", "cpu1"])
    with routed.runner(chain.weights) as runner:
        assert_stream_matches(runner, chain, in_flight=2)
        assert runner.sent == {"cpu0": 3, "cpu1": 3}
        (first,), (second,) = (list(lane._weights.values()) for lane in runner.lanes)
    assert [w.device for w in second] == [vm.tvm_device("cpu:1")] * len(second)
    assert [w.data_ptr() for w in first] == [w.data_ptr() for w in second]


def test_a_cpu_tensor_is_another_cpu_devices_without_a_copy():
    host = vm.to_device(np.arange(6, dtype="float32").reshape(2, 3), vm.tvm_device("cpu:0"))
    alias = vm.on_device(host, vm.tvm_device("cpu:1"))
    assert alias.device == vm.tvm_device("cpu:1") and alias.data_ptr() == host.data_ptr()
    assert vm.on_device(host, host.device) is host
    del host  # the alias keeps the memory
    np.testing.assert_array_equal(alias.numpy(), np.arange(6, dtype="float32").reshape(2, 3))


ENDED_THREADS = """
import os, sys, threading, time
from tvm_diviml.runtime.vm import set_threads
before = len(os.listdir("/proc/self/task"))
for _ in range(8):  # as the executor's calibration and every runner's workers do: size a pool, end
    thread = threading.Thread(target=set_threads, args=(1,))
    thread.start()
    thread.join()
began = time.monotonic()
while len(os.listdir("/proc/self/task")) > before and time.monotonic() - began < float(sys.argv[1]):
    time.sleep(0.01)
print(len(os.listdir("/proc/self/task")) - before, round(time.monotonic() - began, 3))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_the_pool_workers_of_ended_threads_end_with_them():
    """Each thread that sizes its TVM pool gets a pool worker bound to a core. With TVM's default idle
    spin, eight ended threads left workers spinning on one core for ~4.4 s here, taking it from
    whatever ran next; ``vm.bound_idle_spinning`` has them sleep, and end, at once (0.02 s)."""
    env = {k: v for k, v in os.environ.items() if k != "TVM_THREAD_POOL_SPIN_COUNT"}
    done = subprocess.run(
        [sys.executable, "-c", ENDED_THREADS, "2.0"], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr
    left, seconds = done.stdout.split()
    assert int(left) <= 0, f"{left} pool workers still running {seconds} s after their threads ended"
