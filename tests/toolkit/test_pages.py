"""Solvers and bounds allocate their arrays without numpy's huge-page advice (toolkit/pages.py): on
this project's VMs a fault on an advised array could stall for compaction (4.6-9 s per 800 MB)."""

import pytest

from tvm_diviml import bounds
from tvm_diviml.bounds import catalog
from tvm_diviml.solvers import Problem, get_solver
from tvm_diviml.solvers.heft import Heft
from tvm_diviml.toolkit import pages

from ..helpers import graph_of, table, unit_platform

pytestmark = pytest.mark.skipif(pages._set_huge_pages is None, reason="this numpy has no huge-page switch")


@pytest.mark.parametrize("before", [True, False])
def test_the_advice_is_off_inside_and_restored_after(before):
    seen = []

    @pages.without_huge_pages
    def work():
        seen.append(pages._set_huge_pages(False))

    previous = pages._set_huge_pages(before)
    try:
        work()
        assert seen == [False] and pages._set_huge_pages(before) is before
    finally:
        pages._set_huge_pages(previous)


def test_a_solve_and_the_bounds_run_without_it(monkeypatch):
    platform = unit_platform()
    problem = Problem(graph_of([("a", "b", 1)]), platform, table(platform, {"a": 1, "b": 1}))
    seen = []
    real_place, real_fastest = Heft.place, catalog.fastest_times

    def place(self, *args, **kwargs):
        seen.append(("solve", pages._set_huge_pages(False)))
        return real_place(self, *args, **kwargs)

    def fastest(*args):
        seen.append(("bounds", pages._set_huge_pages(False)))
        return real_fastest(*args)

    monkeypatch.setattr(Heft, "place", place)
    monkeypatch.setattr(catalog, "fastest_times", fastest)
    previous = pages._set_huge_pages(True)
    try:
        get_solver("heft").solve(problem)
        bounds.lower_bounds(problem)
        assert seen[0] == ("solve", False) and set(seen[1:]) == {("bounds", False)}  # bounds read it per bound
        assert pages._set_huge_pages(previous) is True
    finally:
        pages._set_huge_pages(previous)
