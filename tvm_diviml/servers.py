"""Several servers joined by a network, as one Platform: ``servers:4xpaper-node`` or a JSON file.

Each server is a copy of a *kind* (a preset or an inline platform); its devices are renamed
``s{i}.{device}`` and keep the kind's TVM device strings (a TVM device string names a device on its
own server, so a multi-server plan is built and run per server). Inside a server the kind's links
apply; between servers a link follows device -> host -> network -> host -> device, latencies adding
and the slowest bandwidth binding. That is a direct path: the two hops through the driver that TVM
RPC needs are priced by ``runtime.rpc_hops``, not here.

``Platform.servers`` records which device lives on which server (its kind, devices and host), devices
in the kind's order, so the i-th devices of two servers of one kind correspond (the symmetric solver
relies on it). The platform's host is server 0's host.

Link composition and the RPC hops: docs/design.md#across-servers.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .errors import DivimlInputError
from .jsonio import MAX_QUANTITY, MAX_SECONDS, MIN_RATE
from .platform import FORMAT, Link, Network, Platform, Server

PREFIX = "servers:"
SPEC_HELP = "servers:NxKIND[+MxKIND...][,network_gbps=G][,network_latency_us=U]"
# The full mesh of links is quadratic in the devices: 64 paper-nodes (192 devices) build in ~0.5 s.
MAX_SERVERS = 64

# What a server kind's name (a preset, a JSON file) becomes: ``presets.load_platform``.
KindLoader = Callable[[str], Platform]
DEFAULT_NETWORK = Network()  # 100 Gb/s, 10 us; frozen, so one shared default is safe


@dataclass(frozen=True)
class ServerGroup:
    """``count`` identical servers of one kind (``kind`` is its name, ``server`` its platform)."""

    kind: str
    server: Platform
    count: int


def build_servers(
    groups: list[ServerGroup],
    network: Network = DEFAULT_NETWORK,
    pair_networks: dict[frozenset[str], Network] | None = None,
    *,
    name: str = "",
    description: str = "",
    field: str = "servers",
) -> Platform:
    """One Platform of all servers of ``groups``; ``pair_networks`` overrides ``network`` between the
    two servers of a pair (both directions). ``field`` names the input that gave the groups, for errors."""
    _check_groups(groups, field)
    pair_networks = pair_networks or {}
    devices, links, servers, estimates = [], {}, {}, {}
    for group in groups:
        for _ in range(group.count):
            sid = f"s{len(servers)}"
            renamed = {d.name: f"{sid}.{d.name}" for d in group.server.devices}
            devices += [replace(d, name=renamed[d.name]) for d in group.server.devices]
            estimates.update({renamed[device]: notes for device, notes in group.server.estimates.items()})
            for (src, dst), link in group.server.links.items():
                links[(renamed[src], renamed[dst])] = Link(
                    renamed[src], renamed[dst], link.latency_s, link.bandwidth_Bps
                )
            servers[sid] = Server(group.kind, tuple(renamed.values()), renamed[group.server.host])
    for pair in pair_networks:
        unknown = sorted(pair - set(servers))
        if unknown:
            raise DivimlInputError(
                f"network link names unknown server '{unknown[0]}'",
                field="network_links",
                hint=f"servers are {', '.join(servers)} (s0 first, numbered across groups)",
            )
    for sa, a in servers.items():
        for sb, b in servers.items():
            if sa != sb:
                net = pair_networks.get(frozenset((sa, sb)), network)
                for src in a.devices:
                    for dst in b.devices:
                        hops = [links[(src, a.host)]] if src != a.host else []
                        hops += [links[(b.host, dst)]] if dst != b.host else []
                        bandwidths = [h.bandwidth_Bps for h in hops if h.bandwidth_Bps is not None]
                        links[(src, dst)] = Link(
                            src,
                            dst,
                            net.latency_s + sum(h.latency_s for h in hops),
                            min([net.bandwidth_Bps, *bandwidths]),
                        )
    return Platform(
        name or _spec_name(groups),
        devices,
        links,
        host=servers["s0"].host,
        transfer_model=groups[0].server.transfer_model,
        description=description or _describe(groups, network),
        servers=servers,
        network=network,
        extra_attrs={"estimates": estimates} if estimates else {},
    )


def _spec_name(groups: list[ServerGroup]) -> str:
    return PREFIX + "+".join(f"{g.count}x{g.kind}" for g in groups)


def _describe(groups: list[ServerGroup], network: Network) -> str:
    kinds = " + ".join(f"{g.count} x {g.kind}" for g in groups)
    return f"{kinds} servers on a {network.bandwidth_Bps * 8 / 1e9:g} Gb/s, {network.latency_s * 1e6:g} µs network"


def _check_groups(groups: list[ServerGroup], where: str) -> None:
    total = sum(g.count for g in groups)
    if not 1 <= total <= MAX_SERVERS:
        raise DivimlInputError(f"{total} servers; between 1 and {MAX_SERVERS} are supported", field=where)
    seen: dict[str, dict] = {}
    for group in groups:
        if group.server.servers:
            raise DivimlInputError(
                f"server kind '{group.kind}' is itself several servers",
                field=where,
                hint="a server kind must be one machine: a preset or a plain platform",
            )
        shape = {k: v for k, v in group.server.to_json().items() if k not in ("name", "description")}
        if seen.setdefault(group.kind, shape) != shape:
            raise DivimlInputError(
                f"two different server kinds are both named '{group.kind}'",
                field=where,
                hint="give each inline server platform its own 'name'",
            )
    transfer_models = {g.server.transfer_model for g in groups}
    if len(transfer_models) > 1:
        raise DivimlInputError(
            f"server kinds mix transfer models {sorted(transfer_models)}",
            field=where,
            hint="give every server kind the same transfer_model",
        )


# ---------------------------------------------------------------------- the spec string
def servers_platform(spec: str, load_kind: KindLoader) -> Platform:
    """``servers:4xpaper-node``, ``servers:2xpaper-node+2xh200-node,network_gbps=25,network_latency_us=50``.
    A kind is anything ``load_kind`` takes except another ``servers:`` spec; ``1x`` may be left out."""
    counted, options = spec_groups(spec)
    network = _network_options(options, spec)
    groups = [ServerGroup(kind, _kind_platform(kind, "platform", load_kind), count) for count, kind in counted]
    return build_servers(groups, network, name=spec, field="platform")


def spec_groups(spec: str) -> tuple[list[tuple[int, str]], list[str]]:
    """A ``servers:`` spec's (count, kind) groups, and its network options unparsed."""
    kinds, *options = [part.strip() for part in spec.removeprefix(PREFIX).split(",")]
    groups = []
    for part in kinds.split("+"):
        match = re.fullmatch(r"(?:(\d+)\s*x\s*)?(\S+)", part.strip())
        if not match:
            raise DivimlInputError(
                f"'{part}' in '{spec}' is not COUNTxKIND",
                field="platform",
                hint=f"write {SPEC_HELP}, e.g. servers:2xpaper-node+2xh200-node",
            )
        count, kind = int(match.group(1) or 1), match.group(2)
        if count < 1:
            raise DivimlInputError(
                f"'{part}' in '{spec}' asks for {count} servers",
                field="platform",
                hint="each group needs at least one server, e.g. 1xpaper-node",
            )
        groups.append((count, kind))
    return groups, options


