"""What a tensor that crosses servers costs: two hops through the driver, priced for the planner.

TVM RPC has no server-to-server copy, so ``RpcRunner`` (``rpc.py``) downloads such a tensor to the
driver and uploads it to its destination. ``measure_driver_hops`` fits latency + bytes / bandwidth
for each direction over the real sessions (``DriverHop``), and ``driver_hop_platform`` prices every
cross-server link of a platform as that path (at those figures, or at the platform's network figures:
``network_hop``), so that plans pay what this runtime pays. The driver also uploads the model inputs
and downloads the outputs of every inference, which the simulator does not see (it takes them from and
to the host device): ``driver_io_s`` prices them per server and ``with_driver_io`` adds them to a
plan's predicted value. Pricing needs no TVM; measuring uses ``tvm.runtime`` only, imported where needed.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

import numpy as np

from ..cost.fit import fit_link
from ..errors import DivimlInputError
from ..graph import OpGraph
from ..plan import Plan
from ..platform import Link, Platform
from ..runtime.rpc_servers import RemoteServer, within
from ..servers import per_server, server_devices, server_of

log = logging.getLogger(__name__)

# 1 KB pins the latency (a model input or output is often that small: token ids, logits): fitted from
# 64 KB up only, the loopback latency came out anywhere between 0 and 600 us run to run
HOP_SIZES = (1 << 10, 64 << 10, 1 << 20, 4 << 20)


@dataclass(frozen=True)
class DriverHop:
    """One tensor through the driver: download from a server, upload to a server (latency + bytes / bandwidth)."""

    download_latency_s: float
    download_Bps: float
    upload_latency_s: float
    upload_Bps: float

    def seconds(self, nbytes: float) -> float:
        """A tensor from this server to another through the driver (both hops at these figures)."""
        return self.download_latency_s + nbytes / self.download_Bps + self.upload_latency_s + nbytes / self.upload_Bps

    def to_json(self) -> dict:
        return asdict(self)


def measure_driver_hops(
    remotes: Mapping[str, RemoteServer], sizes: Iterable[int] = HOP_SIZES, repeats: int = 3, *, timeout_s: float = 60.0
) -> dict[str, DriverHop]:
    """Per server, upload and download tensors of ``sizes`` bytes over its session and fit latency +
    bytes / bandwidth for each direction (median of ``repeats`` after one warm-up); a server that does
    not finish within ``timeout_s`` raises TimeoutError naming it."""
    return {
        sid: within(
            timeout_s,
            f"measuring the driver hop of {remote.name}",
            lambda remote=remote: _measure_hop(remote, tuple(sizes), repeats),
        )
        for sid, remote in remotes.items()
    }


def _measure_hop(remote: RemoteServer, sizes: tuple[int, ...], repeats: int) -> DriverHop:
    with remote.calling():
        uploads, downloads = _time_hops(remote.session.cpu(0), sizes, repeats)
    nbytes = np.asarray(sizes, dtype=float)
    upload, download = fit_link(nbytes, np.asarray(uploads)), fit_link(nbytes, np.asarray(downloads))
    log.info(
        "%s: upload %.2f ms + %.1f MB/s, download %.2f ms + %.1f MB/s",
        remote.name,
        upload.latency_s * 1e3,
        upload.bandwidth_Bps / 1e6,
        download.latency_s * 1e3,
        download.bandwidth_Bps / 1e6,
    )
    return DriverHop(download.latency_s, download.bandwidth_Bps, upload.latency_s, upload.bandwidth_Bps)


def _time_hops(device, sizes: tuple[int, ...], repeats: int) -> tuple[list[float], list[float]]:
    """Median upload and download seconds of a tensor of each size to and from ``device``."""
    import tvm

    uploads, downloads = [], []
    for nbytes in sizes:
        data = np.zeros(nbytes // 4, dtype="float32")
        up, down = [], []
        for _ in range(repeats + 1):
            began = time.perf_counter()
            tensor = tvm.runtime.tensor(data, device)
            up.append(time.perf_counter() - began)
            began = time.perf_counter()
            tensor.numpy()
            down.append(time.perf_counter() - began)
        uploads.append(float(np.median(up[1:])))
        downloads.append(float(np.median(down[1:])))
    return uploads, downloads


def network_hop(platform: Platform) -> DriverHop:
    """Both hops at the platform's network figures (what a driver on that network pays)."""
    network = platform.network
    if network is None:
        raise DivimlInputError(
            f"platform '{platform.name}' has no network figures",
            field="platform",
            hint="give measured hops, or a servers: platform",
        )
    return DriverHop(network.latency_s, network.bandwidth_Bps, network.latency_s, network.bandwidth_Bps)


