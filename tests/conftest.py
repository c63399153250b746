"""pytest's set-up for the whole suite: the property tests' profile and the fixtures; what test files
share as functions is in helpers.py."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from .helpers import MSR_FIDDLE, THOROUGH

# Property tests draw the same examples on every run (`make test`, CI), so a red run can be rerun;
# HYPOTHESIS_PROFILE=thorough (`make test-all`) draws fresh ones, five times as many.
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("thorough", derandomize=False)
settings.load_profile("thorough" if THOROUGH else "repeatable")


@pytest.fixture
def msr_fiddle_dir():
    if not os.path.isdir(MSR_FIDDLE):
        pytest.skip("../shared/data/msr-fiddle is absent")
    return os.path.abspath(MSR_FIDDLE)
