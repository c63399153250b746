"""The catalog of lower bounds: each entry runs where it applies, by the deadline it is given."""

from __future__ import annotations

import pytest

from tvm_diviml.bounds import BOUNDS, lower_bounds
from tvm_diviml.problem import Problem
from tvm_diviml.toolkit.deadline import Deadline

from ..helpers import graph_of, table, unit_platform


def chain(objective: str = "latency", stages: int | None = None) -> Problem:
    graph = graph_of([("a", "b", 1), ("b", "c", 1)])
    platform = unit_platform()
    costs = table(platform, {"a": 1.0, "b": {"A": 4.0, "B": 2.0, "C": 3.0}, "c": 1.0})
    return Problem(graph, platform, costs, objective=objective, stages=stages)


@pytest.mark.parametrize(
    "objective, stages, expected",
    [
        ("latency", None, {"average_load", "largest_kernel", "lp_load", "critical_path", "transfer_path"}),
        ("throughput", None, {"average_load", "lp_load"}),
        ("pipeline", 2, {"average_load", "largest_kernel", "lp_load", "neighbourhood", "separation"}),
    ],
)
def test_the_cheap_bounds_are_the_entries_that_apply(objective, stages, expected):
    problem = chain(objective, stages)
    parts = lower_bounds(problem)
    applying = {name for name, entry in BOUNDS.items() if entry.applies(problem)}
    assert expected <= set(parts)
    assert "pipeline" in applying if objective == "pipeline" else set(parts) <= applying
    assert not {"series", "overlap_branching", "downsets", "exact_mip"} & set(parts)  # no time to search given


def test_the_searches_run_only_with_time_given_and_a_deadline():
    problem = chain()
    searched = lower_bounds(problem, Deadline.after(30), search=True)
    assert searched["series"] == pytest.approx(max(searched.values()), rel=1e-6)  # the chain's optimum
    with pytest.raises(ValueError, match="needs a deadline"):
        lower_bounds(problem, search=True)


def test_each_search_says_when_it_starts_and_for_how_long():
    said: list[str] = []
    lower_bounds(chain(), Deadline.after(30), search=True, progress=said.append)
    assert said[0] == "bound: the series decomposition, up to 15 s" and said[1].startswith(
        "bound: overlap_branching, up to "
    )
