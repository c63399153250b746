"""A plan across several servers, run over real TVM RPC sessions on the loopback.

Without servers: addresses are parsed with clear errors, and cross-server links are priced as two
hops through the driver (hand-computed). With servers (three started once for the module): builds
per server give the single-device reference's outputs on 2 and 3 servers, for one input and a stream;
the tensors that cross servers are exactly those the segment graph says, two hops each; a refused
connection, a killed server and a hung one each raise an error that names the server, its address
and the segment, within the timeout.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph
from tvm_diviml.plan import Plan
from tvm_diviml.platform import Link
from tvm_diviml.presets import get_platform
from tvm_diviml.profiling.rpc_hops import (
    DriverHop,
    driver_hop_platform,
    driver_io_s,
    measure_driver_hops,
    network_hop,
    with_driver_io,
)
from tvm_diviml.runtime.rpc import RpcRunner, ServerError, ServerTimeoutError
from tvm_diviml.runtime.rpc_servers import connect_servers, parse_addresses, start_local_servers

from ..helpers import HANG_GUARD_S, Lines, wait_until

TWIN = ("twin_branch", {"depth": 2, "hidden": 32, "batch": 2})
TINY_LLAMA = (
    "llama",
    {"layers": 2, "hidden": 32, "heads": 2, "kv_heads": 1, "intermediate": 64, "vocab": 100, "seq": 8},
)


# ---------------------------------------------------------------------- without servers
def test_addresses_parse_in_order():
    assert parse_addresses("10.0.0.1:9090, host-b:9091", 2) == [("10.0.0.1", 9090), ("host-b", 9091)]
    assert parse_addresses("[::1]:9090", 1) == [("::1", 9090)]


@pytest.mark.parametrize(
    "text, servers, words",
    [
        ("127.0.0.1:9090", 2, ["1 address", "2 server", "give 2"]),
        ("a:1,b:2,c:3", 2, ["3 address", "give 2"]),
        ("127.0.0.1:0,127.0.0.1:9091", 2, ["port 0", "between 1 and 65535"]),
        ("127.0.0.1:70000", 1, ["port 70000"]),
        ("127.0.0.1", 1, ["'127.0.0.1' is not HOST:PORT"]),
        ("host:port", 1, ["'host:port' is not HOST:PORT"]),
        ("", 1, ["0 address", "give 1"]),
    ],
)
def test_bad_addresses_say_what_is_wrong(text, servers, words):
    with pytest.raises(DivimlInputError) as caught:
        parse_addresses(text, servers)
    assert caught.value.field == "--rpc"
    for word in words:
        assert word in str(caught.value)


def test_cross_server_links_are_priced_through_the_driver():
    """servers:2xcpu2: inside a server 5 us + b / 10 GB/s (kept); across, every step in series."""
    platform = get_platform("servers:2xcpu2")
    hops = {"s0": DriverHop(1e-3, 100e6, 2e-3, 50e6), "s1": DriverHop(3e-3, 200e6, 4e-3, 25e6)}
    priced = driver_hop_platform(platform, hops)
    assert (
        priced.link("s0.cpu0", "s0.cpu1")
        == platform.link("s0.cpu0", "s0.cpu1")
        == Link("s0.cpu0", "s0.cpu1", 5e-6, 10e9)
    )
    nbytes = 1e6
    # host to host: download from s0 (1 ms + b / 100 MB/s), upload to s1 (4 ms + b / 25 MB/s)
    assert priced.transfer_s(nbytes, "s0.cpu0", "s1.cpu0") == pytest.approx(1e-3 + 0.01 + 4e-3 + 0.04)
    # device to device adds each server's own hop to its host: 5 us + b / 10 GB/s at either end
    assert priced.transfer_s(nbytes, "s1.cpu1", "s0.cpu1") == pytest.approx(
        5e-6 + 1e-4 + 3e-3 + 0.005 + 2e-3 + 0.02 + 5e-6 + 1e-4
    )
    assert priced.attrs["servers"] == platform.attrs["servers"]
    assert priced.attrs["driver_hops"]["s1"]["upload_Bps"] == 25e6


def test_a_workload_over_driver_hops_is_a_new_one_and_leaves_the_given_as_it_was():
    from tvm_diviml.app.rpc_run import over_driver_hops
    from tvm_diviml.app.workload import load_workload

    given = load_workload("random:kernels=6,seed=1", "servers:2xcpu2", "roofline")
    before = given.platform.transfer_s(1e6, "s0.cpu0", "s1.cpu0")
    hops = {"s0": DriverHop(1e-3, 100e6, 2e-3, 50e6), "s1": DriverHop(3e-3, 200e6, 4e-3, 25e6)}
    priced = over_driver_hops(given, hops)
    assert priced.costs.platform is priced.platform is not given.platform and given.costs.platform is given.platform
    assert priced.platform.transfer_s(1e6, "s0.cpu0", "s1.cpu0") == pytest.approx(1e-3 + 0.01 + 4e-3 + 0.04)
    assert given.platform.transfer_s(1e6, "s0.cpu0", "s1.cpu0") == before
    assert priced.costs.transfer_s(1e6, "s0.cpu0", "s1.cpu0") > given.costs.transfer_s(1e6, "s0.cpu0", "s1.cpu0")


def test_default_driver_hop_is_the_network_twice():
    platform = get_platform("servers:2xcpu1,network_gbps=8,network_latency_us=50")  # 1 GB/s, 50 us
    hop = network_hop(platform)
    assert (hop.download_latency_s, hop.download_Bps) == pytest.approx((50e-6, 1e9))
    assert (hop.upload_latency_s, hop.upload_Bps) == pytest.approx((50e-6, 1e9))
    priced = driver_hop_platform(platform)
    assert priced.transfer_s(1e6, "s0.cpu", "s1.cpu") == pytest.approx(2 * (50e-6 + 1e-3))
    assert priced.transfer_s(1e6, "s0.cpu", "s1.cpu") > platform.transfer_s(1e6, "s0.cpu", "s1.cpu")


def test_the_drivers_model_io_is_priced_per_server_and_added_to_the_prediction():
    """The driver uploads each model input to every device that reads it and downloads each output from
    the server that makes it, through that server's session; the simulator sees none of it."""
    platform = get_platform("servers:2xcpu2")
    hops = {"s0": DriverHop(1e-3, 100e6, 2e-3, 50e6), "s1": DriverHop(3e-3, 200e6, 4e-3, 25e6)}
    graph = OpGraph(
        [Kernel("a"), Kernel("b"), Kernel("c", output_bytes=2e6)],
        [Edge("a", "c", 1.0), Edge("b", "c", 1.0)],
        inputs=[GraphInput("x", 1e6, ("a", "b"))],
    )
    plan = Plan({"a": "s0.cpu0", "b": "s1.cpu0", "c": "s1.cpu1"}, objective="throughput", mode="period_overlap")
    io = driver_io_s(graph, plan, platform, hops)
    # x up to s0 (2 ms + 1 MB / 50 MB/s) and to s1 (4 ms + 1 MB / 25 MB/s); c's 2 MB down from s1 (3 ms + 10 ms)
    assert io == pytest.approx({"s0": 2e-3 + 0.02, "s1": 4e-3 + 0.04 + 3e-3 + 0.01})
    busy = {"s0.cpu0": 0.01, "s1.cpu0": 0.005, "s1.cpu1": 0.005}
    assert with_driver_io("latency", 0.03, busy, io, platform) == pytest.approx(0.03 + 0.079)
    # a period: s1's session serves its two devices' calls and its I/O one at a time
    assert with_driver_io("throughput", 0.01, busy, io, platform) == pytest.approx(0.01 + 0.057)
    assert with_driver_io("throughput", 0.5, busy, io, platform) == 0.5


