"""Multi-server platforms (``servers:4xpaper-node``, JSON): devices, links, helpers, errors, simulation."""

import ast
import json
import pathlib

import pytest

from tvm_diviml import servers as servers_module
from tvm_diviml.cost.roofline import RooflineCostModel
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.platform import Network, Platform, Server
from tvm_diviml.presets import get_platform
from tvm_diviml.problem import Problem
from tvm_diviml.servers import identical_servers, server_of, server_platform
from tvm_diviml.simulator import simulate
from tvm_diviml.synthetic import random_dag

from ..helpers import diviml

GBPS_100 = 100e9 / 8  # the default network: 100 Gb/s in bytes/s (and 10 µs per message)


def renamed(server, device):
    return f"{server}.{device}"


def test_n_servers_of_one_kind_are_renamed_copies_of_the_preset():
    preset = get_platform("paper-node")
    platform = get_platform("servers:4xpaper-node")
    assert len(platform.devices) == 4 * len(preset.devices)
    assert platform.device_names == [renamed(f"s{i}", d) for i in range(4) for d in preset.device_names]
    for i in range(4):
        for original in preset.devices:
            copy = platform.device(renamed(f"s{i}", original.name))
            assert copy.device == original.device  # TVM device strings repeat, one set per server
            assert (copy.peak_flops, copy.efficiency, copy.measure) == (
                original.peak_flops,
                original.efficiency,
                original.measure,
            )
    assert platform.host == "s0.cpu"
    assert platform.attrs["servers"]["s2"] == {
        "kind": "paper-node",
        "host": "s2.cpu",
        "devices": ["s2.cpu", "s2.rtx2080ti", "s2.gtx1080ti"],
    }
    assert server_of(platform)["s3.gtx1080ti"] == "s3"
    assert set(server_of(platform).values()) == {"s0", "s1", "s2", "s3"}
    assert identical_servers(platform) == [["s0", "s1", "s2", "s3"]]


def test_links_inside_a_server_are_the_presets_and_between_servers_the_network():
    preset = get_platform("paper-node")
    platform = get_platform("servers:3xpaper-node")
    for i in range(3):
        for (src, dst), link in preset.links.items():
            copy = platform.link(renamed(f"s{i}", src), renamed(f"s{i}", dst))
            assert (copy.latency_s, copy.bandwidth_Bps) == (link.latency_s, link.bandwidth_Bps)
    owner = server_of(platform)
    crossing = [link for (a, b), link in platform.links.items() if owner[a] != owner[b]]
    assert len(crossing) == 9 * 8 - 3 * 3 * 2  # all ordered pairs less those inside a server
    # host to host: the network alone (10 µs, 12.5 GB/s); a GPU adds its PCIe hop (10 µs, 12 GB/s binds)
    assert {(round(l.latency_s * 1e6, 9), l.bandwidth_Bps) for l in crossing} == {
        (10, GBPS_100),
        (20, 12e9),
        (30, 12e9),
    }
    assert platform.transfer_s(1e6, "s0.cpu", "s2.cpu") == pytest.approx(10e-6 + 1e6 / 12.5e9)
    assert platform.transfer_s(1e6, "s0.rtx2080ti", "s2.gtx1080ti") == pytest.approx(30e-6 + 1e6 / 12e9)
    assert platform.transfer_s(1e6, "s1.rtx2080ti", "s1.gtx1080ti") == pytest.approx(10e-6 + 1e6 / 12e9)


def test_network_options_in_the_spec():
    platform = get_platform("servers:2xpaper-node,network_gbps=25,network_latency_us=50")
    # 25 Gb/s = 3.125e9 B/s: 1 MB takes 50 µs + 320 µs
    assert platform.transfer_s(1e6, "s0.cpu", "s1.cpu") == pytest.approx(370e-6)
    assert platform.attrs["network"] == {"bandwidth_Bps": pytest.approx(3.125e9), "latency_s": pytest.approx(50e-6)}
    no_latency = get_platform("servers:2xpaper-node,network_latency_us=0")
    assert no_latency.transfer_s(1.2e9, "s1.cpu", "s0.rtx2080ti") == pytest.approx(10e-6 + 0.1)  # PCIe binds


