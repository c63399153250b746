"""A replicated plan run over real TVM RPC sessions on the loopback: one replica of the whole model per
server, each input of the stream sent to one of them.

Without servers: the driver's model I/O of a replicated plan is priced per server by the routes'
shares (hand-computed). With servers (three started once for the module, the third to be killed): the
replicas give the single-device reference's outputs in input order, each server takes inputs in
proportion to its share, and a server killed mid-stream fails the stream at once with an error naming
the replica and the server; ``diviml run --rpc`` keeps the replicas where they are predicted faster.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tvm_diviml.app.rpc_run import (
    ReplicatedServersBuild,
    build_for_servers,
    open_runner,
    plan_line,
    replica_failures_as_server_errors,
    routed_driver_io_s,
    run_plan_rpc,
)
from tvm_diviml.graph import Edge, GraphInput, Kernel, OpGraph
from tvm_diviml.plan import Plan, ReplicaGroup
from tvm_diviml.presets import get_platform
from tvm_diviml.profiling.rpc_hops import DriverHop, driver_io_s
from tvm_diviml.runtime.rpc import ServerError, ServerTimeoutError
from tvm_diviml.runtime.rpc_servers import connect_servers, start_local_servers

from ..helpers import HANG_GUARD_S

TWIN = ("twin_branch", {"depth": 2, "hidden": 32, "batch": 2})
TWIN_CLI = "twin_branch:depth=2,hidden=32,batch=2"
PLATFORM = "servers:2xcpu1"
VICTIM = 2  # the server the failure test kills; the others run the rest


def replicated(kernels: list[str], shares: dict[str, float]) -> Plan:
    """The whole model on every device of ``shares``, each taking that share of the stream."""
    first = next(iter(shares))
    return Plan(
        dict.fromkeys(kernels, first),
        objective="throughput",
        mode="period_overlap",
        replicas=[ReplicaGroup(list(kernels), shares)],
        solver="replicas",
    )


# ---------------------------------------------------------------------- without servers
def test_the_drivers_model_io_is_shared_out_by_the_routes():
    platform = get_platform(PLATFORM)
    hops = {"s0": DriverHop(1e-3, 100e6, 2e-3, 50e6), "s1": DriverHop(3e-3, 200e6, 4e-3, 25e6)}
    graph = OpGraph(
        [Kernel("a"), Kernel("b", output_bytes=2e6)], [Edge("a", "b", 1.0)], inputs=[GraphInput("x", 1e6, ("a",))]
    )
    plan = replicated(["a", "b"], {"s0.cpu": 0.75, "s1.cpu": 0.25})
    on = {sid: driver_io_s(graph, Plan(dict.fromkeys("ab", f"{sid}.cpu")), platform, hops)[sid] for sid in hops}
    # x up to s0 (2 ms + 1 MB / 50 MB/s), b's 2 MB down (1 ms + 2 MB / 100 MB/s); s1: 4 + 40, 3 + 10 ms
    assert on == pytest.approx({"s0": 0.022 + 0.021, "s1": 0.044 + 0.013})
    assert routed_driver_io_s(graph, plan, platform, hops) == pytest.approx({"s0": 0.75 * 0.043, "s1": 0.25 * 0.057})
    assert plan_line(plan, platform).endswith("each input on one of 2 routes: s0 75%, s1 25%")


# ---------------------------------------------------------------------- with servers
@pytest.fixture(scope="module")
def servers():
    """Started at once, as each takes seconds to import TVM."""
    with start_local_servers(3) as started:
        yield started


@pytest.fixture(scope="module")
def twin():
    from tvm_diviml.passes import extract
    from tvm_diviml.zoo import build_model

    model = build_model(*TWIN)
    return model, extract(model.mod, model.entry)


def test_replicas_share_the_stream_and_give_the_reference_outputs_in_order(servers, twin):
    from tvm_diviml.zoo.reference import run_reference

    model, extraction = twin
    platform = get_platform(PLATFORM)
    shares = {"s0.cpu": 0.75, "s1.cpu": 0.25}
    plan = replicated(extraction.graph.topo_order, shares)
    stream_inputs = 8
    run, built = run_plan_rpc(
        model,
        extraction,
        platform,
        plan,
        1e-3,
        servers.addresses[:2],
        stream_inputs=stream_inputs,
        in_flight=2,
        predicted_busy_s={"s0.cpu": 3e-4, "s1.cpu": 1e-4},
        progress=lambda _: None,
    )
    assert isinstance(built, ReplicatedServersBuild) and built.names == ["s0", "s1"]
    assert [list(route.builds) for route in built.routes] == [["s0"], ["s1"]]  # each replica on its server alone
    assert run.max_rel_diff <= 1e-5
    assert set(run.replicas) == {"s0", "s1"}
    for sid, replica in run.replicas.items():
        assert replica["share"] == pytest.approx(shares[f"{sid}.cpu"])
        assert abs(replica["inputs"] - replica["share"] * stream_inputs) <= 1
    assert run.hops == 0 and run.crossings == {}  # a whole replica sends nothing between servers
    assert set(run.server_busy_s) == {"s0", "s1"} and all(s > 0 for s in run.server_busy_s.values())
    assert run.predicted_server_busy_s == {"s0": 3e-4, "s1": 1e-4}
    assert json.loads(json.dumps(run.to_json()))["replicas"] == run.replicas

    remotes = connect_servers(platform, servers.addresses[:2])  # the run closed its own sessions
    seeds = [3, 1, 4, 1, 5]
    try:
        with open_runner(built, remotes, [w for _, w in model.params], timeout_s=30) as runner:
            outputs = list(runner.stream([model.sample_inputs(seed) for seed in seeds], in_flight=3))
            assert dict(runner.sent) == {"s0": 4, "s1": 1}  # the third input went to s1
    finally:
        for remote in remotes.values():
            remote.close()
    for seed, got in zip(seeds, outputs, strict=True):
        for a, b in zip(got, run_reference(model, model.sample_inputs(seed)), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_replicas_server_killed_mid_stream_is_named_at_once(servers, twin):
    """The stream stops with a ServerError (the CLI's one line, exit status 3) naming the replica, the
    input, the server, its address and the segment if one was running; it does not wait for the timeout."""
    model, extraction = twin
    platform = get_platform(PLATFORM)
    plan = replicated(extraction.graph.topo_order, {"s0.cpu": 0.5, "s1.cpu": 0.5})
    built = build_for_servers(model.mod, plan, platform, extraction=extraction)
    remotes = connect_servers(platform, [servers.addresses[0], servers.addresses[VICTIM]])

    def inputs():
        for index in range(10_000):  # ends, so a failure never noticed fails the test instead of hanging it
            if index == 4:
                servers.kill(VICTIM)
            yield model.sample_inputs(index % 2)

    try:
        with (
            open_runner(built, remotes, [w for _, w in model.params], timeout_s=HANG_GUARD_S) as runner,
            pytest.raises(ServerError) as caught,
            replica_failures_as_server_errors(),
        ):
            for _ in runner.stream(inputs(), in_flight=2):
                pass
    finally:
        remotes["s0"].close()
    error, address = caught.value, f"127.0.0.1:{servers.addresses[VICTIM][1]}"
    assert error.server == "s1" and error.address == address and error.input_index >= 3
    assert f"replica s1 failed on input {error.input_index}" in str(error)
    assert f"server s1 ({address}) failed" in str(error)
    assert not error.segment or f"segment '{error.segment}'" in str(error)  # none when an output's download failed
    assert not isinstance(error, ServerTimeoutError)  # a dead socket fails at once, not at the timeout


def test_cli_keeps_the_replicas_where_they_are_predicted_faster(servers, tmp_path, capsys):
    """Every kernel priced at 1 ms on either server: the whole model on both halves the period."""
    from tvm_diviml.app.load import load_model
    from tvm_diviml.cli import main
    from tvm_diviml.runtime.rpc import ServersBuild

    graph = load_model(*TWIN).extraction.graph
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"kernels": {k: {"s0.cpu": 1e-3, "s1.cpu": 1e-3} for k in graph.kernels}}))
    code = main(
        [
            "run",
            TWIN_CLI,
            "--platform",
            PLATFORM,
            "--rpc",
            ",".join(f"{host}:{port}" for host, port in servers.addresses[:2]),
            "--objective",
            "throughput",
            "--cost",
            str(costs),
            "--time-limit",
            "5",
            "--inputs",
            "4",
            "--json",
            str(tmp_path / "row.json"),
            "--export",
            str(tmp_path / "builds"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "the whole model replicated" in out and "each input on one of 2 routes: s0 50%, s1 50%" in out
    row = json.loads((tmp_path / "row.json").read_text())
    run = row["run"]
    assert [group["shares"] for group in row["replicas"]] == [pytest.approx({"s0.cpu": 0.5, "s1.cpu": 0.5})]
    assert set(run["replicas"]) == {"s0", "s1"} and sum(r["inputs"] for r in run["replicas"].values()) == 4
    assert run["max_rel_diff"] <= 1e-4 and set(run["predicted_io_s"]) == {"s0", "s1"}
    for sid in ("s0", "s1"):
        assert list(ServersBuild.load(str(tmp_path / "builds" / sid)).builds) == [sid]
