"""Hostile input (bad options, sizes, files and platforms): a clear DivimlInputError naming the field,
or a valid result; never a traceback, never NaN. Parametrized cases found by trying the tool as an
attacker would, then a hypothesis fuzz over fields."""

from __future__ import annotations

import copy
import json
import math
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_diviml.app.report import solve_and_report
from tvm_diviml.app.workload import load_graph
from tvm_diviml.cost.table import TableCostModel
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import OpGraph
from tvm_diviml.msr_fiddle import is_msr_fiddle, read_msr_fiddle
from tvm_diviml.platform import Platform
from tvm_diviml.presets import get_platform
from tvm_diviml.profiling.cache import LinkKey, LinkMeasurement, Measurement, ProfileCache, ProfileKey
from tvm_diviml.simulator import simulate
from tvm_diviml.solvers import Problem
from tvm_diviml.synthetic import random_dag

from ..helpers import examples

PLATFORM = get_platform("paper-node").to_json()
GRAPH = random_dag(kernels=6, seed=1).to_json()
MSR = {
    "maxFPGAs": 2,
    "maxCPUs": 1,
    "maxSizePerFPGA": 100.0,
    "nodes": [
        {"id": 1, "cpuLatency": 2.0, "fpgaLatency": 1.0, "supportedOnFpga": 1, "size": 10.0},
        {"id": 2, "cpuLatency": 2.0, "fpgaLatency": 1.0, "supportedOnFpga": 1, "size": 10.0},
    ],
    "edges": [{"sourceId": 1, "destId": 2, "cost": 1.0}],
}


def platform_with(path, value):
    data = copy.deepcopy(PLATFORM)
    target = data
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "path, value, field",
    [
        (("devices", 1, "peak_flops"), "fast", "devices[rtx2080ti].peak_flops"),
        (("devices", 1, "memory_bytes"), "lots", "devices[rtx2080ti].memory_bytes"),
        (("devices", 1, "memory_bytes"), math.nan, "devices[rtx2080ti].memory_bytes"),
        (("devices", 1, "efficiency"), "0.5", "devices[rtx2080ti].efficiency"),
        (("devices", 1, "launch_overhead_s"), math.nan, "devices[rtx2080ti].launch_overhead_s"),
        (("default_link",), "fast", "default_link"),
        (("links",), None, "links"),
        (("links", 0, "latency_s"), math.nan, "latency_s"),
        (("links", 0, "bandwidth_Bps"), math.inf, "bandwidth_Bps"),
        (("links", 0, "bandwidth_Bps"), -1e9, "bandwidth_Bps"),
    ],
)
def test_bad_platform_fields_are_named(path, value, field):
    with pytest.raises(DivimlInputError) as info:
        Platform.from_json(platform_with(path, value))
    assert field in info.value.field


@pytest.mark.parametrize(
    "data, field",
    [
        ({"kernels": {"a": {"cpu0": 1e300}}}, "kernels.a.cpu0"),
        ({"kernels": {"a": {"cpu0": math.nan}}}, "kernels.a.cpu0"),
        (
            {"kernels": {}, "links": [{"src": "cpu0", "dst": "cpu1", "latency_s": -1, "bandwidth_Bps": 1e9}]},
            "latency_s",
        ),
        (
            {"kernels": {}, "links": [{"src": "cpu0", "dst": "cpu1", "latency_s": 0, "bandwidth_Bps": 0}]},
            "bandwidth_Bps",
        ),
        (
            {"kernels": {}, "links": [{"src": "cpu0", "dst": "cpu1", "latency_s": 0, "bandwidth_Bps": -1e9}]},
            "bandwidth_Bps",
        ),
        ({"kernels": {}, "sources": [1, 2]}, "sources"),
    ],
)
def test_bad_cost_tables_are_named(data, field):
    with pytest.raises(DivimlInputError) as info:
        TableCostModel.from_json(data, get_platform("cpu2"))
    assert field in info.value.field


def graph_with(change):
    data = copy.deepcopy(GRAPH)
    change(data)
    return data


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d["kernels"][0].update(attrs=[1, 2]), "attrs"),
        (lambda d: d["kernels"][0].update(allowed_devices="cpu"), "allowed_devices"),
        (lambda d: d["kernels"][0].update(weights="w0"), "weights"),
        (lambda d: d.update(outputs="k5"), "outputs"),
        (lambda d: d["kernels"][0].update(flops=math.inf), "flops"),
        (lambda d: d["edges"][0].update(bytes=math.inf), "bytes"),
    ],
)
def test_bad_graph_fields_are_named(change, field):
    with pytest.raises(DivimlInputError) as info:
        OpGraph.from_json(graph_with(change))
    assert field in info.value.field


