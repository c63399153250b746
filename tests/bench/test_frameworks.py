"""The frameworks suite without its timings: its catalogue, the share of the CPU's peak, the
torch.compile column's guard, and that every held-out model exports with torch.export."""

import itertools
import os

import pytest

from tvm_diviml.bench import frameworks
from tvm_diviml.bench.frameworks import CATALOGUE, QUICK_MODELS, peak_fraction

HELD_OUT = ("vit_b_16", "convnext_tiny", "resnet50_fpn_320", "gpt2_128", "t5_small_encoder_128")


def test_the_catalogue_marks_exactly_the_models_added_after_development_as_held_out():
    assert tuple(name for name, model in CATALOGUE.items() if model.held_out) == HELD_OUT
    assert set(QUICK_MODELS) <= set(CATALOGUE)
    assert frameworks._chosen("", quick=True) == list(QUICK_MODELS)
    assert frameworks._chosen("", quick=False) == list(CATALOGUE)


def test_the_peak_fraction_is_flops_per_second_over_the_peak_and_absent_without_a_figure():
    assert peak_fraction(2e9, 0.01, 1e12) == pytest.approx(0.2)
    assert peak_fraction(5e9, 0.5, 1e10) == pytest.approx(1.0)
    assert [peak_fraction(*figures) for figures in ((None, 0.01, 1e12), (2e9, None, 1e12), (2e9, 0.01, None))] == [
        None
    ] * 3


def test_the_peak_columns_divide_diviml_runs_by_the_measured_peak_on_every_thread(monkeypatch):
    asked = []
    monkeypatch.setattr(frameworks, "measured_peak_flops_per_s", lambda threads: asked.append(threads) or 4e11)
    notes = []
    columns = frameworks._peak_columns(8e9, {"diviml_s": 0.1, "diviml_tuned_s": None}, 2, notes)
    assert asked == [2]
    assert columns == {
        "peak_gflops_per_s": pytest.approx(400.0),
        "diviml_peak_fraction": pytest.approx(0.2),
        "diviml_tuned_peak_fraction": None,
    }
    assert notes == []


def test_a_peak_that_cannot_be_measured_leaves_the_columns_empty_with_a_note(monkeypatch):
    def no_peak(threads):
        raise RuntimeError("LLVM has no target for this CPU")

    monkeypatch.setattr(frameworks, "measured_peak_flops_per_s", no_peak)
    notes = []
    columns = frameworks._peak_columns(8e9, {"diviml_s": 0.1, "diviml_tuned_s": 0.05}, 2, notes)
    assert set(columns.values()) == {None}
    assert notes == ["peak: RuntimeError: LLVM has no target for this CPU"]


def _linear():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return torch.nn.Linear(8, 4).eval(), (torch.randn(1, 8),)


@pytest.fixture
def fixed_timings(monkeypatch):
    """Each framework's model called once, timed as 2 ms (ONNX Runtime: 1 ms), so the test needs no clock."""
    monkeypatch.setattr(frameworks, "_seconds_per_call", lambda call: (call(), 0.002)[1])
    monkeypatch.setattr(frameworks, "_onnxruntime", lambda module, args, scratch, name: 0.001)


def test_a_torch_compile_that_fails_leaves_its_columns_empty_with_a_note(monkeypatch, fixed_timings, tmp_path):
    torch = pytest.importorskip("torch")
    module, args = _linear()

    def no_compiler(model, **options):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(torch, "compile", no_compiler)
    notes = []
    times = frameworks.framework_times(module, args, str(tmp_path), "linear", 2, notes)
    assert (times["torch_compile_s"], times["torch_compile_build_s"]) == (None, None)
    assert notes == ["torch.compile: RuntimeError: InvalidCxxCompiler: No working C++ compiler found"]
    assert times["torch_s"] == times["torch_1_thread_s"] == 0.002
    assert times["best_framework_s"] == 0.001


def test_torch_compile_counts_among_the_frameworks_and_keeps_its_compile_seconds(monkeypatch, fixed_timings, tmp_path):
    module, args = _linear()
    monkeypatch.setattr(frameworks, "_torch_compiled", lambda module, args, threads, folder: (0.0005, 42.0))
    notes = []
    times = frameworks.framework_times(module, args, str(tmp_path), "linear", 2, notes)
    assert (times["torch_compile_s"], times["torch_compile_build_s"], times["best_framework_s"]) == (
        0.0005,
        42.0,
        0.0005,
    )
    skipped = frameworks.framework_times(module, args, str(tmp_path), "linear", 2, notes, torch_compile=False)
    assert (skipped["torch_compile_s"], skipped["best_framework_s"], notes) == (None, 0.001, [])


