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
    assert 0 < solved.bound_s <= solved.plan.value_s * (1 + 1e-9)


def test_load_model_takes_a_model_string_a_name_with_options_or_a_relax_module():
    spec = tvm_diviml.load_model("twin_branch:depth=2,hidden=16")
    named = tvm_diviml.load_model("twin_branch", {"depth": 2, "hidden": 16})
    assert spec.built.name == named.built.name == "twin_branch:depth=2,hidden=16"
    assert sorted(spec.extraction.graph.kernels) == sorted(named.extraction.graph.kernels) != []
    weights = [weight for _, weight in spec.built.params]
    module = tvm_diviml.load_model(spec.built.mod, entry=spec.built.entry, params=weights, name="mine")
    assert module.built.name == "mine" and len(module.extraction.graph) == len(spec.extraction.graph)