def test_refused_connection_names_the_address_and_how_to_start_a_server():
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    platform = get_platform("servers:2xcpu1")
    with pytest.raises(DivimlInputError) as caught:
        connect_servers(platform, [("127.0.0.1", port), ("127.0.0.1", port)], timeout_s=10)
    message = str(caught.value)
    assert f"server s0 (127.0.0.1:{port})" in message
    assert f"python -m tvm_diviml.runtime.rpc_servers --host 127.0.0.1 --port {port}" in message


# ---------------------------------------------------------------------- with servers
@pytest.fixture(scope="module")
def servers():
    """Three servers to run on, and a fourth (``SPARE``) for the test that kills one: started at once,
    as each takes seconds to import TVM."""
    with start_local_servers(4) as started:
        yield started


SPARE = 3


@pytest.fixture(scope="module")
def models():
    from tvm_diviml.passes import extract
    from tvm_diviml.zoo import build_model

    cache = {}

    def get(spec):
        if spec[0] not in cache:
            model = build_model(*spec)
            cache[spec[0]] = (model, extract(model.mod, model.entry))
        return cache[spec[0]]

    return get


def round_robin(extraction, platform) -> Plan:
    devices = platform.device_names
    return Plan({k: devices[i % len(devices)] for i, k in enumerate(extraction.graph.topo_order)})