def driver_hop_platform(platform: Platform, hops: DriverHop | Mapping[str, DriverHop] | None = None) -> Platform:
    """``platform`` with every cross-server link priced as the driver path: source device to its host,
    download to the driver (the source server's hop), upload to the other host (the destination's hop),
    host to device. Each step finishes before the next starts, so latencies add and so do the inverse
    bandwidths. Links inside a server stay. ``hops``: one for all servers, one per server, or None for
    the platform's network figures."""
    if isinstance(hops, Mapping):
        missing = [sid for sid in server_devices(platform) if sid not in hops]
        if missing:
            raise DivimlInputError(
                f"no driver hop for server {missing[0]}",
                field="hops",
                hint=f"give one per server: {', '.join(server_devices(platform))}",
            )
        hop_of = dict(hops)
    else:
        hop = hops or network_hop(platform)
        hop_of = dict.fromkeys(server_devices(platform), hop)
    home = server_of(platform)
    links = {}
    for (src, dst), link in platform.links.items():
        a, b = home[src], home[dst]
        if a == b:
            links[(src, dst)] = link
            continue
        steps = [
            (hop_of[a].download_latency_s, hop_of[a].download_Bps),
            (hop_of[b].upload_latency_s, hop_of[b].upload_Bps),
        ]
        for end, host in ((src, platform.servers[a].host), (dst, platform.servers[b].host)):
            if end != host:
                inner = platform.link(*((end, host) if end == src else (host, end)))
                steps.append((inner.latency_s, inner.bandwidth_Bps))
        inverse = sum(1 / bandwidth for _, bandwidth in steps if bandwidth is not None)
        links[(src, dst)] = Link(src, dst, sum(latency for latency, _ in steps), 1 / inverse if inverse else None)
    hop_figures = {sid: hop.to_json() for sid, hop in hop_of.items()}
    return Platform(
        platform.name,
        list(platform.devices),
        links,
        host=platform.host,
        transfer_model=platform.transfer_model,
        description=f"{platform.description}; across servers through the driver (two hops)",
        servers=platform.servers,
        network=platform.network,
        extra_attrs={**platform.extra_attrs, "driver_hops": hop_figures},
    )


def driver_io_s(graph: OpGraph, plan: Plan, platform: Platform, hops: Mapping[str, DriverHop]) -> dict[str, float]:
    """Per server, the seconds per inference its session spends on the driver's model I/O: each model
    input uploaded once to every device that reads it (as ``RpcRunner`` moves it), each model output
    downloaded from the server that makes it."""
    home = server_of(platform)
    io: Counter = Counter()
    for graph_input in graph.inputs:
        for device in {plan.assignment[k] for k in graph_input.consumers}:
            hop = hops[home[device]]
            io[home[device]] += hop.upload_latency_s + graph_input.bytes / hop.upload_Bps
    for output in graph.outputs:
        server = home[plan.assignment[output]]
        hop = hops[server]
        io[server] += hop.download_latency_s + graph.kernels[output].output_bytes / hop.download_Bps
    return dict(io)


def with_driver_io(
    objective: str, value_s: float, device_busy_s: Mapping[str, float], io_s: Mapping[str, float], platform: Platform
) -> float:
    """A plan's simulated ``value_s`` with the driver's model I/O (``driver_io_s``): a latency waits for
    every upload and download in turn; a stream's period is at least each server's session time per
    inference, since a session serves one call at a time (its devices' work and its share of the I/O)."""
    if objective == "latency":
        return value_s + sum(io_s.values())
    session = Counter(io_s) + Counter(per_server(dict(device_busy_s), platform))
    return max([value_s, *session.values()])
