"""The shared MIP backend: a HiGHS presolve error is answered by a solve without presolve."""

from __future__ import annotations

import mip
import pytest

from tvm_diviml.toolkit.mip_backend import new_model, optimized


def partition(backend):
    """Cover a, b, c exactly once by {a, b}, {b, c}: infeasible."""
    model = new_model("partition", backend)
    ab, bc = (model.add_var(var_type=mip.BINARY, obj=1.0) for _ in range(2))
    model += ab == 1
    model += ab + bc == 1
    model += bc == 1
    return model


def failing_once(model, monkeypatch):
    """``model.optimize`` raising as HiGHS's presolve did on a set partition, once; the options each call saw."""
    calls, solve = [], model.optimize

    def optimize(**options):
        calls.append(dict(options))
        if len(calls) == 1:
            raise mip.InterfacingError("Unknown error in call to HiGHS.")
        return solve(**options)

    monkeypatch.setattr(model, "optimize", optimize)
    return calls


def test_a_highs_presolve_error_is_solved_again_without_presolve(monkeypatch):
    model = partition("highs")
    calls, options, set_option = failing_once(model, monkeypatch), [], model.solver._set_string_option_value
    monkeypatch.setattr(model.solver, "_set_string_option_value", lambda *o: options.append(o) or set_option(*o))
    assert optimized(model, max_seconds=5) == mip.OptimizationStatus.INFEASIBLE
    assert calls == [{"max_seconds": 5}, {"max_seconds": 5}] and ("presolve", "off") in options


def test_other_backends_errors_are_not_hidden(monkeypatch):
    model = partition("cbc")
    failing_once(model, monkeypatch)
    with pytest.raises(mip.InterfacingError):
        optimized(model, max_seconds=5)
