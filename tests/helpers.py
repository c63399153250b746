"""What several test files share: the ``diviml`` command in a subprocess, hand-made models, files and
problems, and the waits for an event (a line a process prints, a condition that comes to hold) with a
generous hang guard instead of a fixed sleep: a loaded machine makes a test slower, never wrong."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph
from tvm_diviml.platform import Device, Link, Platform
from tvm_diviml.problem import Problem
from tvm_diviml.simulator import simulate

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MSR_FIDDLE = os.path.join(REPO_ROOT, "..", "shared", "data", "msr-fiddle")
# Property tests draw the same examples on every run (`make test`, CI), so a red run can be rerun;
# HYPOTHESIS_PROFILE=thorough (`make test-all`) draws fresh ones, five times as many (conftest.py).
THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"


def examples(count: int) -> int:
    """``max_examples`` for a property test: ``count`` in the repeatable profile, 5x in the thorough one."""
    return count * 5 if THOROUGH else count


def unit_platform(devices=("A", "B", "C"), latency=1.0, bandwidth=1.0, memory=None, transfer_model="direct"):
    """Device A is a CPU (the host), the others GPUs; sending b bytes takes latency + b / bandwidth."""
    devs = [
        Device(
            name,
            {"kind": "llvm"} if i == 0 else {"kind": "cuda"},
            "cpu:0" if i == 0 else f"cuda:{i - 1}",
            memory_bytes=memory,
        )
        for i, name in enumerate(devices)
    ]
    links = {(a, b): Link(a, b, latency, bandwidth) for a in devices for b in devices if a != b}
    return Platform("unit", devs, links, transfer_model=transfer_model)


def table(platform, times):
    """``times``: {kernel: number (same on every device) or {device: seconds}}."""
    rows = {k: (v if isinstance(v, dict) else {d: float(v) for d in platform.device_names}) for k, v in times.items()}
    return TableCostModel(platform, rows)


def graph_of(edges, kernels=None, inputs=(), outputs=None, weights=None, kernel_weights=None, output_bytes=None):
    """A graph from (src, dst, bytes) triples; kernels in first-seen order unless given."""
    names = list(kernels or [])
    for src, dst, _ in edges:
        for name in (src, dst):
            if name not in names:
                names.append(name)
    kernel_weights = kernel_weights or {}
    output_bytes = output_bytes or {}
    nodes = [Kernel(n, weights=tuple(kernel_weights.get(n, ())), output_bytes=output_bytes.get(n, 0.0)) for n in names]
    return OpGraph(
        nodes,
        [Edge(s, d, b) for s, d, b in edges],
        inputs=[GraphInput(n, b, tuple(c)) for n, b, c in inputs],
        outputs=outputs,
        weights=weights,
    )


# How long a test waits for an event before it calls it a hang: far past what the event takes on a
# loaded machine, so it only ends a test that would never finish.
HANG_GUARD_S = 300.0


# ---------------------------------------------------------------------- waiting for events
def wait_until(condition, what: str, timeout_s: float = HANG_GUARD_S, every_s: float = 0.05):
    """``condition()``'s value once it is true, asked every ``every_s``; the test fails, naming
    ``what``, where it is still false after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(every_s)
    return value


