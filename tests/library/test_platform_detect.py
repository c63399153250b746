"""This machine as a platform: ``diviml platforms --detect``, ``--platform local`` and ``cpuN``, with
the GPU listing faked (no GPU needed); ``"estimate"`` in a file and the plan report that says which
figures are estimates; a detected file plans and runs with no edits."""

from __future__ import annotations

import json

import pytest
import tvm
from tvm.target import codegen

from tvm_diviml import detect, presets
from tvm_diviml.app.report import format_row
from tvm_diviml.cli import main
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.machine import available_cores, gpu_part, host_copy, host_cpu
from tvm_diviml.platform import Platform
from tvm_diviml.presets import get_platform

KNOWN = detect.GpuRecord(
    "cuda",
    0,
    "NVIDIA A100 80GB PCIe",
    "8.0",
    85_899_345_920,
    108,
    1.41e9,
    upload=detect.LinkFigures(1e-5, 2.4e10),
    download=detect.LinkFigures(2e-5, 2e10),
)
UNKNOWN = detect.GpuRecord(
    "cuda",
    1,
    "NVIDIA Imaginary 9000",
    "12.0",
    48e9,
    100,
    2e9,
    upload=detect.LinkFigures(1e-5, 5e10),
    download=detect.LinkFigures(1e-5, 4e10),
    copy_bandwidth_Bps=1.5e12,
)


@pytest.fixture
def two_gpus(monkeypatch):
    """The GPU listing faked: an A100 (a known part) and a part no table knows."""
    monkeypatch.setattr(detect, "list_gpus", lambda: (KNOWN, UNKNOWN))


def test_detected_gpus_carry_their_memory_compute_capability_and_figures(two_gpus):
    platform = presets.load_platform("local")
    assert platform.device_names == ["cpu", "a100", "gpu"] and platform.host == "cpu"
    a100, other = platform.device("a100"), platform.device("gpu")
    assert a100.target == {"kind": "cuda", "arch": "sm_80"} and a100.device == "cuda:0"
    assert a100.memory_bytes == 85_899_345_920 and a100.part == "NVIDIA A100 80GB PCIe"
    assert (a100.peak_flops, a100.bandwidth_Bps) == (19.5e12, 1.935e12)  # the datasheet's
    assert other.target == {"kind": "cuda", "arch": "sm_120"} and other.memory_bytes == 48e9
    assert other.peak_flops == pytest.approx(100 * 2e9 * 128 * 2) and other.bandwidth_Bps == 1.5e12
    assert "not a known part" in platform.estimates["gpu"]["peak_flops"] and "a100" not in platform.estimates
    assert platform.link("cpu", "a100").bandwidth_Bps == 2.4e10 and platform.link("a100", "cpu").latency_s == 2e-5
    # GPU to GPU: a copy down to host memory, then one up
    assert platform.link("a100", "gpu").latency_s == pytest.approx(3e-5)
    assert platform.link("a100", "gpu").bandwidth_Bps == pytest.approx(1 / (1 / 2e10 + 1 / 5e10), rel=1e-2)
    detected = platform.extra_attrs["detected"]
    assert [g["compute_version"] for g in detected["gpus"]] == ["8.0", "12.0"]
    assert detected["cpu"]["cores"] == available_cores()


def test_this_machine_is_detected_through_tvm():
    platform = detect.local_platform("local", gpus=[])
    (cpu,) = platform.devices
    assert cpu.num_threads == available_cores() and cpu.target == {"kind": "llvm"} and cpu.measure
    assert cpu.peak_flops == pytest.approx(host_cpu().core_flops * available_cores())
    detected = platform.extra_attrs["detected"]["cpu"]
    assert detected["mcpu"] == codegen.llvm_get_system_cpu() and detected["vector_bits"] >= 128
    assert set(platform.estimates["cpu"]) == {"peak_flops", "bandwidth_Bps"}
    if not tvm.cuda(0).exist and not tvm.rocm(0).exist:
        assert detect.list_gpus() == ()


class FakeGpu:
    """What TVM's runtime answers for a present L4 (the attribute names of TVM 0.27's Device)."""

    exist = True
    device_name = "NVIDIA L4"
    compute_version = "8.9"
    total_global_memory = 23_580_557_312
    multi_processor_count = 58
    max_clock_rate = 2_040_000  # kHz


