"""The suite declarations behind `diviml bench`: each option a suite declares is a keyword of its function
with the same default, and the command line offers exactly the declared flags."""

import inspect
import subprocess
import sys

import pytest

from tvm_diviml.bench import SUITES, offers_by_flag
from tvm_diviml.cli import parse_args


@pytest.mark.parametrize("name", list(SUITES))
def test_declared_options_match_the_suite_function(name):
    suite = SUITES[name]
    parameters = inspect.signature(suite.run).parameters
    assert {option.name: option.default for option in suite.options} == {
        key: parameter.default for key, parameter in parameters.items()
    }
    assert suite.description and "\n" not in suite.description


def test_the_command_line_offers_the_declared_flags():
    bench = parse_args(["bench"])
    assert bench.suite == "simulator"
    flags = {"--time-limit", "--bound-time-limit", "--mip-nodes", "--quick", "--tune-minutes", "--models", "--case"}
    assert set(offers_by_flag(SUITES.values())) == flags
    assert (bench.time_limit, bench.bound_time_limit, bench.quick) == (None, None, None)


def test_the_suite_registry_imports_neither_tvm_nor_torch():
    code = "import sys, tvm_diviml.bench; print('tvm' in sys.modules or 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


def test_the_time_limits_suite_times_a_whole_solve_and_judges_it_by_the_target():
    from tvm_diviml.bench.time_limits import suite_time_limits, within_target

    assert within_target(7.5, 5.0) and not within_target(7.6, 5.0)
    rows = list(suite_time_limits(time_limit_s=1.0, quick=True))
    assert [(row["kernels"], row["devices"]) for row in rows] == [(12, 64), (200, 16)]
    for row in rows:
        assert row["wall_s"] > 0 and row["over_limit"] == row["wall_s"] / 1.0 and 0 <= row["gap"] < 1


def test_the_frameworks_suite_divides_tuned_by_default_builds_of_the_same_run():
    """The tuned run times the default schedules beside the tuned builds: the ratio comes from those
    (single-device tuned builds only), and is absent where the run had no default-schedule build."""
    from tvm_diviml.bench.frameworks import _tuned_over_default

    candidates = [
        {"label": "split plan", "devices": ["cpu0", "cpu1"], "measured_s": 1.0, "default_schedules": False},
        {"label": "whole CPU", "devices": ["cpu0"], "measured_s": 3.0, "default_schedules": False},
        {"label": "cpu0", "devices": ["cpu0"], "measured_s": 4.0, "default_schedules": False},
        {"label": "whole CPU, default schedules", "devices": ["cpu0"], "measured_s": 2.0, "default_schedules": True},
    ]
    assert _tuned_over_default(candidates) == 1.5
    assert _tuned_over_default(candidates[:3]) is None