class Lines:
    """A process's text pipe, read line by line on a thread of its own: a test waits for the line that
    says an event happened (``wait_for``), acts, then reads the rest up to the end (``rest``)."""

    def __init__(self, pipe) -> None:
        self.seen: list[str] = []
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(pipe,), name="test pipe reader", daemon=True).start()

    def _read(self, pipe) -> None:
        for line in pipe:
            self._lines.put(line)
        self._lines.put(None)  # the end of the output

    def _next(self, deadline: float, waiting_for: str) -> str | None:
        try:
            line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"{waiting_for} did not come in time; the output so far:\n{self.tail()}")
        if line is None:
            self._lines.put(None)  # the end stays for a later wait
        else:
            self.seen.append(line)
        return line

    def wait_for(self, text: str, timeout_s: float = HANG_GUARD_S) -> str:
        """The next line that contains ``text``; the test fails where the output ends without one, or
        none came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (line := self._next(deadline, f"a line with {text!r} (within {timeout_s:g} s)")) is not None:
            if text in line:
                return line
        pytest.fail(f"the output ended without a line with {text!r}:\n{self.tail()}")

    def rest(self, timeout_s: float = HANG_GUARD_S) -> str:
        """The lines after those read so far, once the output ended (the process closed the pipe)."""
        deadline, start = time.monotonic() + timeout_s, len(self.seen)
        while self._next(deadline, f"the end of the output (within {timeout_s:g} s)") is not None:
            pass
        return "".join(self.seen[start:])

    def tail(self, chars: int = 2000) -> str:
        return "".join(self.seen)[-chars:]


# ---------------------------------------------------------------------- the command
def diviml(*args, cwd=None, env=None, timeout=HANG_GUARD_S):
    """``diviml ARGS`` in a subprocess (its exit status, stdout and stderr)."""
    return subprocess.run(
        [sys.executable, "-m", "tvm_diviml.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


def hand_file(**overrides):
    """An msr-fiddle file: 1 -> 2 -> 3 -> 4 and 1 -> 3; accelerator times 1..4 ms, CPU 10 ms; 3
    colour-shares with 4."""
    data = {
        "maxSizePerFPGA": 100.0,
        "maxFPGAs": 2,
        "maxCPUs": 1,
        "nodes": [
            {
                "id": i,
                "supportedOnFpga": 1,
                "cpuLatency": 10.0,
                "fpgaLatency": float(i),
                "size": 30.0,
                "isBackwardNode": False,
                "colorClass": {3: 34, 4: 34}.get(i, i),
            }
            for i in (1, 2, 3, 4)
        ],
        "edges": [
            {"sourceId": 1, "destId": 2, "cost": 0.5},
            {"sourceId": 1, "destId": 3, "cost": 0.5},
            {"sourceId": 2, "destId": 3, "cost": 0.25},
            {"sourceId": 3, "destId": 4, "cost": 1.0},
        ],
    }
    data.update(overrides)
    return data


# ---------------------------------------------------------------------- models
def assert_faithful(built, extraction, rtol=1e-5, atol=1e-5):
    """The extracted kernels, run one by one, give the model's reference outputs."""
    from tvm_diviml.passes.interpret import run_kernels
    from tvm_diviml.zoo.reference import run_reference

    inputs = built.sample_inputs(1)
    expected = run_reference(built, inputs)
    got = run_kernels(extraction, inputs, [w for _, w in built.params])
    assert len(got) == len(expected)
    for want, have in zip(expected, got, strict=True):
        np.testing.assert_allclose(have, want, rtol=rtol, atol=atol)


def tiny_onnx(path):
    """A convolution, ReLU, pooling and a dense layer saved as ONNX at ``path``, its batch dynamic
    (``N``); the test is skipped without onnx."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype("float32"), "W1"),
        numpy_helper.from_array(rng.standard_normal((4, 8)).astype("float32"), "W2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "W2"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return model


def torch_model_with_buffers():
    """(model, example input, BuiltModel): a convolution, batch norm with non-trivial running statistics
    and a registered buffer (torch's buffers become constants), pooled and flattened into a linear layer."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")
    from tvm_diviml.frontends.importers import from_torch_export

    class WithBuffers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.register_buffer("shift", torch.linspace(-1, 1, 8))
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            pooled = torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)) + self.shift
            return self.fc(torch.flatten(pooled, 1))

    torch.manual_seed(0)
    model = WithBuffers().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    example = torch.randn(2, 3, 8, 8)
    return model, example, from_torch_export(torch.export.export(model, (example,)))


# ---------------------------------------------------------------------- pipeline problems
TOLERANCE = 1e-6  # MIP bounds carry a relative slack of 1e-6


def pipeline(graph, platform, costs, stages):
    return Problem(graph, platform, costs, objective="pipeline", stages=stages)


def simulated(problem, plan):
    return simulate(problem, plan)


def hand_chain(c_on_b=4.0, c_on_c=2.0):
    """a -> b -> c, 2-byte tensors (3 s on a link), a 1-byte input into a and a 1-byte output from c
    (2 s each off the host); A, the host, is too slow to use."""
    platform = unit_platform()
    graph = graph_of([("a", "b", 2), ("b", "c", 2)], inputs=[("x", 1, ["a"])], output_bytes={"c": 1})
    costs = table(
        platform,
        {"a": {"A": 100, "B": 2, "C": 10}, "b": {"A": 100, "B": 5, "C": 1}, "c": {"A": 100, "B": c_on_b, "C": c_on_c}},
    )
    return pipeline(graph, platform, costs, 2)


def stage_choice_chain():
    """``hand_chain`` where c is fast on C (1 s) and slow on B (8 s): which device takes which stage
    decides the period."""
    return hand_chain(c_on_b=8.0, c_on_c=1.0)


def chain(length, work=1.0, tensor_bytes=4, devices=("A", "B", "C")):
    """k0 -> k1 -> ... taking ``work`` s each; each tensor 1 + ``tensor_bytes`` s on a link."""
    platform = unit_platform(devices)
    names = [f"k{i}" for i in range(length)]
    graph = graph_of([(a, b, tensor_bytes) for a, b in zip(names, names[1:])])
    return graph, platform, table(platform, {k: work for k in names})