def test_gpus_are_listed_from_tvms_runtime(monkeypatch):
    """The listing reads TVM's device attributes and times both copy directions; the devices TVM
    does not find end it."""
    from tvm_diviml.cost.fit import LinkFit

    absent = type("Absent", (), {"exist": False})()
    monkeypatch.setattr(tvm, "device", lambda kind, index: FakeGpu() if (kind, index) == ("cuda", 0) else absent)
    timed = []
    monkeypatch.setattr(
        detect,
        "time_link",
        lambda src, dst, **_: timed.append((src.device, dst.device)) or LinkFit(1e-5, 2e10, 0.0),
    )
    (record,) = detect.list_gpus.__wrapped__()
    assert (record.kind, record.index, record.name, record.compute_version) == ("cuda", 0, "NVIDIA L4", "8.9")
    assert record.memory_bytes == 23_580_557_312 and record.multiprocessors == 58 and record.clock_hz == 2.04e9
    assert timed == [("cpu:0", "cuda:0"), ("cuda:0", "cpu:0")] and record.upload == detect.LinkFigures(1e-5, 2e10)
    assert record.copy_bandwidth_Bps is None  # a known part: its datasheet's bandwidth
    l4 = detect.local_platform("local", gpus=[record]).device("l4")
    assert l4.target == {"kind": "cuda", "arch": "sm_89"} and (l4.peak_flops, l4.bandwidth_Bps) == (30.3e12, 300e9)


def test_local_cores_splits_the_cpu_evenly(monkeypatch):
    monkeypatch.setattr(detect, "available_cores", lambda: 5)
    platform = detect.local_platform("local:cores=3", gpus=[])
    assert platform.device_names == ["cpu0", "cpu1", "cpu2"]
    assert [d.num_threads for d in platform.devices] == [2, 2, 1]
    assert [d.device for d in platform.devices] == ["cpu:0", "cpu:1", "cpu:2"]
    assert platform.device("cpu2").peak_flops == pytest.approx(host_cpu().core_flops)
    link = platform.link("cpu0", "cpu1")
    copy = host_copy()
    assert link.bandwidth_Bps == pytest.approx(copy.link_bandwidth_Bps, rel=1e-2)


@pytest.mark.parametrize("spec, message", [("local:cores=0", "K is from 1"), ("local:threads=2", "cannot read")])
def test_a_bad_local_spec_is_refused(spec, message):
    with pytest.raises(DivimlInputError, match=message) as refused:
        presets.load_platform(spec)
    assert refused.value.field == "platform"


def test_more_devices_than_cores_is_refused_naming_the_fix():
    cores = available_cores()
    for spec in (f"cpu{max(cores, presets.ALWAYS_AVAILABLE_CPUS) + 1}", f"local:cores={cores + 1}"):
        with pytest.raises(DivimlInputError) as refused:
            presets.load_platform(spec)
        assert refused.value.field == "platform" and str(cores) in refused.value.hint


def test_cpu1_and_cpu2_plan_on_a_one_core_machine(monkeypatch):
    """The presets that tests, docs and servers:2xcpu1 name describe two cores wherever they are read."""
    monkeypatch.setattr(presets, "available_cores", lambda: 1)
    assert get_platform("cpu2").device_names == ["cpu0", "cpu1"] and get_platform("cpu1").device_names == ["cpu"]
    with pytest.raises(DivimlInputError, match="cpu3 asks for 3"):
        get_platform("cpu3")


def test_cpu_n_is_n_single_thread_devices_and_cpu1_cpu2_are_as_before(monkeypatch):
    monkeypatch.setattr(presets, "available_cores", lambda: 4)
    four = get_platform("cpu4")
    assert four.device_names == ["cpu0", "cpu1", "cpu2", "cpu3"] and {d.num_threads for d in four.devices} == {1}
    assert four.link("cpu3", "cpu0").bandwidth_Bps == 10e9
    two, one = get_platform("cpu2"), get_platform("cpu1")
    assert two.name == "cpu2" and two.device_names == ["cpu0", "cpu1"]
    assert two.description == "this machine's CPU as two single-thread devices (runs here)"
    assert two.devices == four.devices[:2] and one.device_names == ["cpu"] and one.devices[0].num_threads == 1
    with pytest.raises(DivimlInputError, match="cpu5 asks for 5"):
        get_platform("cpu5")