def test_groups_of_two_kinds():
    platform = get_platform("servers:2xpaper-node+2xh200-node")
    assert len(platform.devices) == 2 * 3 + 2 * 2
    assert [platform.attrs["servers"][s]["kind"] for s in ("s0", "s1", "s2", "s3")] == [
        "paper-node",
        "paper-node",
        "h200-node",
        "h200-node",
    ]
    assert platform.device("s3.h200").device == "cuda:0" and platform.host == "s0.cpu"
    assert identical_servers(platform) == [["s0", "s1"], ["s2", "s3"]]
    h200 = platform.link("s2.cpu", "s2.h200")
    assert (h200.latency_s, h200.bandwidth_Bps) == (8e-6, 50e9)
    # PCIe 3.0 hop (10 µs, 12 GB/s) + network (10 µs) + PCIe Gen5 hop (8 µs, 50 GB/s)
    assert platform.transfer_s(2.4e9, "s1.gtx1080ti", "s2.h200") == pytest.approx(28e-6 + 0.2)
    same_again = get_platform("servers:1xpaper-node+paper-node")  # a kind repeated across groups is one kind
    assert identical_servers(same_again) == [["s0", "s1"]]


def test_json_servers_with_a_pair_override_and_an_inline_kind(tmp_path):
    tiny = {
        "name": "tiny",
        "devices": [
            {"name": "c", "target": {"kind": "llvm"}, "device": "cpu:0", "peak_flops": 1e12, "bandwidth_Bps": 1e11},
            {"name": "g", "target": {"kind": "cuda"}, "device": "cuda:0", "peak_flops": 1e13, "bandwidth_Bps": 1e12},
        ],
        "default_link": {"latency_s": 1e-6, "bandwidth_Bps": 1e10},
    }
    data = {
        "name": "lab",
        "servers": [{"kind": "paper-node", "count": 2}, {"kind": tiny}],
        "network": {"bandwidth_Bps": 5e9, "latency_s": 2e-5},
        "network_links": [{"src_server": "s2", "dst_server": "s0", "bandwidth_Bps": 1e9}],
    }
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(data))
    platform = get_platform(str(path))
    assert platform.name == "lab" and platform.device_names[-2:] == ["s2.c", "s2.g"]
    assert identical_servers(platform) == [["s0", "s1"], ["s2"]]
    # the pair s0-s2 both ways: its own bandwidth (1 GB/s binds), the network's latency plus the hops
    assert platform.transfer_s(1e6, "s0.cpu", "s2.g") == pytest.approx(2e-5 + 1e-6 + 1e-3)
    assert platform.transfer_s(1e6, "s2.c", "s0.rtx2080ti") == pytest.approx(2e-5 + 1e-5 + 1e-3)
    assert platform.transfer_s(1e6, "s1.cpu", "s2.g") == pytest.approx(2e-5 + 1e-6 + 2e-4)
    assert platform.transfer_s(1e6, "s0.cpu", "s1.cpu") == pytest.approx(2e-5 + 2e-4)
    assert platform.transfer_s(1e6, "s2.c", "s2.g") == pytest.approx(1e-6 + 1e-4)


def test_spec_and_json_build_the_same_platform():
    spec = get_platform("servers:2xpaper-node+1xh200-node,network_gbps=40")
    from_file = Platform.from_json(
        {"servers": [{"kind": "paper-node", "count": 2}, {"kind": "h200-node"}], "network": {"bandwidth_Bps": 40e9 / 8}}
    )
    assert from_file.devices == spec.devices and from_file.links == spec.links
    assert from_file.attrs == spec.attrs and from_file.host == spec.host


