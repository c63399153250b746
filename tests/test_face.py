"""``import tvm_diviml`` is the library's face: every name it lists resolves (lazily), importing it
loads no TVM, and a model planned through it is scored as the simulator scores it."""

import subprocess
import sys

import pytest

import tvm_diviml


def test_every_listed_name_resolves_and_the_import_alone_loads_no_tvm():
    script = (
        "import sys, tvm_diviml\n"
        "assert 'tvm' not in sys.modules, 'import tvm_diviml loaded TVM'\n"
        "missing = [name for name in tvm_diviml.__all__ if getattr(tvm_diviml, name, None) is None]\n"
        "assert not missing, missing\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'plan_everything'"):
        tvm_diviml.plan_everything  # noqa: B018 (a submodule's name, such as plan, is an attribute once imported)


def test_a_model_planned_through_the_face_is_what_the_simulator_says():
    work = tvm_diviml.load_workload("twin_branch", "paper-node", "roofline")
    problem = tvm_diviml.Problem(work.graph, work.platform, work.costs, objective="latency")
    solved = tvm_diviml.plan_model(problem, "auto", time_limit_s=10)
    assert solved.plan.value_s == pytest.approx(tvm_diviml.simulate(problem, solved.plan).value_s, rel=1e-12)
    assert 0 < solved.lower_bound_s <= solved.plan.value_s * (1 + 1e-9)
