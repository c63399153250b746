"""The platform file format: ``platform.schema.json`` is a valid JSON Schema that every preset, a
servers platform, a detected platform and the examples of docs/platform.md meet; whatever the
schema refuses, the loader refuses too (with the field named); a device's peaks have no default."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_diviml import detect
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.machine import host_copy, host_cpu
from tvm_diviml.platform import Platform
from tvm_diviml.presets import get_platform

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "tvm_diviml" / "platform.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
DOC_BLOCKS = re.findall(r"```json\n(.*?)\n```", (ROOT / "docs" / "platform.md").read_text(), re.DOTALL)

FAKE_A100 = detect.GpuRecord(
    "cuda",
    0,
    "NVIDIA A100 80GB PCIe",
    "8.0",
    85e9,
    108,
    1.41e9,
    detect.LinkFigures(1e-5, 2.4e10),
    detect.LinkFigures(1.2e-5, 2.2e10),
)


def schema_errors(data) -> list[str]:
    return [error.message for error in VALIDATOR.iter_errors(data)]


def test_the_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$defs"]["device"]["required"] == ["name", "target", "device", "peak_flops", "bandwidth_Bps"]


@pytest.mark.parametrize(
    "spec", ["cpu1", "cpu2", "paper-node", "h200-node", "gpu4", "gpu1000", "servers:2xpaper-node+h200-node"]
)
def test_every_preset_meets_the_schema_and_reads_back_as_itself(spec):
    data = json.loads(json.dumps(get_platform(spec).to_json()))
    assert schema_errors(data) == []
    assert Platform.from_json(data).to_json() == data


def test_a_detected_platform_with_a_gpu_meets_the_schema_and_reads_back():
    data = json.loads(json.dumps(detect.local_platform("local:cores=2", gpus=[FAKE_A100]).to_json()))
    assert schema_errors(data) == []
    again = Platform.from_json(data)
    assert again.to_json() == data and again.device("a100").peak_flops == 19.5e12
    assert set(again.estimates) == {"cpu0", "cpu1"}  # the A100's figures are its datasheet's


def test_the_docs_examples_meet_the_schema_and_load():
    assert len(DOC_BLOCKS) == 2, "docs/platform.md: the CPU + A100 + L4 example and the servers example"
    example, servers = (json.loads(block) for block in DOC_BLOCKS)
    assert schema_errors(example) == [] and schema_errors(servers) == []
    machine = Platform.from_json(example)
    assert machine.device_names == ["cpu", "a100", "l4"] and machine.host == "cpu"
    assert machine.device("a100").peak_flops == 19.5e12 and machine.device("a100").target["arch"] == "sm_80"
    l4 = machine.device("l4")
    assert (l4.peak_flops, l4.bandwidth_Bps) == (30.3e12, 300e9)
    assert machine.device("cpu").peak_flops == pytest.approx(host_cpu().core_flops * 24)
    assert set(machine.estimates) == {"cpu", "l4"} and "datasheet of NVIDIA L4" in machine.estimates["l4"]["peak_flops"]
    assert machine.transfer_s(24e9, "a100", "cpu") == pytest.approx(1 + 10e-6)
    assert machine.transfer_s(12e9, "a100", "l4") == pytest.approx(1 + 20e-6)  # default_link
    joined = Platform.from_json(servers)
    assert len(joined.servers) == 3 and joined.device_names[0] == "s0.cpu"
    assert schema_errors(json.loads(json.dumps(joined.to_json()))) == []


def device_file(**device) -> dict:
    """A one-CPU platform file whose device has ``device``'s keys (None: the key left out)."""
    base = {
        "name": "cpu",
        "target": {"kind": "llvm"},
        "device": "cpu:0",
        "peak_flops": 1e11,
        "bandwidth_Bps": 2e10,
    }
    merged = {**base, **device}
    return {"devices": [{k: v for k, v in merged.items() if v is not None}]}