def crossings_of(built) -> dict[str, int]:
    """Per server pair, the tensors that the segment graph says cross it (once per reading device)."""
    from tvm_diviml.app.rpc_run import crossing_tensors

    writer = {key: seg["server"] for seg in built.segments for key in seg["writes"]}
    counts: dict[str, int] = {}
    for key, device in crossing_tensors(built.segments):
        pair = f"{writer[key]}->{built.server_of[device]}"
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def test_each_server_builds_only_its_segments(models):
    """servers:2xcpu2: both servers' builds use TVM devices cpu:0 and cpu:1; together they hold every
    segment of the global split once, each with the weights it reads on its own devices."""
    from tvm_diviml.app.rpc_run import build_per_server
    from tvm_diviml.segments import split_segments
    from tvm_diviml.simulator import run_order

    model, extraction = models(TWIN)
    platform = get_platform("servers:2xcpu2")
    plan = round_robin(extraction, platform)
    built = build_per_server(model.mod, plan, platform, extraction=extraction)
    everything = split_segments(extraction.graph, plan.assignment, run_order(extraction.graph, plan))
    assert [seg["name"] for seg in built.segments] == [seg.name for seg in everything]
    for sid, server_build in built.builds.items():
        placement = server_build.placement
        assert placement.devices == [f"{sid}.cpu0", f"{sid}.cpu1"] and placement.tvm_devices == ["cpu:0", "cpu:1"]
        assert all(seg["device"] in placement.devices for seg in placement.segments)
        read = {tuple(w) for seg in placement.segments for w in seg["weights"]}
        assert {tuple(w) for w in placement.weight_params} == read
        assert all(device in placement.devices for _, _, device in placement.weight_params)
        vm = server_build.new_vm()  # this machine has cpu:0 and cpu:1 too
        assert vm.module.implements_function(placement.segments[0]["name"])
        assert not vm.module.implements_function(extraction.entry)  # no whole-model function