def test_an_empty_graph_is_refused_for_every_objective():
    empty = OpGraph.from_json({"kernels": [], "edges": []})
    platform = get_platform("paper-node")
    from tvm_diviml.cost.roofline import RooflineCostModel

    for objective, stages in (("latency", None), ("throughput", None), ("pipeline", 2)):
        with pytest.raises(DivimlInputError, match="no kernels to place"):
            solve_and_report(
                Problem(empty, platform, RooflineCostModel(empty, platform), objective=objective, stages=stages),
                "auto",
                "empty",
                "roofline",
            )


def test_json_nested_too_deeply_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(DivimlInputError, match="nested too deeply"):
        Platform.load(str(path))


PLACEHOLDER = 123456.789  # written into a file's JSON, then replaced by a huge integer literal


@pytest.mark.parametrize("digits", [400, 5000])
@pytest.mark.parametrize(
    "kind, field",
    [("graph", "kernels[k0].flops"), ("platform", "devices[cpu].peak_flops"), ("costs", "kernels.k0.cpu")],
)
def test_integers_of_hundreds_of_digits_name_their_file_and_field(tmp_path, kind, field, digits):
    """Python refuses integers past 4,300 digits and floats past 1e308: one line, file and field."""
    graph, platform = copy.deepcopy(GRAPH), copy.deepcopy(PLATFORM)
    graph["kernels"][0]["flops"] = platform["devices"][0]["peak_flops"] = PLACEHOLDER
    data, load = {
        "graph": (graph, OpGraph.load),
        "platform": (platform, Platform.load),
        "costs": (
            {"kernels": {"k0": {"cpu": PLACEHOLDER}}},
            lambda p: TableCostModel.load(p, Platform.from_json(PLATFORM)),
        ),
    }[kind]
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps(data).replace(repr(PLACEHOLDER), "9" * digits))
    with pytest.raises(DivimlInputError, match=rf"an integer of {digits} digits") as info:
        load(str(path))
    assert info.value.source == str(path) and field in info.value.field


def test_a_key_given_twice_in_a_json_object_is_refused(tmp_path):
    path = tmp_path / "platform.json"
    path.write_text(json.dumps(PLATFORM).replace("{", '{"name": "first", ', 1))
    with pytest.raises(DivimlInputError, match="key 'name' appears twice in one object") as info:
        Platform.load(str(path))
    assert info.value.source == str(path)


@pytest.mark.parametrize(
    "spec",
    [
        "llama:layers=-1",
        "llama:layers=0",
        "llama:heads=0",
        "bert_base:seq=0",
        "branchy:branches=0",
        "random:kernels=0",
        "llama:layers=2.5",
    ],
)
def test_counts_in_model_options_must_be_positive_integers(spec):
    with pytest.raises(DivimlInputError, match="must be a positive integer"):
        load_graph(spec)


@settings(max_examples=examples(12), deadline=None, derandomize=True)
@given(
    st.sampled_from(
        [
            ("random", "kernels"),
            ("branchy", "branches"),
            ("resnet18", "batch"),
            ("resnet18", "resolution"),
            ("bert_base", "seq"),
        ]
    ),
    st.integers(7, 400),
)
def test_zoo_options_too_large_for_any_machine_are_refused_in_one_line(model_option, digits):
    """random:kernels=1000000000 ran for ever (a quadratic generator), resnet18:batch=1000000000
    raised numpy's _ArrayMemoryError: every size past what can be made is one line naming it."""
    model, option = model_option
    with pytest.raises(DivimlInputError) as refused:
        load_graph(f"{model}:{option}={10**digits}")
    assert "\n" not in str(refused.value) and refused.value.field == "MODEL"


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d.pop("maxFPGAs"), "maxFPGAs"),
        (lambda d: d.update(maxFPGAs=2.5), "maxFPGAs"),
        (lambda d: d["nodes"][0].update(fpgaLatency=math.nan), "fpgaLatency"),
    ],
)
def test_bad_msr_fiddle_files_are_named(change, field):
    data = copy.deepcopy(MSR)
    change(data)
    assert is_msr_fiddle(data)
    with pytest.raises(DivimlInputError) as info:
        read_msr_fiddle(data)
    assert field in info.value.field


