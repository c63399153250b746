"""The ``time_limits`` suite: does a solve (plan, baselines and bounds, as ``diviml plan`` makes them)
end within its time limit, on random DAGs of 12 to 10,000 kernels, a branchy graph of 100,000 and
platforms of 2 to 1,000 devices?

The target is the wall time at most 10% + 2 s over the limit; a row says how far it went. Start-up,
loading the model and printing the report are not timed (about 2 s for ``diviml plan``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial

from ..cost.roofline import RooflineCostModel
from ..graph import OpGraph
from ..planning import plan_model
from ..presets import get_platform
from ..problem import Problem
from ..synthetic import branchy, random_dag
from .suite import Row

TIME_LIMIT_S = 5.0
BOUND_TIME_LIMIT_S = 10.0  # diviml plan's default: a quarter of the limit at most is kept for bounds


def sparse_random(kernels: int) -> OpGraph:
    """A sparse random DAG (three inputs per kernel on average), as large models are."""
    return random_dag(kernels, seed=0, edge_probability=min(0.25, 3.0 / kernels))


# (graph, platform, objective, stages); 100,000 kernels as parallel chains: random_dag's generator
# is quadratic in the kernels (hours there)
CASES = [
    (partial(sparse_random, 12), "gpu64", "latency", None),
    (partial(sparse_random, 200), "gpu16", "latency", None),
    (partial(sparse_random, 2000), "gpu2", "latency", None),
    (partial(sparse_random, 2000), "gpu8", "latency", None),
    (partial(sparse_random, 2000), "gpu64", "latency", None),
    (partial(sparse_random, 2000), "gpu8", "pipeline", 8),
    (partial(sparse_random, 10000), "paper-node", "latency", None),
    (partial(sparse_random, 10000), "gpu8", "pipeline", 8),
    (partial(sparse_random, 16), "gpu1000", "latency", None),
    (partial(sparse_random, 16), "servers:64xpaper-node", "latency", None),
    (partial(branchy, 100, 1000), "paper-node", "latency", None),
]
QUICK_CASES = CASES[:2]


def within_target(wall_s: float, limit_s: float) -> bool:
    """The target: at most 10% + 2 s over the limit."""
    return wall_s <= 1.1 * limit_s + 2.0


def suite_time_limits(time_limit_s: float = TIME_LIMIT_S, quick: bool = False) -> Iterator[Row]:
    """One solve per case with ``time_limit_s``; the wall time beside the limit."""
    for make_graph, platform_name, objective, stages in QUICK_CASES if quick else CASES:
        graph = make_graph()
        platform = get_platform(platform_name)
        problem = Problem(graph, platform, RooflineCostModel(graph, platform), objective=objective, stages=stages)
        began = time.perf_counter()
        solved = plan_model(problem, time_limit_s=time_limit_s, bound_time_limit_s=BOUND_TIME_LIMIT_S)
        wall_s = time.perf_counter() - began
        yield {
            "suite": "time_limits",
            "graph": graph.name,
            "kernels": len(graph),
            "platform": platform_name,
            "devices": len(platform.devices),
            "objective": objective if stages is None else f"{objective} K={stages}",
            "solver": solved.plan.solver,
            "time_limit_s": time_limit_s,
            "wall_s": wall_s,
            "over_limit": wall_s / time_limit_s,
            "within_target": within_target(wall_s, time_limit_s),
            "gap": 1.0 - solved.bound_s / solved.value_s if solved.value_s else 0.0,
        }