def _network_options(options: list[str], spec: str) -> Network:
    scale = {"network_gbps": ("bandwidth_Bps", 1e9 / 8), "network_latency_us": ("latency_s", 1e-6)}
    values: dict[str, float] = {}
    for option in options:
        key, sep, text = option.partition("=")
        if key.strip() not in scale or not sep:
            raise DivimlInputError(
                f"unknown option '{option}' in '{spec}'",
                field="platform",
                hint="options are network_gbps=G (Gb/s) and network_latency_us=U (µs)",
            )
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        attribute, unit = scale[key.strip()]
        values[attribute] = _checked(value * unit, attribute, f"platform option {key.strip()}")
    return Network(**values)


def _checked(value: Any, attribute: str, where: str) -> float:
    """A network figure: a finite number, positive for bandwidth, non-negative for latency, at most
    ``MAX_QUANTITY`` bytes/s or ``MAX_SECONDS``; a bandwidth below ``MIN_RATE`` is a unit slip."""
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    positive = attribute == "bandwidth_Bps"
    hint = "bandwidth in bytes/s (Gb/s in specs), latency in seconds (µs in specs)"
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise DivimlInputError(
            f"must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}", field=where, hint=hint
        )
    if number > (MAX_QUANTITY if positive else MAX_SECONDS):
        raise DivimlInputError(f"{number:g} is beyond any real network", field=where, hint=hint)
    if positive and number < MIN_RATE:
        raise DivimlInputError(f"{number:g} B/s is below any real network", field=where, hint=hint)
    return float(number)