def test_json_round_trip_keeps_the_servers():
    platform = get_platform("servers:2xpaper-node+1xh200-node")
    again = Platform.from_json(json.loads(json.dumps(platform.to_json())))
    assert again == platform
    assert server_of(again) == server_of(platform) and identical_servers(again) == [["s0", "s1"], ["s2"]]
    assert "attrs" not in get_platform("paper-node").to_json()  # one-machine files are as before


def test_one_server_alone_and_a_plain_platform_as_one_server():
    platform = get_platform("servers:1xh200-node+2xpaper-node")
    preset = get_platform("paper-node")
    alone = server_platform(platform, "s2")
    assert alone.device_names == [renamed("s2", d) for d in preset.device_names] and alone.host == "s2.cpu"
    assert {(a, b): (l.latency_s, l.bandwidth_Bps) for (a, b), l in alone.links.items()} == {
        (renamed("s2", a), renamed("s2", b)): (l.latency_s, l.bandwidth_Bps) for (a, b), l in preset.links.items()
    }
    assert server_of(preset) == {d: "s0" for d in preset.device_names}
    assert identical_servers(preset) == [["s0"]]
    with pytest.raises(DivimlInputError, match="unknown server 's7'"):
        server_platform(platform, "s7")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("servers:4xnope", "unknown server kind 'nope'"),
        ("servers:0xpaper-node", "at least one server"),
        ("servers:", "not COUNTxKIND"),
        ("servers:2xservers:1xcpu2", "itself several servers"),
        ("servers:65xcpu2", "between 1 and 64"),
        ("servers:2xpaper-node,network_gbps=0", "finite number > 0"),
        ("servers:2xpaper-node,network_gbps=fast", "finite number > 0"),
        ("servers:2xpaper-node,network_gbps=inf", "finite number > 0"),
        ("servers:2xpaper-node,network_latency_us=-1", "finite number >= 0"),
        ("servers:2xpaper-node,network_speed=3", "unknown option 'network_speed=3'"),
    ],
)
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(DivimlInputError, match=message) as caught:
        get_platform(spec)
    assert caught.value.field == "platform" or caught.value.field.startswith("platform option")


@pytest.mark.parametrize(
    "mutate, field, message",
    [
        (lambda d: d.update(servers=[]), "servers", "non-empty list"),
        (lambda d: d["servers"][0].update(count=0), "servers[0].count", "integer >= 1"),
        (lambda d: d["servers"][0].update(count="2"), "servers[0].count", "integer >= 1"),
        (lambda d: d["servers"][0].update(count=True), "servers[0].count", "integer >= 1"),
        (lambda d: d["servers"][0].update(kind="nope"), "servers[0].kind", "unknown server kind 'nope'"),
        (lambda d: d["servers"][0].update(kind=5), "servers[0].kind", "preset name or a platform object"),
        (lambda d: d["servers"][0].update(kind={"servers": []}), "servers[0].kind", "itself several servers"),
        (lambda d: d["servers"][0].update(kind={"devices": []}), "servers[0].kind.devices", "at least one device"),
        (lambda d: d["servers"][0].update(colour="red"), "servers[0]", "a server group is"),
        (lambda d: d["network"].update(bandwidth_Bps="fast"), "network.bandwidth_Bps", "finite number > 0"),
        (lambda d: d["network"].update(latency_s=-1), "network.latency_s", "finite number >= 0"),
        (lambda d: d["network"].update(gbps=100), "network", "a network is"),
        (lambda d: d["network_links"][0].update(dst_server="s9"), "network_links", "unknown server 's9'"),
        (lambda d: d["network_links"][0].update(dst_server="s0"), "network_links[0]", "to itself"),
        (lambda d: d["network_links"][0].pop("dst_server"), "network_links[0]", "needs 'src_server' and"),
        (lambda d: d["network_links"][0].update(latency_s=float("nan")), "network_links[0].latency_s", "finite"),
        (
            lambda d: d["network_links"].append({"src_server": "s1", "dst_server": "s0"}),
            "network_links[1]",
            "given twice",
        ),
        (lambda d: d.update(network_links={}), "network_links", "list of server pairs"),
        (lambda d: d.update(devices=[]), "devices", "unknown keys"),
        (
            lambda d: d["servers"].append({"kind": {**get_platform("cpu2").to_json(), "name": "paper-node"}}),
            "servers",
            "both named 'paper-node'",
        ),
        (
            lambda d: d["servers"].append(
                {"kind": {**get_platform("cpu2").to_json(), "transfer_model": "host_staged"}}
            ),
            "servers",
            "mix transfer models",
        ),
    ],
)
def test_bad_servers_json_names_the_field(mutate, field, message):
    data = {
        "servers": [{"kind": "paper-node", "count": 2}],
        "network": {"bandwidth_Bps": 1e9, "latency_s": 0},
        "network_links": [{"src_server": "s0", "dst_server": "s1", "latency_s": 1e-6}],
    }
    mutate(data)
    with pytest.raises(DivimlInputError, match=message) as caught:
        Platform.from_json(data)
    assert caught.value.field == field


