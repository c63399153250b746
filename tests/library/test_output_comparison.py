"""Outputs against a reference, compared in one place (``tolerances.compare_outputs``): NaN and
infinities must fall where the reference has them, the tolerance follows each output's dtype (float16
models failed ``diviml run`` at float32's 1e-4), and no report prints an infinite or NaN time."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tvm_diviml.app.run import RunMeasurement, format_run
from tvm_diviml.cli import main
from tvm_diviml.plan import Plan
from tvm_diviml.profiling.candidates import Candidate, format_selection, select_fastest
from tvm_diviml.tolerances import compare_outputs, output_rtol

NAN, INF = np.nan, np.inf
FAST = ["--platform", "cpu2", "--cost", "roofline", "--objective", "latency", "--repeats", "2", "--time-limit", "5"]
FAST += ["--candidates", "0"]
NON_FINITE = re.compile(r"\b(nan|inf)x?\b")  # as Python prints them: "inf", "nanx"


def test_nan_and_infinities_where_the_reference_has_them_are_equal():
    want = [np.array([1.0, NAN, INF, -INF, 2.0], "float32")]
    same = compare_outputs([np.array([1.0, NAN, INF, -INF, 2.0], "float32")], want)
    assert same.equal() and same.max_rel_diff == 0 and same.misplaced == 0
    assert same.describe().endswith(": equal (NaN or infinity at the same 3 places in both)")


@pytest.mark.parametrize(
    "got",
    [
        [1.0, 2.0, INF, -INF, NAN],  # NaN where the reference has a number, a number where it has NaN
        [1.0, NAN, -INF, -INF, 2.0],  # the other infinity
        [1.0, NAN, INF, -INF, INF],  # an infinity where the reference has a number
    ],
)
def test_nan_or_an_infinity_anywhere_else_differs_whatever_the_tolerance(got):
    want = [np.array([1.0, NAN, INF, -INF, 2.0], "float32")]
    comparison = compare_outputs([np.array(got, "float32")], want)
    assert not comparison.equal() and not comparison.equal(rtol=1e9)
    assert comparison.max_rel_diff == INF and comparison.misplaced > 0
    assert re.search(r": DIFFERENT \(NaN or infinity unmatched at [12] places\)$", comparison.describe())


def test_the_tolerance_follows_each_outputs_dtype():
    assert output_rtol("float32") == output_rtol("float64") == 1e-4
    assert output_rtol("float16") == pytest.approx(9.77e-3, rel=1e-3)
    assert output_rtol("int64") == output_rtol("bool") == 0
    half = [np.array([100.0, -50.0], "float16")]
    off_by_two_ulps = [np.array([100.125, -50.0], "float16")]
    assert compare_outputs(off_by_two_ulps, half).equal()
    assert not compare_outputs([a.astype("float32") for a in off_by_two_ulps], [half[0].astype("float32")]).equal()
    ints = [np.array([3, 4])]
    assert not compare_outputs([np.array([3, 5])], ints).equal() and compare_outputs(ints, ints).equal()
    mixed = compare_outputs(off_by_two_ulps + ints, half + ints)
    assert "(rtol 0.00977 for float16, exact for int64): equal" in mixed.describe()
    assert "(rtol 1e-06, as given): DIFFERENT (beyond rtol 1e-06)" in mixed.describe(rtol=1e-6)


def run_measurement(measured_s: float, single_s: float) -> RunMeasurement:
    want = [np.array([1.0, NAN])]
    return RunMeasurement(
        objective="latency",
        predicted_s=1e-3,
        measured_s=measured_s,
        outputs=compare_outputs([np.array([1.0, NAN])], want),
        device_busy_s={"cpu0": measured_s},
        build_s=0.1,
        samples_s=[measured_s],
        single_device_s={"cpu0 (1 thread)": single_s, "cpu0 (2 threads)": 2e-3},
        one_worker="cpu0 (1 thread)",
    )


@pytest.mark.parametrize("measured_s, single_s", [(INF, 1e-3), (NAN, 1e-3), (1e-3, INF), (0.0, 1e-3)])
def test_a_run_report_never_prints_an_infinite_or_nan_time_or_speedup(measured_s, single_s):
    report = format_run(run_measurement(measured_s, single_s))
    assert not NON_FINITE.search(report), report
    assert re.search(r"^speed-up over one worker \(cpu0 \(1 thread\)\): -$", report, re.MULTILINE), report


@pytest.mark.parametrize(
    "measured_s, says",
    [
        (1.9e-3, None),
        (0.55e-3, None),
        (2.5e-3, "measured slower than predicted by more than 2x; the likely causes:"),
        (0.4e-3, "measured faster than predicted by more than 2x; the likely causes:"),
    ],
)
def test_a_run_far_off_its_prediction_lists_the_likely_causes_and_their_fixes(measured_s, says):
    report = format_run(run_measurement(measured_s, 1e-3))  # predicted 1 ms
    if says is None:
        assert "likely causes" not in report
        return
    lines = report.splitlines()
    causes = lines[lines.index(says) + 1 :]
    assert causes and all(line.startswith("  - ") for line in causes[:2])
    assert any("--cost measured" in line for line in causes) and any("diviml cache clear" in line for line in causes)


def test_a_candidate_without_a_time_or_with_other_outputs_never_wins_and_prints_no_inf():
    labels = ["fast but wrong", "no time", "slow", "fastest right"]
    candidates = [Candidate(label, Plan({"k": "cpu0"}), 1e-3) for label in labels]
    candidates[0].outputs_differ = True
    seconds = {"fast but wrong": 1e-4, "no time": INF, "slow": 3e-3, "fastest right": 2e-3}
    selection = select_fastest(candidates, lambda c: seconds[c.label])
    assert [c.label for c in selection.candidates] == ["fastest right", "slow", "no time", "fast but wrong"]
    assert selection.candidates[2].measured_s is None and selection.margin == pytest.approx(1.5)
    table = format_selection(selection)
    assert not NON_FINITE.search(table), table
    assert re.search(r"fast but wrong .*measured +100\.000 us  \(outputs DIFFERENT from the reference\)$", table, re.M)


def test_diviml_run_calls_nan_at_the_same_places_equal(tmp_path, capsys):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8)).eval()

    class LogOfLinear(torch.nn.Module):
        def forward(self, x):
            return torch.log(model(x))  # NaN wherever the linear layer gives a negative number

    path = str(tmp_path / "log.pt2")
    torch.export.save(torch.export.export(LogOfLinear(), (torch.randn(4, 8),)), path)
    code = main(["run", path, *FAST])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert re.search(
        r"^outputs against the single-device build: .*: equal \(NaN or infinity at the same \d+ places", out, re.M
    )
    assert not NON_FINITE.search(out), out


def test_diviml_run_holds_a_float16_model_to_float16s_tolerance(tmp_path, capsys):
    """A float16 CNN's two builds differed by 1.7e-3 of the largest output (1.7 ulps): beyond 1e-4."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")
    pytest.importorskip("onnx", reason="onnx is not installed (pip install 'tvm-diviml[onnx]')")
    torch.manual_seed(0)

    class Convolutions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 16, 3, padding=1)
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, x):
            return self.norm(self.second(torch.relu(self.first(x))).mean(dim=(2, 3)))

    path = str(tmp_path / "half.onnx")
    torch.onnx.export(Convolutions().eval().half(), (torch.randn(2, 3, 16, 16).half(),), path, dynamo=False)
    code = main(["run", path, *FAST])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert re.search(r"^outputs against the single-device build: .*\(rtol 0.00977 for float16\): equal$", out, re.M)