def test_a_cache_with_bad_rows_measures_them_again(tmp_path, caplog):
    key = ProfileKey("k", "llvm", "cpu", "0.27", "default")
    link = LinkKey("cpu:0", "cpu:1", "host", "0.27")
    path = str(tmp_path / "c.sqlite")
    with ProfileCache(path) as cache:
        cache.put_many({key: Measurement(1e-3, 1e-5, 5, "measured")})
        cache.put_link(link, LinkMeasurement(1e-5, 1e10, 0.01))
    for median in (-0.5, "text"):
        with sqlite3.connect(path) as db:
            db.execute("UPDATE kernel_profile SET median_s = ?", (median,))
            db.execute("UPDATE link_profile SET bandwidth_Bps = ?", (median,))
        with ProfileCache(path) as cache:
            assert cache.get_many([key]) == {} and cache.get_link(link) is None
            cache.put_many({key: Measurement(2e-3, 1e-5, 5, "measured")})  # measured again, replaced
            assert cache.get_many([key])[key].median_s == 2e-3
    assert "damaged row" in caplog.text and "damaged link row" in caplog.text


# ---------------------------------------------------------------------- fuzz
BAD_VALUES = st.sampled_from(
    [None, True, -1, 0, -0.5, math.nan, math.inf, -math.inf, 1e308, 10**400, -(10**5000), "x", "", [], [1, 2]]
    + [{}, {"a": 1}, [[[]]]]
)


def paths(data, prefix=()):
    """Every (path to a value) in nested dicts and lists."""
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    else:
        return [prefix]
    found = [prefix] if prefix else []
    for key, value in items:
        found += paths(value, (*prefix, key))
    return found


def mutated(data, path, value, drop):
    data = copy.deepcopy(data)
    target = data
    for step in path[:-1]:
        target = target[step]
    if drop and isinstance(target, dict):
        target.pop(path[-1])
    else:
        target[path[-1]] = value
    return data


def solved_or_refused(graph_json, platform_json, table_json=None, objective="latency", finite=False):
    """Reading and planning give a DivimlInputError or a report without NaN; nothing else. ``finite``:
    a plan's value is also finite and the simulator's."""
    try:
        graph, platform = OpGraph.from_json(graph_json), Platform.from_json(platform_json)
        if table_json is None:
            from tvm_diviml.cost.roofline import RooflineCostModel

            costs = RooflineCostModel(graph, platform)
        else:
            costs = TableCostModel.from_json(table_json, platform)
            costs.check_covers(graph)
        stages = len(platform.devices) if objective == "pipeline" else None
        problem = Problem(graph, platform, costs, objective=objective, stages=stages)
        plan, sim, row = solve_and_report(problem, SOLVER, "fuzz", "fuzz", time_limit_s=2)
    except DivimlInputError as error:
        assert "\n" not in str(error)
        return
    json.dumps(row, allow_nan=False) if sim.feasible else None
    assert not math.isnan(row["value_s"])
    if finite:
        assert math.isfinite(row["value_s"]) and row["value_s"] == simulate(problem, plan).value_s


