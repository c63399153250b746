"""Small hand-checkable fixtures: three devices whose links cost 1 s + 1 s per byte."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph
from tvm_diviml.platform import Device, Link, Platform

MSR_FIDDLE = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "msr-fiddle")

# One of our schedule rules raising is a bug, not a kernel it declines: fail the test that meets it
# (tvm_diviml/schedules/apply.py); the commands themselves go on to the next rule with a warning.
os.environ.setdefault("DIVIML_STRICT_SCHEDULES", "1")

# Property tests draw the same examples on every run (`make test`, CI), so a red run can be rerun;
# HYPOTHESIS_PROFILE=thorough (`make test-all`) draws fresh ones, five times as many.
THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("thorough", derandomize=False)
settings.load_profile("thorough" if THOROUGH else "repeatable")


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


@pytest.fixture
def msr_fiddle_dir():
    if not os.path.isdir(MSR_FIDDLE):
        pytest.skip("../shared/data/msr-fiddle is absent")
    return os.path.abspath(MSR_FIDDLE)