def test_servers_that_disagree_with_the_devices_are_rejected():
    data = get_platform("servers:2xcpu2").to_json()
    data["attrs"]["servers"]["s1"]["devices"].pop()
    with pytest.raises(DivimlInputError, match="servers and devices disagree") as caught:
        server_of(Platform.from_json(data))
    assert caught.value.field == "attrs.servers"
    data = get_platform("servers:2xcpu2").to_json()
    data["attrs"]["servers"]["s1"]["devices"].append("s0.cpu0")
    with pytest.raises(DivimlInputError, match="disagree \\(e.g. 's0.cpu0'\\)"):
        server_of(Platform.from_json(data))
    with pytest.raises(DivimlInputError, match="must be an object"):
        Platform.from_json({**get_platform("cpu2").to_json(), "attrs": []})


def test_cli_lists_and_prints_server_platforms():
    listing = diviml("platforms")
    assert listing.returncode == 0 and "servers:" in listing.stdout and "paper-node" in listing.stdout
    printed = diviml("platforms", "--json", "servers:2xpaper-node")
    assert printed.returncode == 0, printed.stderr
    assert server_of(Platform.from_json(json.loads(printed.stdout)))["s1.cpu"] == "s1"
    bad = diviml("platforms", "--json", "servers:2xnope")
    assert bad.returncode == 2 and "unknown server kind 'nope'" in bad.stderr


def _roofline_s(kernel: Kernel, device) -> float:
    return (
        max(
            kernel.flops / (device.peak_flops * device.efficiency),
            kernel.bytes_moved / (device.bandwidth_Bps * device.efficiency),
        )
        + device.launch_overhead_s
    )


def test_simulator_charges_the_network_between_servers_by_hand():
    """Input on s0's CPU -> a on s0's RTX (PCIe) -> b on s1's RTX (network) -> output to s0's CPU (network)."""
    platform = get_platform("servers:2xpaper-node")
    a = Kernel("a", flops=4e9, bytes_moved=2e6, output_bytes=3e6)
    b = Kernel("b", flops=2e9, bytes_moved=1e6, output_bytes=5e5)
    graph = OpGraph([a, b], [Edge("a", "b", 3e6)], inputs=[GraphInput("x", 1e6, ("a",))])
    plan = Plan({"a": "s0.rtx2080ti", "b": "s1.rtx2080ti"})
    sim = simulate(Problem(graph, platform, RooflineCostModel(graph, platform)), plan)
    rtx = platform.device("s0.rtx2080ti")
    # PCIe in; a; PCIe + network + PCIe to b; b; PCIe + network back to the host (PCIe's 12 GB/s binds)
    expected = (
        (10e-6 + 1e6 / 12e9) + _roofline_s(a, rtx) + (30e-6 + 3e6 / 12e9) + _roofline_s(b, rtx) + (20e-6 + 5e5 / 12e9)
    )
    assert sim.value_s == pytest.approx(expected)
    one_server = simulate(
        Problem(graph, platform, RooflineCostModel(graph, platform)), Plan({"a": "s0.rtx2080ti", "b": "s0.gtx1080ti"})
    )
    assert sim.value_s - one_server.value_s == pytest.approx(
        (30e-6 - 10e-6) + (20e-6 - 10e-6) + _roofline_s(b, rtx) - _roofline_s(b, platform.device("s0.gtx1080ti"))
    )