def _kind_platform(kind: Any, where: str, load_kind: KindLoader) -> Platform:
    if isinstance(kind, dict):
        if "servers" in kind:
            raise DivimlInputError(
                "an inline server kind is itself several servers",
                field=where,
                hint="a server kind must be one machine: give its 'devices'",
            )
        try:
            return Platform.from_json(kind)
        except DivimlInputError as error:
            raise DivimlInputError(
                error.detail, field=f"{where}.{error.field or ''}".rstrip("."), hint=error.hint
            ) from None
    if not isinstance(kind, str) or not kind:
        raise DivimlInputError(f"a server kind is a preset name or a platform object, got {kind!r}", field=where)
    if kind.startswith(PREFIX):
        raise DivimlInputError(
            f"server kind '{kind}' is itself several servers",
            field=where,
            hint="a server kind must be one machine, e.g. paper-node",
        )
    try:
        return load_kind(kind)
    except DivimlInputError as error:
        raise DivimlInputError(f"unknown server kind '{kind}'", field=where, hint=error.hint) from None


# ---------------------------------------------------------------------- JSON
_JSON_KEYS = {"format", "name", "description", "servers", "network", "network_links"}


def servers_from_json(data: dict, load_kind: KindLoader) -> Platform:
    """A platform file that describes servers:
    ``{"servers": [{"kind": "paper-node", "count": 2}, {"kind": {...platform...}}], "network":
    {"bandwidth_Bps": ..., "latency_s": ...}, "network_links": [{"src_server": "s0", "dst_server":
    "s1", "bandwidth_Bps": ..., "latency_s": ...}]}``; a pair's missing figure is the network's; a
    kind named by a string is what ``load_kind`` makes of it."""
    unknown = sorted(set(data) - _JSON_KEYS)
    if unknown:
        raise DivimlInputError(
            f"unknown keys {unknown} in a servers platform",
            field=unknown[0],
            hint=f"known keys: {sorted(_JSON_KEYS)}; a servers file has no 'devices' "
            "or 'links': its servers bring them",
        )
    if "format" in data and data["format"] != FORMAT:
        raise DivimlInputError(f"unknown format {data['format']!r}", field="format", hint=f'write "{FORMAT}"')
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise DivimlInputError(f"must be a string, got {data[key]!r}", field=key)
    if not isinstance(data["servers"], list) or not data["servers"]:
        raise DivimlInputError('must be a non-empty list of {"kind": ..., "count": N}', field="servers")
    groups = [_group_from_json(raw, f"servers[{i}]", load_kind) for i, raw in enumerate(data["servers"])]
    network = _network_from_json(data.get("network", {}), Network(), "network")
    pairs: dict[frozenset[str], Network] = {}
    raw_pairs = data.get("network_links", [])
    if not isinstance(raw_pairs, list):
        raise DivimlInputError("must be a list of server pairs", field="network_links")
    for i, raw in enumerate(raw_pairs):
        where = f"network_links[{i}]"
        if (
            not isinstance(raw, dict)
            or not {"src_server", "dst_server"} <= set(raw)
            or not all(isinstance(raw[end], str) for end in ("src_server", "dst_server"))
        ):
            raise DivimlInputError(
                "a network link needs 'src_server' and 'dst_server'",
                field=where,
                hint='e.g. {"src_server": "s0", "dst_server": "s1", "bandwidth_Bps": 3.125e9}',
            )
        pair = frozenset((raw["src_server"], raw["dst_server"]))
        if len(pair) != 2:
            raise DivimlInputError(
                f"links server '{raw['src_server']}' to itself",
                field=where,
                hint="inside a server its kind's own links apply",
            )
        if pair in pairs:
            raise DivimlInputError(
                f"servers {' and '.join(sorted(pair))} are given twice",
                field=where,
                hint="a pair's figures apply both ways; give each pair once",
            )
        pairs[pair] = _network_from_json(
            {k: v for k, v in raw.items() if k not in ("src_server", "dst_server")}, network, where
        )
    return build_servers(
        groups, network, pairs, name=str(data.get("name", "")), description=str(data.get("description", ""))
    )