def two_devices(**change) -> dict:
    data = {
        "devices": [
            device_file()["devices"][0],
            {**device_file()["devices"][0], "name": "gpu", "target": {"kind": "cuda"}, "device": "cuda:0"},
        ],
        "default_link": {"latency_s": 1e-5, "bandwidth_Bps": 1e10},
    }
    data.update(change)
    return data


SERVERS = {"servers": [{"kind": "cpu1", "count": 2}]}

INVALID = {
    "unknown top-level key": ({**device_file(), "defaultlink": {}}, "field 'defaultlink'"),
    "unknown device key": (device_file(memory_gb=16), "unknown keys ['memory_gb']"),
    "target string with options": (device_file(target="llvm -mcpu=znver3"), "has options"),
    "target dict without kind": (device_file(target={"mcpu": "znver3"}), "devices[cpu].target"),
    "device without index": (device_file(device="cuda"), "devices[cpu].device"),
    "missing peak_flops": (device_file(peak_flops=None), "missing 'peak_flops'"),
    "missing bandwidth_Bps": (device_file(bandwidth_Bps=None), "missing 'bandwidth_Bps'"),
    "estimate misspelt": (device_file(peak_flops="Estimate"), 'must be a number or "estimate"'),
    "estimate for memory": (device_file(memory_bytes="estimate"), '"estimate" stands only for'),
    "peak in TFLOP/s": (device_file(peak_flops=12), "below any real device"),
    "efficiency above 1": (device_file(efficiency=1.5), "devices[cpu].efficiency"),
    "efficiency 0": (device_file(efficiency=0), "devices[cpu].efficiency"),
    "memory 0": (device_file(memory_bytes=0), "devices[cpu].memory_bytes"),
    "memory as text": (device_file(memory_bytes="16 GiB"), "devices[cpu].memory_bytes"),
    "negative launch overhead": (device_file(launch_overhead_s=-1e-6), "devices[cpu].launch_overhead_s"),
    "threads 0": (device_file(num_threads=0), "devices[cpu].num_threads"),
    "threads fractional": (device_file(num_threads=1.5), "devices[cpu].num_threads"),
    "threads true": (device_file(num_threads=True), "devices[cpu].num_threads"),
    "measure as text": (device_file(measure="no"), "devices[cpu].measure"),
    "part a number": (device_file(part=4), "devices[cpu].part"),
    "empty name": (device_file(name=""), "device name"),
    "no devices": ({"devices": []}, "at least one device"),
    "another format": ({**device_file(), "format": "diviml.platform/2"}, "field 'format'"),
    "name a number": ({**device_file(), "name": 5}, "field 'name'"),
    "unknown transfer model": ({**device_file(), "transfer_model": "staged"}, "field 'transfer_model'"),
    "default_link without bandwidth": (two_devices(default_link={"latency_s": 1e-5}), "default_link.bandwidth_Bps"),
    "default_link with an extra key": (
        two_devices(default_link={"latency_s": 0, "bandwidth_Bps": None, "src": "cpu"}),
        "field 'default_link'",
    ),
    "link without latency": (
        two_devices(links=[{"src": "cpu", "dst": "gpu", "bandwidth_Bps": 1e10}]),
        "links[0].latency_s",
    ),
    "link with an unknown key": (
        two_devices(links=[{"src": "cpu", "dst": "gpu", "latency_s": 0, "bandwidth_Bps": 1e10, "gbps": 80}]),
        "field 'links[0]'",
    ),
    "link bidirectional as text": (
        two_devices(links=[{"src": "cpu", "dst": "gpu", "latency_s": 0, "bandwidth_Bps": None, "bidirectional": "y"}]),
        "links[0].bidirectional",
    ),
    "link bandwidth 0": (
        two_devices(links=[{"src": "cpu", "dst": "gpu", "latency_s": 0, "bandwidth_Bps": 0}]),
        "links[0].bandwidth_Bps",
    ),
    "estimate note for memory": (
        {**device_file(), "attrs": {"estimates": {"cpu": {"memory_bytes": "guessed"}}}},
        "attrs.estimates",
    ),
    "network without latency": ({**device_file(), "attrs": {"network": {"bandwidth_Bps": 1e10}}}, "attrs.network"),
    "server entry with an extra key": (
        {**device_file(), "attrs": {"servers": {"s0": {"kind": "k", "devices": ["cpu"], "host": "cpu", "x": 1}}}},
        "attrs.servers",
    ),
    "servers: count 0": ({"servers": [{"kind": "cpu1", "count": 0}]}, "servers[0].count"),
    "servers: unknown key": ({**SERVERS, "networks": {}}, "field 'networks'"),
    "servers: empty kind": ({"servers": [{"kind": ""}]}, "servers[0].kind"),
    "servers: a server id as a number": (
        {**SERVERS, "network_links": [{"src_server": 0, "dst_server": "s1"}]},
        "network_links[0]",
    ),
    "servers: slow network": ({**SERVERS, "network": {"bandwidth_Bps": 12}}, "network.bandwidth_Bps"),
    "servers and devices at once": ({**SERVERS, **device_file()}, "field 'devices'"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_an_invalid_file_is_refused_by_the_schema_and_by_the_loader_naming_the_field(case):
    data, fragment = INVALID[case]
    assert schema_errors(data), f"the schema accepts {case}"
    with pytest.raises(DivimlInputError) as refused:
        Platform.from_json(copy.deepcopy(data))
    assert fragment in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_missing_peak_says_how_to_fix_it():
    with pytest.raises(DivimlInputError) as refused:
        Platform.from_json(device_file(peak_flops=None, bandwidth_Bps=None))
    message = str(refused.value)
    assert "missing 'peak_flops' and 'bandwidth_Bps'" in message and refused.value.field == "devices[cpu].peak_flops"
    assert '"estimate"' in refused.value.hint and "datasheet" in refused.value.hint


def test_a_pair_without_a_link_meets_the_schema_but_not_the_loader():
    """What a schema cannot say (every ordered pair has a link) the loader still refuses."""
    data = two_devices(default_link=None, links=[{"src": "cpu", "dst": "gpu", "latency_s": 0, "bandwidth_Bps": 1e10}])
    assert schema_errors(data) == []
    with pytest.raises(DivimlInputError, match="no link from 'gpu' to 'cpu'"):
        Platform.from_json(data)


# Values a person or a slip puts into a file; keys a file may hold, and one it may not.
ODD_VALUES = st.sampled_from(
    [None, True, 0, -1, 1, 12, 1e3, 2.5, 1e30, "", "x", "estimate", "cpu:0", "llvm -mcpu=x", [], {}, {"kind": "llvm"}]
)


def json_paths(data, prefix=()):
    """Every (container, key) path of a JSON document."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else []
    for key, value in items:
        yield (*prefix, key)
        yield from json_paths(value, (*prefix, key))


PAPER_NODE = json.loads(json.dumps(get_platform("paper-node").to_json()))
SERVERS_EXAMPLE = json.loads(DOC_BLOCKS[1]) if len(DOC_BLOCKS) > 1 else SERVERS
EXAMPLES = [PAPER_NODE, json.loads(DOC_BLOCKS[0]), SERVERS_EXAMPLE]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_whatever_the_schema_refuses_the_loader_refuses(data):
    host_copy()  # timed once, before the examples
    document = copy.deepcopy(data.draw(st.sampled_from(EXAMPLES)))
    path = data.draw(st.sampled_from(list(json_paths(document))))
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    action = data.draw(st.sampled_from(["set", "delete", "add"]))
    if action == "set":
        parent[path[-1]] = data.draw(ODD_VALUES)
    elif action == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent["colour"] = "red"
    if schema_errors(document):
        with pytest.raises(DivimlInputError):
            Platform.from_json(document)