@pytest.mark.slow
@pytest.mark.parametrize("name", HELD_OUT)
def test_every_held_out_model_exports_with_torch_export(name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    pytest.importorskip("transformers")
    module, args = CATALOGUE[name].make()
    program = torch.export.export(module, args)
    outputs = [node for node in program.graph.nodes if node.op == "output"][0].args[0]
    assert isinstance(module, torch.nn.Module) and not module.training
    assert len(outputs) >= 1 and all(isinstance(a, torch.Tensor) for a in args)


@pytest.mark.slow
def test_torch_compile_compiles_cold_in_its_own_cache_folder_and_restores_the_environment(monkeypatch, tmp_path):
    module, args = _linear()
    monkeypatch.setattr(frameworks, "_seconds_per_call", lambda call: (call(), 0.002)[1])
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))
    seconds, compile_s = frameworks._torch_compiled(module, args, 1, str(tmp_path / "cold"))
    assert seconds == 0.002 and compile_s > 0
    assert any((tmp_path / "cold").iterdir())
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "users")


class _FakeClock:
    """``time.perf_counter`` for the paired timing: each call advances it by its framework's time,
    and the first call of each run of one framework by 125 ms more (another framework's threads still
    spinning). Powers of two, so that the sums are exact."""

    def __init__(self, monkeypatch, seconds: dict[str, float]):
        self.now, self.seconds, self.calls = 0.0, seconds, []
        monkeypatch.setattr(frameworks.time, "perf_counter", lambda: self.now)

    def call(self, key: str):
        def run():
            first = not self.calls or self.calls[-1] != key
            self.calls.append(key)
            self.now += self.seconds[key] + (0.125 if first else 0.0)

        return run


def test_the_paired_timing_alternates_blocks_and_leaves_each_blocks_first_call_untimed(monkeypatch):
    monkeypatch.setattr(frameworks, "PAIRED_BLOCK_S", 0.5)
    clock = _FakeClock(monkeypatch, {"diviml": 2**-10, "onnxruntime": 2**-9})
    seconds = frameworks.alternated_seconds({key: clock.call(key) for key in ("diviml", "onnxruntime")})
    assert seconds == {"diviml": 2**-10, "onnxruntime": 2**-9}
    rounds = frameworks.PAIRED_ROUNDS
    calls_in_block = {"diviml": 512 + 1, "onnxruntime": 256 + 1}  # the first untimed: the clock's 125 ms are not
    runs = [(key, len(list(group))) for key, group in itertools.groupby(clock.calls)]
    # the order reverses every round: d o | o d | d o ..., so each round's second block runs on into the next's first
    assert [key for key, _ in runs] == ["diviml", "onnxruntime"] * (rounds // 2) + ["diviml"]
    assert [length / calls_in_block[key] for key, length in runs] == [1] + [2] * (rounds - 1) + [1]


def test_the_paired_columns_put_diviml_over_the_faster_framework_and_note_one_that_fails(monkeypatch, tmp_path):
    module, args = _linear()
    clock = _FakeClock(monkeypatch, {"diviml": 2**-8 * 1.5, "onnxruntime": 2**-8, "torch": 2**-7})
    monkeypatch.setattr(frameworks, "load_artefact", lambda folder: lambda *arrays: clock.call("diviml")())
    monkeypatch.setattr(frameworks, "_onnxruntime_call", lambda *a: clock.call("onnxruntime"))
    monkeypatch.setattr(frameworks, "_torch_call", lambda module, args: clock.call("torch"))
    notes = []
    columns = frameworks.paired_times(str(tmp_path), module, args, str(tmp_path), "linear", 2, notes)
    assert columns == {
        "paired_diviml_s": 2**-8 * 1.5,
        "paired_onnxruntime_s": 2**-8,
        "paired_torch_s": 2**-7,
        "diviml_over_best_paired": 1.5,
    }
    assert notes == []

    def no_session(*a):
        raise RuntimeError("ONNX export failed")

    monkeypatch.setattr(frameworks, "_onnxruntime_call", no_session)
    columns = frameworks.paired_times(str(tmp_path), module, args, str(tmp_path), "linear", 2, notes)
    assert columns["paired_onnxruntime_s"] is None
    assert columns["diviml_over_best_paired"] == pytest.approx(0.75)
    assert notes == ["paired onnxruntime: RuntimeError: ONNX export failed"]
