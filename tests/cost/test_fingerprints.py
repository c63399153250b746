"""Data made for one model is never used for another: cost tables and cost models carry the kernels they
were made for (names coincide across a model's sizes), exported builds the library they were exported
with, and a tuning database must hold records for the model it tunes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tvm_diviml.cost.roofline import RooflineCostModel
from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import OpGraph
from tvm_diviml.presets import get_platform
from tvm_diviml.problem import Problem
from tvm_diviml.synthetic import random_dag

CPU2 = get_platform("cpu2")


def resized(graph: OpGraph, kernel: str, factor: float) -> OpGraph:
    """The same graph with one kernel's work scaled: the kernel names of another size of the model."""
    data = graph.to_json()
    for raw in data["kernels"]:
        if raw["name"] == kernel:
            raw["flops"] *= factor
    return OpGraph.from_json(data)


def exported_table(graph: OpGraph) -> dict:
    """A table as ``diviml profile --export`` writes it for ``graph``."""
    return TableCostModel(
        CPU2,
        {k: {d: 1e-4 for d in CPU2.device_names} for k in graph.kernels},
        fingerprints={name: kernel.fingerprint for name, kernel in graph.kernels.items()},
        made_for={"model": "small", "targets": {d.name: d.target for d in CPU2.devices}, "versions": {"tvm": "0.27"}},
    ).to_json()


def test_a_table_made_for_another_size_of_the_model_is_refused_naming_the_kernel():
    small = random_dag(kernels=6, seed=2)
    third = small.topo_order[2]
    table = TableCostModel.from_json(json.loads(json.dumps(exported_table(small))), CPU2)
    table.check_covers(small)  # the model it was made for
    with pytest.raises(DivimlInputError, match=f"kernel '{third}' differs") as error:
        table.check_covers(resized(small, third, 32.0))
    assert "measured for small" in str(error.value)


def test_a_table_measured_as_another_target_is_refused_naming_the_device():
    data = exported_table(random_dag(kernels=3, seed=0))
    data["made_for"]["targets"]["cpu1"] = {"kind": "llvm", "mcpu": "cortex-a72"}
    with pytest.raises(DivimlInputError, match="device 'cpu1' was measured as target"):
        TableCostModel.from_json(data, CPU2)


def test_a_hand_written_table_without_fingerprints_is_still_read():
    graph = random_dag(kernels=3, seed=0)
    data = {"kernels": {k: {d: 1e-4 for d in CPU2.device_names} for k in graph.kernels}}
    TableCostModel.from_json(data, CPU2).check_covers(resized(graph, graph.topo_order[0], 2.0))


def test_a_cost_model_built_for_another_graph_is_refused_by_the_problem():
    small = random_dag(kernels=6, seed=2)
    large = resized(small, small.topo_order[0], 100.0)
    Problem(small, CPU2, RooflineCostModel(small, CPU2)).validate()
    with pytest.raises(DivimlInputError, match=f"kernel '{small.topo_order[0]}' differs"):
        Problem(large, CPU2, RooflineCostModel(small, CPU2)).validate()
    same_kernels = OpGraph.from_json(small.to_json())  # another object, the same kernels: fine
    Problem(same_kernels, CPU2, RooflineCostModel(small, CPU2)).validate()


def test_a_fingerprint_is_the_kernels_work_and_primfunc():
    kernel = random_dag(kernels=2, seed=0).kernels["k0"]
    assert kernel.fingerprint == dataclasses.replace(kernel).fingerprint
    assert kernel.fingerprint != dataclasses.replace(kernel, flops=kernel.flops + 1).fingerprint
    assert kernel.fingerprint != dataclasses.replace(kernel, attrs={"primfunc_hash": "abc"}).fingerprint
