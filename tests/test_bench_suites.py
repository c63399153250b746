"""The suite declarations behind `diviml bench`: each option a suite declares is a keyword of its function
with the same default, and the command line offers exactly the declared flags."""

import inspect
import subprocess
import sys

import pytest

from tvm_diviml.bench import SUITES, offers_by_flag
from tvm_diviml.cli import build_parser


@pytest.mark.parametrize("name", list(SUITES))
def test_declared_options_match_the_suite_function(name):
    suite = SUITES[name]
    parameters = inspect.signature(suite.run).parameters
    assert {option.name: option.default for option in suite.options} == {
        key: parameter.default for key, parameter in parameters.items()
    }
    assert suite.description and "\n" not in suite.description


def test_the_command_line_offers_the_declared_flags():
    bench = build_parser().parse_args(["bench"])
    assert bench.suite == "simulator"
    flags = {"--time-limit", "--bound-time-limit", "--mip-nodes", "--quick", "--tune-minutes", "--models"}
    assert set(offers_by_flag(SUITES.values())) == flags
    assert (bench.time_limit, bench.bound_time_limit, bench.quick) == (None, None, None)


def test_the_suite_registry_imports_neither_tvm_nor_torch():
    code = "import sys, tvm_diviml.bench; print('tvm' in sys.modules or 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