def test_two_servers_give_the_reference_outputs_and_count_the_hops(servers, models):
    from tvm_diviml.app.rpc_run import run_plan_rpc

    model, extraction = models(TWIN)
    platform = get_platform("servers:2xcpu1")
    plan = round_robin(extraction, platform)
    run, built = run_plan_rpc(
        model,
        extraction,
        platform,
        plan,
        1e-3,
        servers.addresses[:2],
        repeats=2,
        predicted_busy_s={"s0.cpu": 2e-4, "s1.cpu": 1e-4},
        progress=lambda _: None,
    )
    assert run.max_rel_diff <= 1e-5
    assert set(built.builds) == {"s0", "s1"}
    expected = crossings_of(built)
    assert expected, "a round-robin plan of twin_branch must cross servers"
    assert run.crossings == expected  # per inference, every run alike
    assert run.hops == 2 * sum(expected.values()) and run.hop_s > 0 and run.hop_bytes > 0
    assert set(run.server_busy_s) == {"s0", "s1"} and all(s > 0 for s in run.server_busy_s.values())
    assert run.predicted_server_busy_s == {"s0": 2e-4, "s1": 1e-4}
    assert run.addresses == {f"s{i}": f"127.0.0.1:{port}" for i, (_, port) in enumerate(servers.addresses[:2])}


@pytest.mark.slow
def test_three_servers_run_a_tiny_llama_and_a_stream(servers, models):
    from tvm_diviml.app.rpc_run import run_plan_rpc

    model, extraction = models(TINY_LLAMA)
    platform = get_platform("servers:3xcpu1")
    plan = round_robin(extraction, platform)
    plan.objective = "throughput"
    run, built = run_plan_rpc(
        model,
        extraction,
        platform,
        plan,
        1e-3,
        servers.addresses[:3],
        stream_inputs=6,
        in_flight=3,
        progress=lambda _: None,
    )
    assert run.max_rel_diff <= 1e-4
    assert set(built.builds) == {"s0", "s1", "s2"} and run.in_flight == 3
    assert run.crossings == crossings_of(built) and len(run.crossings) >= 2


