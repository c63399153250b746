"""The CPU's measured peak (its FMA-chain kernel: output and assembly) and the profile's per-class
FLOP/s: each convolution's kind, and the table's arithmetic on costs chosen here."""

import math
import re

import numpy as np
import pytest
import tvm
from tvm.script import relax as R

from tvm_diviml.app.profile import CpuPeak, class_rows, convolution_kind
from tvm_diviml.cost.base import ExecutorOverheads
from tvm_diviml.cost.provenance import DeviceTimings, Provenance
from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.frontends.importers import from_relax
from tvm_diviml.graph import OpGraph
from tvm_diviml.passes.extract import extract
from tvm_diviml.presets import get_platform
from tvm_diviml.profiling.peak import CHAINS, PeakKernel, measured_peak_flops_per_s


def host_flags() -> set[str]:
    with open("/proc/cpuinfo") as info:
        return next((set(line.split(":", 1)[1].split()) for line in info if line.startswith("flags")), set())


@pytest.mark.parametrize(("dtype", "a", "b"), [("float32", 1.0, 0.5), ("float32", 1.5, 0.25), ("float64", 0.5, 3.0)])
def test_peak_kernel_gives_its_closed_form(dtype, a, b):
    kernel = PeakKernel(2, dtype, 7)
    arguments = kernel.arguments(a, b)
    kernel.build()["main"](*arguments)
    np.testing.assert_allclose(arguments[1].numpy(), kernel.closed_form(a, b), rtol=1e-6)
    assert kernel.flops == 2 * 2 * CHAINS * kernel.lanes * 7


def test_peak_kernel_runs_vector_fmas_on_this_cpu():
    flags = host_flags()
    if "fma" not in flags:
        pytest.skip("this CPU has no FMA instructions")
    register = "zmm" if "avx512f" in flags else "ymm"
    assembly = PeakKernel(1, "float32", 64).build().inspect_source("asm")
    fmas = re.findall(rf"vfmadd\d+ps\s+%{register}\d+, %{register}\d+, %{register}(\d+)", assembly)
    assert len(set(fmas)) >= CHAINS, f"{len(set(fmas))} accumulators in {register} FMAs"


def test_measured_peak_is_cached_and_refuses_bad_input():
    first = measured_peak_flops_per_s(1)
    assert first > 1e9 and measured_peak_flops_per_s(1) == first
    with pytest.raises(DivimlInputError, match="threads"):
        measured_peak_flops_per_s(0)
    with pytest.raises(DivimlInputError, match="float32 or float64|float32, float64"):
        measured_peak_flops_per_s(1, "int8")


def convolutions_module():
    """Five convolutions in a row, one of each kind, each followed by a ReLU: 8 channels, 16x16."""

    @tvm.script.ir_module
    class Module:
        @R.function
        def main(
            x: R.Tensor((1, 8, 16, 16), "float32"),
            w3: R.Tensor((8, 8, 3, 3), "float32"),
            w3s: R.Tensor((8, 8, 3, 3), "float32"),
            w1: R.Tensor((8, 8, 1, 1), "float32"),
            wd: R.Tensor((8, 1, 3, 3), "float32"),
            wg: R.Tensor((8, 4, 3, 3), "float32"),
        ) -> R.Tensor((1, 8, 8, 8), "float32"):
            R.func_attr({"num_input": 1})
            with R.dataflow():
                direct = R.nn.relu(R.nn.conv2d(x, w3, padding=1))
                strided = R.nn.relu(R.nn.conv2d(direct, w3s, strides=2, padding=1))
                pointwise = R.nn.relu(R.nn.conv2d(strided, w1))
                depthwise = R.nn.relu(R.nn.conv2d(pointwise, wd, padding=1, groups=8))
                grouped = R.nn.relu(R.nn.conv2d(depthwise, wg, padding=1, groups=2))
                R.output(grouped)
            return grouped

    rng = np.random.default_rng(0)
    shapes = [(8, 8, 3, 3), (8, 8, 3, 3), (8, 8, 1, 1), (8, 1, 3, 3), (8, 4, 3, 3)]
    built = from_relax(Module, "main", [rng.standard_normal(s).astype("float32") for s in shapes])
    return extract(built.mod, built.entry)


@pytest.fixture(scope="module")
def convolutions():
    return convolutions_module()


def conv_kernels(extraction) -> list[str]:
    return [k for k in extraction.graph.topo_order if "conv2d" in extraction.kernel_func[k]]


def test_convolution_kinds(convolutions):
    kinds = [convolution_kind(convolutions.mod[convolutions.kernel_func[k]]) for k in conv_kernels(convolutions)]
    assert kinds == ["direct", "strided", "1x1", "depthwise", "grouped"]


def costs_chosen(graph: OpGraph, seconds: dict[str, float], schedules: dict[str, str]) -> TableCostModel:
    """A cost table of ``seconds`` on cpu1's device, as if timed there and scheduled by ``schedules``."""
    platform = get_platform("cpu1")
    (device,) = platform.device_names
    timings = DeviceTimings("measured", seconds, dict.fromkeys(seconds, 0.0), schedules)
    provenance = Provenance({device: timings}, [], {}, ExecutorOverheads(), ExecutorOverheads())
    compute = {kernel: {device: 2 * s} for kernel, s in seconds.items()}  # priced in context: not the class table's
    return TableCostModel(platform, compute, provenance=provenance)


def test_class_table_sums_and_fractions(convolutions):
    graph = convolutions.graph
    convs = conv_kernels(convolutions)
    others = [k for k in graph.kernels if k not in convs]
    seconds = {k: 1e-3 * (i + 1) for i, k in enumerate(graph.topo_order)}
    schedules = {k: "Conv2d" if k in convs else "Injective" for k in graph.kernels}
    schedules[convs[0]] = "Fallback"  # a convolution no class rule took counts as Fallback, not Conv2d
    costs = costs_chosen(graph, seconds, schedules)
    peak = 100e9
    (device,) = costs.platform.device_names
    rows = class_rows(convolutions, costs, {device: CpuPeak(peak, 1)})
    by_class = {row["class"]: row for row in rows}
    expected = {"Fallback", "Conv2d strided", "Conv2d 1x1", "Conv2d depthwise", "Conv2d grouped", "Injective"}
    assert set(by_class) == expected and by_class["Injective"]["kernels"] == len(others) > 0
    assert math.isclose(sum(row["share"] for row in rows), 1.0)
    assert sum(row["kernels"] for row in rows) == len(graph.kernels)
    assert math.isclose(sum(row["ms"] for row in rows), 1e3 * sum(seconds.values()))
    assert math.isclose(sum(row["gflop"] for row in rows), sum(k.flops for k in graph.kernels.values()) / 1e9)
    assert [row["ms"] for row in rows] == sorted((row["ms"] for row in rows), reverse=True)
    grouped = by_class["Conv2d grouped"]
    kernel = graph.kernels[convs[4]]
    assert grouped["kernels"] == 1 and math.isclose(grouped["ms"], 1e3 * seconds[convs[4]])
    assert math.isclose(grouped["gflops_per_s"], kernel.flops / seconds[convs[4]] / 1e9)
    assert math.isclose(grouped["peak_fraction"], kernel.flops / seconds[convs[4]] / peak)
    assert by_class["Injective"]["peak_fraction"] is None  # layout transposes: bytes, no FLOPs