def test_simulator_prices_every_crossing_of_a_random_graph_with_the_network():
    platform = get_platform("servers:2xpaper-node,network_gbps=10,network_latency_us=30")
    graph = random_dag(14, seed=5)
    costs = RooflineCostModel(graph, platform)
    half = graph.topo_order[: len(graph) // 2]
    plan = Plan({k: "s0.rtx2080ti" if k in half else "s1.gtx1080ti" for k in graph.kernels})
    sim = simulate(Problem(graph, platform, costs), plan)
    owner = server_of(platform)
    crossings = [t for t in sim.transfers if owner[t.src] != owner[t.dst]]
    assert any(t.dst != platform.host for t in crossings), "the split must send tensors between the GPUs"
    for transfer in crossings:  # 10 Gb/s = 1.25 GB/s binds; PCIe hops add 10 µs each
        if transfer.dst == platform.host:
            sent, latency = graph.kernels[transfer.tensor].output_bytes, 40e-6
        else:
            sent = max(e.bytes for e in graph.succ[transfer.tensor] if plan.assignment[e.dst] == transfer.dst)
            latency = 50e-6
        assert transfer.end_s - transfer.start_s == pytest.approx(latency + sent / 1.25e9)
    # same kernels on one server's two GPUs (identical hardware to s1's): only the links differ
    local = Plan({k: "s0.rtx2080ti" if k in half else "s0.gtx1080ti" for k in graph.kernels})
    local_sim = simulate(Problem(graph, platform, costs), local)
    assert {k: costs.compute_s(k, d) for k, d in plan.assignment.items()} == {
        k: costs.compute_s(k, local.assignment[k]) for k in graph.kernels
    }
    assert local_sim.value_s < sim.value_s  # PCIe 12 GB/s, 10 µs beats 1.25 GB/s, 30 µs


def test_servers_and_network_are_typed_fields_written_as_before():
    platform = get_platform("servers:2xcpu1,network_latency_us=40")
    assert platform.servers["s1"] == Server("cpu1", ("s1.cpu",), "s1.cpu")
    assert platform.network == Network(latency_s=40 * 1e-6)
    assert platform.to_json()["attrs"] == {
        "servers": {s: {"kind": "cpu1", "devices": [f"{s}.cpu"], "host": f"{s}.cpu"} for s in ("s0", "s1")},
        "network": {"bandwidth_Bps": GBPS_100, "latency_s": 40 * 1e-6},
    }
    plain = get_platform("cpu2")
    assert plain.servers == {} and plain.network is None
    with pytest.raises(DivimlInputError, match="bandwidth_Bps") as caught:
        Platform.from_json({**plain.to_json(), "attrs": {"network": {"latency_s": 0}}})
    assert caught.value.field == "attrs.network"


def test_servers_module_builds_on_the_platform_types_alone():
    """presets.py resolves kinds for servers.py, so servers.py needs no preset (no import cycle): it
    reads the platform types, errors and the limits on figures read from files."""
    tree = ast.parse(pathlib.Path(servers_module.__file__).read_text())
    library = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level}
    assert library == {"errors", "jsonio", "platform"}