SOLVER = "auto"  # split with CP-SAT windows for latency: the default path
FUZZ = settings(
    max_examples=examples(40), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
SMALL_PLATFORM = get_platform("paper-node").to_json()
SMALL_GRAPH = random_dag(kernels=4, seed=2).to_json()


@FUZZ
@given(st.data())
def test_fuzzed_graphs_are_planned_or_refused(data):
    path = data.draw(st.sampled_from(paths(SMALL_GRAPH)))
    value, drop = data.draw(BAD_VALUES), data.draw(st.booleans())
    solved_or_refused(mutated(SMALL_GRAPH, path, value, drop), SMALL_PLATFORM)


@FUZZ
@given(st.data())
def test_fuzzed_platforms_are_planned_or_refused(data):
    path = data.draw(st.sampled_from(paths(SMALL_PLATFORM)))
    value, drop = data.draw(BAD_VALUES), data.draw(st.booleans())
    solved_or_refused(SMALL_GRAPH, mutated(SMALL_PLATFORM, path, value, drop))


@FUZZ
@given(st.data())
def test_fuzzed_cost_tables_are_planned_or_refused(data):
    graph = OpGraph.from_json(SMALL_GRAPH)
    platform = Platform.from_json(SMALL_PLATFORM)
    from tvm_diviml.cost.roofline import RooflineCostModel

    roofline = RooflineCostModel(graph, platform)
    from tvm_diviml.cost.table import TableCostModel as Table

    table = Table(
        platform,
        {k: {d: roofline.compute_s(k, d) for d in platform.device_names} for k in graph.kernels},
        dict(platform.links),
    ).to_json()
    path = data.draw(st.sampled_from(paths(table)))
    value, drop = data.draw(BAD_VALUES), data.draw(st.booleans())
    solved_or_refused(SMALL_GRAPH, SMALL_PLATFORM, mutated(table, path, value, drop))


@FUZZ
@given(st.data())
def test_fuzzed_msr_fiddle_files_are_planned_or_refused(data):
    path = data.draw(st.sampled_from(paths(MSR)))
    value, drop = data.draw(BAD_VALUES), data.draw(st.booleans())
    try:
        graph, platform, costs = read_msr_fiddle(mutated(MSR, path, value, drop))
    except DivimlInputError as error:
        assert "\n" not in str(error)
        return
    for objective in ("latency", "throughput"):
        try:
            _, _, row = solve_and_report(
                Problem(graph, platform, costs, objective=objective), SOLVER, "fuzz", "fuzz", time_limit_s=2
            )
        except DivimlInputError as error:
            assert "\n" not in str(error)
            continue
        assert not math.isnan(row["value_s"]) and (row["lower_bound_s"] is None or not math.isnan(row["lower_bound_s"]))


CACHE_COLUMNS = {
    "kernel_profile": ["median_s", "spread_s", "repeats", "source", "recorded_at", "primfunc_hash"],
    "link_profile": ["latency_s", "bandwidth_Bps", "max_rel_error", "recorded_at", "src"],
}


@FUZZ
@given(
    st.sampled_from(sorted((t, c) for t, cs in CACHE_COLUMNS.items() for c in cs)),
    st.sampled_from([None, -1, 0, -0.5, math.nan, math.inf, -math.inf, 1e308, "x", "", b"\x00\xff", 2**62]),
)
def test_fuzzed_profile_cache_rows_are_measured_again_or_served_whole(tmp_path_factory, column, value):
    """A row whose field is damaged is dropped (and measured again), never served and never a traceback;
    what is served is a whole, finite, positive measurement."""
    table_name, name = column
    key = ProfileKey("k", "llvm", "cpu", "0.27", "default")
    link = LinkKey("cpu:0", "cpu:1", "host", "0.27")
    path = str(tmp_path_factory.mktemp("cache") / "c.sqlite")
    with ProfileCache(path) as cache:
        cache.put_many({key: Measurement(1e-3, 1e-5, 5, "measured")})
        cache.put_link(link, LinkMeasurement(1e-5, 1e10, 0.01))
    with sqlite3.connect(path) as db:
        try:
            db.execute(f"UPDATE {table_name} SET {name} = ?", (value,))
        except sqlite3.IntegrityError:  # NOT NULL: SQLite itself keeps the row whole
            return
    with ProfileCache(path) as cache:
        served = cache.get_many([key]).get(key)
        served_link = cache.get_link(link)
        if served is not None:
            assert math.isfinite(served.median_s) and served.median_s > 0 and served.repeats >= 1
        if served_link is not None:
            assert served_link.bandwidth_Bps > 0 and math.isfinite(served_link.bandwidth_Bps)
            assert served_link.latency_s >= 0 and math.isfinite(served_link.latency_s)
        cache.put_many({key: Measurement(2e-3, 1e-5, 5, "measured")})
        assert cache.get_many([key])[key].median_s == 2e-3


# ---------------------------------------------------------------------- value fuzz
# Numbers the validators accept must plan, from 1e-300 to 1e300 and with units off by 1e9 either way
# (GB/s written as B/s): a cost table's 1e5 s to disable a device overflowed CP-SAT's integers, links
# of 12 B/s too, a peak of 1e-300 FLOP/s made inf seconds, costs of 1e-20 s a HiGHS error.
VALUE_FUZZ = settings(
    max_examples=examples(30), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
OBJECTIVES = st.sampled_from(["latency", "throughput", "pipeline"])
DEVICE_FIGURES = ["peak_flops", "bandwidth_Bps", "efficiency", "memory_bytes", "launch_overhead_s"]
LINK_FIGURES = ["latency_s", "bandwidth_Bps"]


def magnitudes(old: float):
    """A value log-uniform from 1e-300 to 1e300, or ``old`` with its unit off by 1e9 either way."""
    anywhere = st.floats(-300.0, 300.0).map(lambda exponent: 10.0**exponent)
    return st.one_of(anywhere, st.sampled_from([1e9, 1e-9]).map(lambda slip: old * slip))


def with_values(data, entries: list[dict], field: str) -> None:
    """One entry's ``field``, or every entry's (a unit slipped throughout a file), set to a drawn magnitude."""
    chosen = entries if data.draw(st.booleans()) else [data.draw(st.sampled_from(entries))]
    value = data.draw(magnitudes(chosen[0][field]))
    for entry in chosen:
        entry[field] = value


@VALUE_FUZZ
@given(st.data(), OBJECTIVES)
def test_platform_figures_of_any_magnitude_are_planned_or_refused_in_one_line(data, objective):
    platform = copy.deepcopy(SMALL_PLATFORM)
    if data.draw(st.booleans()):
        with_values(data, platform["devices"], data.draw(st.sampled_from(DEVICE_FIGURES)))
    else:
        with_values(data, platform["links"], data.draw(st.sampled_from(LINK_FIGURES)))
    solved_or_refused(SMALL_GRAPH, platform, objective=objective, finite=True)


@VALUE_FUZZ
@given(st.data(), OBJECTIVES)
def test_cost_table_seconds_of_any_magnitude_are_planned_or_refused_in_one_line(data, objective):
    graph, platform = OpGraph.from_json(SMALL_GRAPH), Platform.from_json(SMALL_PLATFORM)
    from tvm_diviml.cost.roofline import RooflineCostModel

    roofline = RooflineCostModel(graph, platform)
    cells = [
        {"kernel": k, "device": d, "s": roofline.compute_s(k, d)} for k in graph.kernels for d in platform.device_names
    ]
    with_values(data, cells, "s")
    rows = {k: {} for k in graph.kernels}
    for cell in cells:
        rows[cell["kernel"]][cell["device"]] = cell["s"]
    solved_or_refused(SMALL_GRAPH, SMALL_PLATFORM, {"kernels": rows}, objective=objective, finite=True)


@pytest.mark.parametrize(
    "path, value, message",
    [
        (("links", 0, "bandwidth_Bps"), 12.0, "12 B/s is below any real link"),
        (("default_link",), {"latency_s": 1e-5, "bandwidth_Bps": 12.0}, "12 B/s is below any real link"),
        (("devices", 1, "peak_flops"), 1e-300, "1e-300 FLOP/s is below any real device"),
        (("devices", 1, "bandwidth_Bps"), 616.0, "616 B/s is below any real memory"),
        (("devices", 1, "efficiency"), 1e-300, "below any real build's efficiency"),
    ],
)
def test_figures_in_the_wrong_unit_are_refused_in_one_line_naming_the_unit(path, value, message):
    """bandwidth_Bps written in GB/s (12.0) planned to a traceback: "Invoked with: 0, 29052847970573287428"."""
    with pytest.raises(DivimlInputError, match=message) as refused:
        Platform.from_json(platform_with(path, value))
    assert "\n" not in str(refused.value) and path[-1] in refused.value.field
    assert "per second" in str(refused.value) or "fraction" in str(refused.value)


@pytest.mark.parametrize("objective", ["latency", "throughput", "pipeline"])
@pytest.mark.parametrize("seconds", [{"cpu1": 1e5}, {"cpu0": 1e-20, "cpu1": 1e-20}])
def test_a_cost_table_that_disables_a_device_or_prices_everything_tiny_plans(objective, seconds):
    """1e5 s for a device (to disable it) overflowed CP-SAT's ticks; every cost at 1e-20 s was a HiGHS error."""
    graph = random_dag(kernels=6, seed=1)
    platform = get_platform("cpu2")
    rows = {k: {"cpu0": 1e-3, "cpu1": 2e-3, **seconds} for k in graph.kernels}
    problem = Problem(graph, platform, TableCostModel.from_json({"kernels": rows}, platform), objective=objective)
    problem.stages = 2 if objective == "pipeline" else None
    plan, sim, row = solve_and_report(problem, SOLVER, "table", "table", time_limit_s=5)
    assert math.isfinite(row["value_s"]) and row["value_s"] == simulate(problem, plan).value_s
    if "cpu1" in seconds and len(seconds) == 1:
        assert set(plan.assignment.values()) == {"cpu0"}