def test_two_devices_per_server_stream_in_input_order(servers, models):
    """servers:2xcpu2: copies inside a server stay there (no hop), the stream keeps input order."""
    from tvm_diviml.app.rpc_run import build_per_server
    from tvm_diviml.zoo.reference import run_reference

    model, extraction = models(TWIN)
    platform = get_platform("servers:2xcpu2")
    built = build_per_server(model.mod, round_robin(extraction, platform), platform, extraction=extraction)
    remotes = connect_servers(platform, servers.addresses[:2])
    try:
        with RpcRunner(built, remotes, [w for _, w in model.params], timeout_s=30) as runner:
            seeds = [3, 1, 4, 1, 5]
            outputs = list(runner.stream([model.sample_inputs(seed) for seed in seeds], in_flight=3))
            assert runner.stats.hops == 2 * len(seeds) * sum(crossings_of(built).values())
    finally:
        for remote in remotes.values():
            remote.close()
    for seed, got in zip(seeds, outputs, strict=True):
        for a, b in zip(got, run_reference(model, model.sample_inputs(seed)), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_driver_hop_is_measured_over_the_sessions(servers):
    platform = get_platform("servers:2xcpu1")
    remotes = connect_servers(platform, servers.addresses[:2])
    try:
        hops = measure_driver_hops(remotes, sizes=(64 << 10, 1 << 20), repeats=1)
    finally:
        for remote in remotes.values():
            remote.close()
    assert set(hops) == {"s0", "s1"}
    for hop in hops.values():
        assert hop.upload_Bps > 0 and hop.download_Bps > 0
        assert hop.upload_latency_s >= 0 and hop.download_latency_s >= 0
        assert hop.seconds(2e6) > hop.seconds(1e6)


def test_a_session_with_a_call_inside_is_never_closed(victim):
    """TVM's CloseRPCConnection frees the channel without the lock a call holds: a session that a
    thread is still inside (its server hung) stays open; once idle it closes, and refuses calls."""
    platform = get_platform("servers:1xcpu1")
    remote = connect_servers(platform, victim.addresses)["s0"]
    with remote.calling():
        assert remote.close() is False
        assert remote.function("ffi.ArraySize")(remote.function("ffi.Array")(1, 2)) == 2  # still open
    assert remote.close() is True
    with pytest.raises(RuntimeError, match="is closed"), remote.calling():
        pass
    # the server serves one session at a time: it takes a new one only if that one really ended
    connect_servers(platform, victim.addresses, timeout_s=10)["s0"].close()


def run_until_failure(model, extraction, addresses, act, timeout_s):
    """Stream inputs through a 2-server build until ``act()``, at the third output, breaks its second
    server; calls have ``timeout_s`` from then on (setting up and the first outputs had the hang guard,
    which a loaded machine may need). The error and the sessions."""
    from tvm_diviml.app.rpc_run import build_per_server

    platform = get_platform("servers:2xcpu1")
    built = build_per_server(model.mod, round_robin(extraction, platform), platform, extraction=extraction)
    remotes = connect_servers(platform, addresses)
    acted_at = None
    with RpcRunner(built, remotes, [w for _, w in model.params], timeout_s=HANG_GUARD_S) as runner:
        with pytest.raises(ServerError) as caught:
            inputs = (model.sample_inputs(i % 2) for i in range(10**6))
            for count, _ in enumerate(runner.stream(inputs, in_flight=2), start=1):
                if count == 3:
                    runner.executor.timeout_s = timeout_s
                    acted_at = time.monotonic()
                    act()
                elif acted_at is not None and time.monotonic() - acted_at > HANG_GUARD_S:
                    break  # the stream went on as if nothing had happened: no error, the test fails
        return caught.value, remotes


def test_killed_server_is_named_at_once(servers, models):
    model, extraction = models(TWIN)
    error, remotes = run_until_failure(
        model,
        extraction,
        [servers.addresses[0], servers.addresses[SPARE]],
        lambda: servers.kill(SPARE),
        timeout_s=HANG_GUARD_S,
    )
    address = f"127.0.0.1:{servers.addresses[SPARE][1]}"
    assert error.server == "s1" and error.address == address
    assert f"server s1 ({address}) failed" in str(error) and error.segment in str(error)
    assert not isinstance(error, ServerTimeoutError)  # a dead socket fails at once, not at the timeout
    remotes["s0"].close()


@pytest.fixture
def victim():
    """A server of its own, to be stopped (paired with the module's first server)."""
    with start_local_servers(1) as own:
        yield own


@pytest.mark.slow
def test_hung_server_is_named_within_the_timeout(servers, victim, models):
    model, extraction = models(TWIN)
    group = victim.processes[0].pid
    # the hang guard: a runner that never times out sees the server go on, and the stream runs out
    resume = threading.Timer(HANG_GUARD_S, lambda: os.killpg(group, signal.SIGCONT))

    def stop():
        os.killpg(group, signal.SIGSTOP)
        resume.start()

    try:
        error, remotes = run_until_failure(model, extraction, servers.addresses[:1] + victim.addresses, stop, 5.0)
    finally:
        resume.cancel()
    assert isinstance(error, ServerTimeoutError)
    assert error.server == "s1" and f"server s1 (127.0.0.1:{victim.addresses[0][1]}) did not answer" in str(error)
    assert error.segment and error.segment in str(error)
    remotes["s0"].close()


def test_cli_runs_over_given_servers(servers, tmp_path, capsys):
    import json

    from tvm_diviml.cli import main

    addresses = ",".join(f"{host}:{port}" for host, port in servers.addresses[:2])
    # heft, not auto: a list schedule plans in milliseconds, whatever hop figures this run measures
    code = main(
        [
            "run",
            "llama:layers=2,hidden=128,heads=4,kv_heads=2,intermediate=256,vocab=128,seq=32",
            "--platform",
            "servers:2xcpu1",
            "--rpc",
            addresses,
            "--cost",
            "roofline",
            "--solver",
            "heft",
            "--repeats",
            "2",
            "--json",
            str(tmp_path / "row.json"),
            "--export",
            str(tmp_path / "builds"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "outputs against the single-device reference" in out and ": equal" in out
    row = json.loads((tmp_path / "row.json").read_text())
    run = row["run"]
    assert run["executor"] == "rpc" and run["max_rel_diff"] <= 1e-4
    assert set(run["driver_hops"]) == {"s0", "s1"}
    used = {device.split(".")[0] for device in row["assignment"].values()}
    assert run["predicted_s"] == pytest.approx(row["value_s"] + sum(run["predicted_io_s"].values()))
    assert set(run["predicted_io_s"]) <= used and sum(run["predicted_io_s"].values()) > 0
    assert set(run["server_busy_s"]) == used
    from tvm_diviml.runtime.rpc import ServersBuild

    loaded = ServersBuild.load(str(tmp_path / "builds"))
    assert set(loaded.builds) == used and len(loaded.segments) == run["segments"]


def test_cli_refuses_a_wrong_number_of_addresses(capsys):
    from tvm_diviml.cli import main

    code = main(["run", "twin_branch", "--platform", "servers:3xcpu1", "--rpc", "127.0.0.1:9090", "--cost", "roofline"])
    _, err = capsys.readouterr()
    assert code == 2 and "give 3" in err


@pytest.mark.slow
def test_cli_starts_local_servers_and_plans_with_the_measured_hops(tmp_path, capsys):
    import json

    from tvm_diviml.cli import main

    code = main(
        [
            "run",
            "llama:layers=2,hidden=128,heads=4,kv_heads=2,intermediate=256,vocab=128,seq=32",
            "--platform",
            "servers:2xcpu1",
            "--rpc",
            "local",
            "--objective",
            "throughput",
            "--cost",
            "roofline",
            "--solver",
            "milp",
            "--inputs",
            "4",
            "--time-limit",
            "5",
            "--json",
            str(tmp_path / "row.json"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "starting 2 RPC server(s) on 127.0.0.1" in out and "throughput over RPC" in out
    run = json.loads((tmp_path / "row.json").read_text())["run"]
    for hop in run["driver_hops"].values():  # measured over the sessions, not the platform's network
        assert hop["upload_Bps"] < 12.5e9 and hop["download_Bps"] < 12.5e9
    assert all(addr.startswith("127.0.0.1:") for addr in run["addresses"].values())


@pytest.mark.slow
def test_server_dead_before_setup_is_named(servers, victim, models):
    from tvm_diviml.app.rpc_run import build_per_server

    model, extraction = models(TWIN)
    platform = get_platform("servers:2xcpu1")
    built = build_per_server(model.mod, round_robin(extraction, platform), platform, extraction=extraction)
    remotes = connect_servers(platform, servers.addresses[:1] + victim.addresses)
    victim.kill(0)
    try:
        with pytest.raises(
            ServerError,
            match=rf"server s1 \(127\.0\.0\.1:{victim.addresses[0][1]}\) failed while "
            "taking its build",
        ):
            RpcRunner(built, remotes, [w for _, w in model.params], timeout_s=10)
    finally:
        remotes["s0"].close()


LLAMA_CLI = "llama:layers=2,hidden=128,heads=4,kv_heads=2,intermediate=256,vocab=128,seq=32"


def slow_kernels_table(path, model: str, platform: str) -> str:
    """A cost table pricing every kernel at 1 ms on every device: splitting the model across the
    servers pays whatever the driver's hops cost, so a plan uses both."""
    from tvm_diviml.app.load import load_model
    from tvm_diviml.modelspec import parse_model_spec

    name, options = parse_model_spec(model)
    graph = load_model(name, options).extraction.graph
    devices = get_platform(platform).device_names
    path.write_text(json.dumps({"kernels": {k: {d: 1e-3 for d in devices} for k in graph.kernels}}))
    return str(path)


@pytest.mark.parametrize("fault", ["killed", "stopped"])
def test_cli_names_a_server_that_fails_mid_run_and_releases_the_others(
    servers, victim, monkeypatch, capsys, tmp_path, fault
):
    """A server killed (SIGKILL) or stopped (SIGSTOP) while a stream runs: one line naming the server, its
    address and the segment, exit status 3, no traceback; the other server takes a new session at once."""
    from tvm_diviml.cli import main
    from tvm_diviml.runtime.rpc import RpcRunner

    signum = signal.SIGKILL if fault == "killed" else signal.SIGSTOP
    original = RpcRunner.stream

    def stream_then_fault(self, inputs, in_flight=2):
        for count, outputs in enumerate(original(self, inputs, in_flight), start=1):
            if count == 3:
                # a hung server is found within the timeout after the stop: setting up and the first
                # outputs had a minute each, which a loaded machine (load 15 on 2 cores) may need
                self.executor.timeout_s = 5.0
                os.killpg(victim.processes[0].pid, signum)
            yield outputs

    monkeypatch.setattr(RpcRunner, "stream", stream_then_fault)
    addresses = [servers.addresses[0], victim.addresses[0]]
    code = main(
        [
            "run",
            LLAMA_CLI,
            "--platform",
            "servers:2xcpu1",
            "--rpc",
            ",".join(f"{host}:{port}" for host, port in addresses),
            "--objective",
            "throughput",
            "--cost",  # the plan uses both servers, the victim too
            slow_kernels_table(tmp_path / "costs.json", LLAMA_CLI, "servers:2xcpu1"),
            "--solver",
            "greedy",
            "--inputs",
            "200",
            "--rpc-timeout",
            "60",
        ]
    )
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("diviml: error:")]
    assert code == 3, out + err
    assert len(lines) == 1 and "Traceback" not in err
    assert f"server s1 (127.0.0.1:{victim.addresses[0][1]})" in lines[0] and "segment '" in lines[0]
    assert ("did not answer" if fault == "stopped" else "failed") in lines[0]
    connect_servers(get_platform("servers:1xcpu1"), addresses[:1], timeout_s=60)["s0"].close()


@pytest.mark.parametrize("how", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_a_stopped_rpc_run_exits_cleanly_and_leaves_no_server(how, tmp_path):
    """Ctrl-C (or SIGTERM) while `diviml run --rpc local` streams: 'interrupted', exit 130, no abort from a
    thread left inside TVM, and the local servers it started are gone (checked by pid)."""
    import subprocess
    import sys

    command = [
        sys.executable,
        "-m",
        "tvm_diviml.cli",
        "run",
        "llama:layers=2,hidden=128,heads=4,kv_heads=2,intermediate=256,vocab=128,seq=32",
        "--platform",
        "servers:2xcpu1",
        "--rpc",
        "local",
        "--objective",
        "throughput",
        "--cost",
        "roofline",
        "--solver",
        "greedy",
        "--inputs",
        "1000000",
    ]
    # a background job (CI) inherits SIGINT ignored, and Python then keeps it so: restore the default
    driver = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        Lines(driver.stdout).wait_for("built for servers")  # the stream starts right after the build
        servers = [
            int(pid)
            for pid in subprocess.run(
                ["pgrep", "-P", str(driver.pid), "-f", "rpc_servers"], capture_output=True, text=True
            ).stdout.split()
        ]
        assert len(servers) == 2, driver.stderr.read() if driver.poll() is not None else "no servers found"
        driver.send_signal(how)  # as the stream starts
        driver.wait(timeout=HANG_GUARD_S)
    finally:
        driver.kill()
    err = driver.stderr.read()
    assert driver.returncode == 130 and "diviml: interrupted" in err, err[-2000:]
    assert "terminate called" not in err
    # the servers are stopped on the way out (gone when diviml is, or soon after on a loaded machine)
    wait_until(
        lambda: not any(os.path.exists(f"/proc/{pid}") for pid in servers),
        "every RPC server gone with diviml (none outlives it)",
    )