def test_detect_writes_a_file_that_plans_with_its_gpus(two_gpus, tmp_path, capsys):
    path = tmp_path / "mine.json"
    assert main(["platforms", "--detect", "--output", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {path}" in out and "gpu peak_flops: estimated (not a known part" in out
    platform = Platform.load(str(path))
    assert platform.device("a100").memory_bytes == 85_899_345_920
    assert platform.device("a100").target["arch"] == "sm_80"
    assert main(["plan", "twin_branch", "--platform", str(path)]) == 0
    report = capsys.readouterr().out
    assert "platform local" in report and "\na100 " in report
    assert "gpu peak_flops 51.2 TFLOP/s: estimated (not a known part: 100 SMs x 2.00 GHz" in report
    assert "cpu bandwidth_Bps" in report and "a100 peak_flops" not in report  # the datasheet's is no estimate


def test_detect_prints_json_and_local_is_a_platform_everywhere(two_gpus, capsys):
    assert main(["platforms", "--detect"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in printed["devices"]] == ["cpu", "a100", "gpu"]
    assert main(["plan", "random:kernels=6,seed=1", "--platform", "local", "--json", "-"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["platform"] == "local" and set(row["cost_sources"]) == {"cpu", "a100", "gpu"}
    figures = {(e["device"], e["figure"]) for e in row["estimated_figures"]}
    assert figures == {("cpu", "peak_flops"), ("cpu", "bandwidth_Bps"), ("gpu", "peak_flops"), ("gpu", "bandwidth_Bps")}


def test_a_detected_file_runs_here_with_no_edits(tmp_path, capsys):
    path = tmp_path / "here.json"
    assert main(["platforms", "--detect", "--output", str(path)]) == 0
    capsys.readouterr()
    argv = ["run", "twin_branch:depth=2,hidden=32,batch=2", "--platform", str(path), "--cost", "roofline"]
    assert main([*argv, "--repeats", "2", "--inputs", "4", "--time-limit", "5", "--candidates", "0"]) == 0
    out = capsys.readouterr().out
    assert "outputs against the single-device build" in out and ": equal" in out


def test_platforms_ends_with_how_to_write_your_own(capsys):
    assert main(["platforms"]) == 0
    tail = capsys.readouterr().out.split("\n\n")[-1]
    assert "--detect" in tail and "--json NAME" in tail and "docs/platform.md" in tail
    assert main(["platforms", "--output", "x.json"]) == 2
    assert "--output writes what --detect or --json NAME describes" in capsys.readouterr().err


def cpu_and_gpu(cpu: dict | None = None, gpu: dict | None = None) -> dict:
    return {
        "devices": [
            {"name": "cpu", "target": {"kind": "llvm"}, "device": "cpu:0", "num_threads": 1, **(cpu or {})},
            {"name": "gpu", "target": {"kind": "cuda", "arch": "sm_89"}, "device": "cuda:0", **(gpu or {})},
        ],
        "default_link": {"latency_s": 1e-5, "bandwidth_Bps": 2.4e10},
    }


CPU_FIGURES = {"peak_flops": "estimate", "bandwidth_Bps": "estimate"}
GPU_FIGURES = {"peak_flops": 1e13, "bandwidth_Bps": 3e11}


def test_estimate_fills_the_cpu_from_this_machine_and_a_gpu_from_its_part():
    platform = Platform.from_json(cpu_and_gpu(CPU_FIGURES, {"part": "NVIDIA L4", **CPU_FIGURES}))
    cpu, gpu = platform.device("cpu"), platform.device("gpu")
    assert cpu.peak_flops == pytest.approx(host_cpu().core_flops) and cpu.bandwidth_Bps == host_copy().bandwidth_Bps
    assert (gpu.peak_flops, gpu.bandwidth_Bps) == (30.3e12, 300e9)
    assert platform.estimates["gpu"]["bandwidth_Bps"].startswith("datasheet of NVIDIA L4")
    assert "1 thread" in platform.estimates["cpu"]["peak_flops"]
    by_name = Platform.from_json(
        cpu_and_gpu(GPU_FIGURES, {"name": "h100_pcie", "peak_flops": "estimate", "bandwidth_Bps": 3e11})
    )
    assert by_name.device("h100_pcie").peak_flops == 51e12 and by_name.device("h100_pcie").bandwidth_Bps == 3e11
    assert set(by_name.estimates) == {"h100_pcie"}


@pytest.mark.parametrize(
    "cpu, gpu, field, message",
    [
        ({**CPU_FIGURES, "measure": False}, GPU_FIGURES, "devices[cpu].peak_flops", "describes another machine"),
        (GPU_FIGURES, {"part": "NVIDIA Imaginary 9000", **CPU_FIGURES}, "devices[gpu].peak_flops", "known GPU part"),
        (GPU_FIGURES, {"peak_flops": "estimate", "bandwidth_Bps": 3e11}, "devices[gpu].peak_flops", "names none"),
        (GPU_FIGURES, {**GPU_FIGURES, "memory_bytes": "estimate"}, "devices[gpu].memory_bytes", "stands only for"),
        (GPU_FIGURES, {**GPU_FIGURES, "bandwidth_Bps": "estimated"}, "devices[gpu].bandwidth_Bps", 'or "estimate"'),
        (GPU_FIGURES, {"bandwidth_Bps": 3e11}, "devices[gpu].peak_flops", "missing 'peak_flops'"),
    ],
)
def test_a_bad_estimate_or_a_missing_figure_is_refused(cpu, gpu, field, message):
    with pytest.raises(DivimlInputError, match=message) as refused:
        Platform.from_json(cpu_and_gpu(cpu, gpu))
    assert refused.value.field == field


def test_estimate_is_refused_where_nothing_describes_the_device():
    data = cpu_and_gpu(GPU_FIGURES, GPU_FIGURES)
    data["devices"][1].update(target={"kind": "vulkan"}, device="vulkan:0", peak_flops="estimate")
    with pytest.raises(DivimlInputError, match="no estimate for a vulkan device"):
        Platform.from_json(data)


def test_known_parts_are_told_apart():
    names = {
        "NVIDIA A100-SXM4-80GB": "NVIDIA A100 80GB SXM",
        "NVIDIA A100-PCIE-40GB": "NVIDIA A100 40GB",
        "NVIDIA H100 80GB HBM3": "NVIDIA H100 SXM",
        "NVIDIA H100 PCIe": "NVIDIA H100 PCIe",
        "NVIDIA L4": "NVIDIA L4",
        "NVIDIA L40S": "NVIDIA L40S",
        "NVIDIA A10": "NVIDIA A10",
        "Tesla T4": "NVIDIA T4",
        "Tesla V100-SXM2-16GB": "NVIDIA V100 SXM2",
        "NVIDIA GeForce RTX 4090": "NVIDIA GeForce RTX 4090",
        "AMD Instinct MI300X": "AMD Instinct MI300X",
        "rtx2080ti": "NVIDIA GeForce RTX 2080 Ti",
    }
    assert {name: getattr(gpu_part(name), "name", None) for name in names} == names
    assert gpu_part("NVIDIA A100X") is None and gpu_part("cpu") is None


def test_the_report_prints_estimates_only_where_they_price_kernels():
    row = {
        "model": "m",
        "kernels": 1,
        "edges": 0,
        "platform": "p",
        "cost_source": "measured",
        "cost_sources": {"cpu": "measured", "gpu": "estimated"},
        "objective": "latency",
        "mode": "latency",
        "solver": "heft",
        "solve_s": 0.0,
        "optimal": False,
        "value_s": 1.0,
        "lower_bound_s": 0.5,
        "gap": 1.0,
        "baselines": {},
        "speedup_over_fastest_single_device": None,
        "device_graph_acyclic": True,
        "feasible": True,
        "assignment": {"k": "gpu"},
        "device_busy_s": {},
        "memory_bytes": {},
        "stages": None,
        "estimated_figures": [
            {"device": "cpu", "figure": "peak_flops", "value": 1e11, "how": "this CPU"},
            {"device": "gpu", "figure": "bandwidth_Bps", "value": 3e11, "how": "datasheet of NVIDIA L4"},
        ],
    }
    text = format_row(row, ["cpu", "gpu"])
    assert "gpu bandwidth_Bps 300.0 GB/s: estimated (datasheet of NVIDIA L4)" in text
    assert "cpu peak_flops" not in text  # its kernels were timed