def _group_from_json(raw: Any, where: str, load_kind: KindLoader) -> ServerGroup:
    if not isinstance(raw, dict) or "kind" not in raw or set(raw) - {"kind", "count"}:
        raise DivimlInputError('a server group is {"kind": PRESET or {platform}, "count": N}', field=where)
    count = raw.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise DivimlInputError(f"count must be an integer >= 1, got {count!r}", field=f"{where}.count")
    kind = raw["kind"]
    platform = _kind_platform(kind, f"{where}.kind", load_kind)
    return ServerGroup(kind if isinstance(kind, str) else platform.name, platform, count)


def _network_from_json(raw: Any, default: Network, where: str) -> Network:
    if not isinstance(raw, dict) or set(raw) - {"bandwidth_Bps", "latency_s"}:
        raise DivimlInputError('a network is {"bandwidth_Bps": B, "latency_s": S}', field=where)
    return Network(**{key: _checked(value, key, f"{where}.{key}") for key, value in {**vars(default), **raw}.items()})


# ---------------------------------------------------------------------- queries
def server_devices(platform: Platform) -> dict[str, list[str]]:
    """Server -> its devices (in its kind's order). A platform without servers is one server, ``s0``."""
    if not platform.servers:
        return {"s0": list(platform.device_names)}
    return {sid: list(server.devices) for sid, server in platform.servers.items()}


def server_of(platform: Platform) -> dict[str, str]:
    """Device -> the server it lives on."""
    return {device: sid for sid, devices in server_devices(platform).items() for device in devices}


def per_server(seconds_by_device: dict[str, float], platform: Platform) -> dict[str, float]:
    """Server -> the sum of its devices' seconds (busy times: a server's RPC session serves its
    devices' calls one at a time)."""
    home, total = server_of(platform), {}
    for device, seconds in seconds_by_device.items():
        total[home[device]] = total.get(home[device], 0.0) + seconds
    return total


def identical_servers(platform: Platform) -> list[list[str]]:
    """Servers grouped by kind, in server order: the servers of a group are interchangeable inside.
    (The network between them may still differ where ``network_links`` overrides a pair.)"""
    if not platform.servers:
        return [list(server_devices(platform))]
    groups: dict[str, list[str]] = {}
    for sid, server in platform.servers.items():
        groups.setdefault(server.kind, []).append(sid)
    return list(groups.values())


def server_platform(platform: Platform, server: str) -> Platform:
    """One server of ``platform`` alone: its devices and the links among them, its own host."""
    devices = server_devices(platform)
    if server not in devices:
        raise DivimlInputError(
            f"unknown server '{server}' on platform '{platform.name}'", hint=f"servers: {', '.join(devices)}"
        )
    names = set(devices[server])
    host = platform.servers[server].host if platform.servers else platform.host
    return Platform(
        f"{platform.name}/{server}",
        [d for d in platform.devices if d.name in names],
        {pair: link for pair, link in platform.links.items() if set(pair) <= names},
        host=host,
        transfer_model=platform.transfer_model,
        description=f"server {server} of {platform.name}",
    )


def corun_groups(platform: Platform) -> list[set[str]]:
    """The CPU devices of each server: the devices whose workers share that machine's cores and
    memory (``executor_overheads.corun_factor`` prices how much they slow each other)."""
    groups: dict[str, set[str]] = defaultdict(set)
    for device, server in server_of(platform).items():
        if platform.device(device).kind == "cpu":
            groups[server].add(device)
    return [g for g in groups.values() if len(g) > 1]
