"""Device, Link, Platform: what the machine is, and its JSON form (the presets are in ``presets.py``).

A device has a TVM target (a dict such as ``{"kind": "cuda", "arch": "sm_90"}`` or a bare tag:
TVM 0.27 rejects target strings with options), a TVM device (``cpu:0``, ``cuda:1``), its memory,
its datasheet peaks and the *efficiency* that turns them into the effective figures that estimates
use. A link between two devices sends b bytes in ``latency_s + b / bandwidth_Bps`` seconds; a
missing bandwidth means the copy is free (two devices that share one memory).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import DivimlInputError
from .jsonio import MAX_SECONDS, MIN_RATE, JsonFile, long_integers_as_floats, require_number

FORMAT = "diviml.platform/1"
_DEVICE_RE = re.compile(r"^(cpu|cuda|rocm|metal|vulkan|opencl|ext_dev):(\d+)$")
_TRANSFER_MODELS = ("direct", "host_staged")
# The least efficiency of a real build: TVM's unscheduled CPU kernels reached 0.001-0.005 of the peak;
# a millionth is a slip (a percentage written as a fraction of one).
MIN_EFFICIENCY = 1e-6


@dataclass(frozen=True)
class Device:
    name: str
    target: dict | str  # TVM target as a dict, or a tag without options
    device: str  # TVM device, "kind:index"
    memory_bytes: float | None = None  # None: no limit
    peak_flops: float = 1e9  # datasheet FLOP/s (fp32)
    bandwidth_Bps: float = 1e9  # datasheet memory bandwidth, bytes/s
    efficiency: float = 1.0  # fraction of the datasheet peaks that estimates assume
    launch_overhead_s: float = 0.0  # fixed cost per kernel launch
    num_threads: int | None = None  # CPU devices: threads TVM's runtime may use
    measure: bool = True  # time kernels here when TVM finds this device; False for a
    # device that describes another machine (a reference testbed)

    @property
    def kind(self) -> str:
        """The TVM device type: ``cpu``, ``cuda``, ..."""
        return self.device.split(":")[0]

    @property
    def index(self) -> int:
        return int(self.device.split(":")[1])

    @property
    def effective_flops(self) -> float:
        return self.peak_flops * self.efficiency

    @property
    def effective_bandwidth_Bps(self) -> float:
        return self.bandwidth_Bps * self.efficiency

    def to_json(self) -> dict:
        out = {
            "name": self.name,
            "target": self.target,
            "device": self.device,
            "memory_bytes": self.memory_bytes,
            "peak_flops": self.peak_flops,
            "bandwidth_Bps": self.bandwidth_Bps,
            "efficiency": self.efficiency,
            "launch_overhead_s": self.launch_overhead_s,
        }
        if self.num_threads is not None:
            out["num_threads"] = self.num_threads
        if not self.measure:
            out["measure"] = False
        return out


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    latency_s: float = 0.0
    bandwidth_Bps: float | None = None  # None: unlimited (shared memory)

    def transfer_s(self, nbytes: float) -> float:
        if self.bandwidth_Bps is None:
            return self.latency_s if nbytes > 0 else 0.0
        return self.latency_s + nbytes / self.bandwidth_Bps if nbytes > 0 else 0.0


class LinkTable(dict):
    """A platform's links: those given, and for every other ordered pair of distinct ``devices`` a
    link of the ``default`` figures (latency, bandwidth), made when first asked for. A thousand GPUs
    on one fabric then hold the links that are read instead of a million (4 s to make); whatever
    reads every link (iteration, ``items``, ``len``) makes them all first."""

    def __init__(self, devices: list[str], default: tuple[float, float | None], given: dict | None = None):
        super().__init__(given or {})
        self.devices, self.default = list(devices), default
        self._known = set(self.devices)

    def _pair(self, key: Any) -> bool:
        return isinstance(key, tuple) and len(key) == 2 and key[0] != key[1] and set(key) <= self._known

    def __missing__(self, key: tuple[str, str]) -> Link:
        if not self._pair(key):
            raise KeyError(key)
        link = Link(key[0], key[1], *self.default)
        dict.__setitem__(self, key, link)
        return link

    def __contains__(self, key: Any) -> bool:
        return dict.__contains__(self, key) or self._pair(key)

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default

    def complete(self) -> LinkTable:
        """This table with every link made."""
        if dict.__len__(self) < len(self.devices) * (len(self.devices) - 1):
            for a in self.devices:
                for b in self.devices:
                    if a != b:
                        self[a, b]  # noqa: B018 (made by __missing__)
        return self

    def __iter__(self):
        return dict.__iter__(self.complete())

    def __len__(self) -> int:
        return dict.__len__(self.complete())

    def keys(self):
        return dict.keys(self.complete())

    def values(self):
        return dict.values(self.complete())

    def items(self):
        return dict.items(self.complete())

    def __eq__(self, other: object) -> bool:
        return dict.__eq__(self.complete(), other.complete() if isinstance(other, LinkTable) else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # a dict

    def figures(self) -> set[tuple[float, float | None]]:
        """The distinct (latency, bandwidth) of the links, without making the default ones."""
        return {self.default} | {(link.latency_s, link.bandwidth_Bps) for link in dict.values(self)}


# A 100 Gb/s data-centre Ethernet/InfiniBand port (100GbE, EDR InfiniBand): 12.5 GB/s.
DEFAULT_NETWORK_BANDWIDTH_BPS = 100e9 / 8
# One message through a data-centre fabric with an RDMA-class stack: a few µs of NIC and switch
# latency (Barroso et al., "Attack of the Killer Microseconds", CACM 60(4), 2017: fabric latencies
# of 1-3 µs, the kernel TCP stack adding tens of µs), with margin for a few switch hops. TVM RPC
# over plain TCP sockets is slower: give ``network_latency_us=50`` for that.
DEFAULT_NETWORK_LATENCY_S = 10e-6


@dataclass(frozen=True)
class Network:
    """The network between two servers' hosts (the device links add each server's own hops)."""

    bandwidth_Bps: float = DEFAULT_NETWORK_BANDWIDTH_BPS
    latency_s: float = DEFAULT_NETWORK_LATENCY_S

    def to_json(self) -> dict:
        return {"bandwidth_Bps": self.bandwidth_Bps, "latency_s": self.latency_s}


@dataclass(frozen=True)
class Server:
    """One server of a multi-server platform: its kind, its devices in the kind's order (so the i-th
    devices of two servers of one kind correspond) and its host, where its network card is."""

    kind: str
    devices: tuple[str, ...]
    host: str

    def to_json(self) -> dict:
        return {"kind": self.kind, "devices": list(self.devices), "host": self.host}


@dataclass
class Platform(JsonFile):
    """Devices and the links between every ordered pair of distinct devices.

    ``host`` is where model inputs start and outputs return (default: the first CPU device).
    ``transfer_model`` is ``direct`` (device to device over the link) or ``host_staged``
    (every copy passes through host memory: the msr-fiddle model, where accelerators pay for
    transfers and CPUs do not); it selects the cost mode of throughput plans. ``servers`` and
    ``network`` describe a platform of several servers (``servers.py`` builds them); JSON keeps
    them under ``attrs`` as before.
    """

    name: str
    devices: list[Device]
    links: dict[tuple[str, str], Link]
    host: str | None = None
    transfer_model: str = "direct"
    description: str = ""
    servers: dict[str, Server] = field(default_factory=dict)  # server id -> Server; {}: one machine
    network: Network | None = None  # between the servers' hosts
    extra_attrs: dict[str, Any] = field(default_factory=dict)  # other "attrs" keys a file carries

    def __post_init__(self) -> None:
        names = [d.name for d in self.devices]
        if not names:
            raise DivimlInputError("a platform needs at least one device", field="devices")
        seen = set()
        for dev in self.devices:
            _check_device(dev)
            if dev.name in seen:
                raise DivimlInputError(
                    f"device '{dev.name}' appears twice", field="devices", hint="device names must be unique"
                )
            seen.add(dev.name)
        table = isinstance(self.links, LinkTable)
        if table:
            if self.links.devices != names:
                raise DivimlInputError("the link table names other devices than the platform", field="links")
            check_link(Link("", "", *self.links.default), "default_link")
        for (src, dst), link in dict.items(self.links) if table else self.links.items():
            for end in (src, dst):
                if end not in seen:
                    raise DivimlInputError(
                        f"link {src} -> {dst} names unknown device '{end}'",
                        field="links",
                        hint=f"known devices: {', '.join(names)}",
                    )
            check_link(link, f"links[{src}->{dst}]")
        missing = [] if table else [(a, b) for a in names for b in names if a != b and (a, b) not in self.links]
        if missing:
            a, b = missing[0]
            raise DivimlInputError(
                f"no link from '{a}' to '{b}' ({len(missing)} ordered pairs missing)",
                field="links",
                hint="give a link for every ordered pair of devices, or 'default_link' for all that are not listed",
            )
        if self.host is None:
            cpus = [d.name for d in self.devices if d.kind == "cpu"]
            self.host = cpus[0] if cpus else names[0]
        if not isinstance(self.host, str) or self.host not in seen:
            raise DivimlInputError(
                f"host '{self.host}' is not a device", field="host", hint=f"known devices: {', '.join(names)}"
            )
        if self.transfer_model not in _TRANSFER_MODELS:
            raise DivimlInputError(
                f"unknown transfer model '{self.transfer_model}'",
                field="transfer_model",
                hint=f"use one of {', '.join(_TRANSFER_MODELS)}",
            )
        if self.servers:
            _check_servers(self.servers, names)
        self.by_name = {d.name: d for d in self.devices}

    def device(self, name: str) -> Device:
        try:
            return self.by_name[name]
        except KeyError:
            raise DivimlInputError(
                f"unknown device '{name}' on platform '{self.name}'",
                hint=f"known devices: {', '.join(self.device_names)}",
            ) from None

    @property
    def device_names(self) -> list[str]:
        return [d.name for d in self.devices]

    def with_threads(self, name: str, threads: int) -> Platform:
        """This platform with device ``name`` running ``threads`` threads (the whole CPU as one device):
        its kernels are built for that many."""
        self.device(name)
        devices = [replace(d, num_threads=threads) if d.name == name else d for d in self.devices]
        return replace(self, devices=devices)

    def link(self, src: str, dst: str) -> Link:
        return self.links[(src, dst)]

    def link_figures(self) -> set[tuple[float, float | None]]:
        """The distinct (latency, bandwidth) of its links."""
        if isinstance(self.links, LinkTable):
            return self.links.figures()
        return {(link.latency_s, link.bandwidth_Bps) for link in self.links.values()}

    def transfer_s(self, nbytes: float, src: str, dst: str) -> float:
        """Seconds to send ``nbytes`` from ``src`` to ``dst``; nothing on one device."""
        if src == dst:
            return 0.0
        return self.links[(src, dst)].transfer_s(nbytes)

    @property
    def attrs(self) -> dict[str, Any]:
        """The JSON form's ``attrs`` object: the servers and the network as files carry them, then
        the other keys (read the typed fields; this view is what files hold)."""
        out: dict[str, Any] = {}
        if self.servers:
            out["servers"] = {sid: server.to_json() for sid, server in self.servers.items()}
        if self.network is not None:
            out["network"] = self.network.to_json()
        return {**out, **self.extra_attrs}

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        """The file form; a ``LinkTable``'s default figures as ``default_link`` and only the links that
        differ listed (gpu1000: 107 MB of identical links otherwise)."""
        default = self.links.default if isinstance(self.links, LinkTable) else None
        listed = dict.values(self.links) if default is not None else self.links.values()
        return {
            "format": FORMAT,
            "name": self.name,
            "description": self.description,
            "host": self.host,
            "transfer_model": self.transfer_model,
            "devices": [d.to_json() for d in self.devices],
            **({"default_link": {"latency_s": default[0], "bandwidth_Bps": default[1]}} if default else {}),
            "links": [
                {"src": link.src, "dst": link.dst, "latency_s": link.latency_s, "bandwidth_Bps": link.bandwidth_Bps}
                for link in listed
                if (link.latency_s, link.bandwidth_Bps) != default
            ],
            **({"attrs": self.attrs} if self.attrs else {}),  # e.g. which server each device is on
        }

    @classmethod
    def from_json(cls, data: Any) -> Platform:
        data = long_integers_as_floats(data)
        for key, reader in _FILE_FORMS.items():
            if isinstance(data, dict) and key in data:
                return reader(data)
        if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
            raise DivimlInputError(
                "not a platform: expected an object with a 'devices' list",
                field="devices",
                hint="see `diviml platforms --json NAME` for an example",
            )
        devices = [_device_from_json(raw, i) for i, raw in enumerate(data["devices"])]
        names = [d.name for d in devices]
        links: dict[tuple[str, str], Link] = {}
        default = data.get("default_link")
        if default is not None and not isinstance(default, dict):
            raise DivimlInputError(
                f"must be an object {{latency_s, bandwidth_Bps}}, got {default!r}", field="default_link"
            )
        if default is not None:
            figures = link_from_json({**default, "src": "", "dst": ""}, "default_link")
            links = LinkTable(names, (figures.latency_s, figures.bandwidth_Bps))
        if not isinstance(data.get("links", []), list):
            raise DivimlInputError(
                f"must be a list of links, got {data.get('links')!r}",
                field="links",
                hint="leave it out, or give [] when default_link covers every pair",
            )
        for i, raw in enumerate(data.get("links", [])):
            link = link_from_json(raw, f"links[{i}]")
            links[(link.src, link.dst)] = link
            if raw.get("bidirectional"):
                links[(link.dst, link.src)] = Link(link.dst, link.src, link.latency_s, link.bandwidth_Bps)
        attrs = _attrs_from_json(data.get("attrs", {}))
        platform = cls(
            name=str(data.get("name", "platform")),
            devices=devices,
            links=links,
            host=data.get("host"),
            transfer_model=str(data.get("transfer_model", "direct")),
            description=str(data.get("description", "")),
            servers=_servers_from_attrs(attrs.pop("servers", {})),
            network=_network_from_attrs(attrs.pop("network", None)),
            extra_attrs=attrs,
        )
        for device in platform.devices:
            check_device_rates(device)
        return platform


# Readers of the platform files of another form, by the top-level key that marks them: ``presets.py``
# registers the servers form ({"servers": [...]}), whose kinds name presets that this module cannot import.
_FILE_FORMS: dict[str, Callable[[dict], Platform]] = {}


def register_file_form(key: str, reader: Callable[[dict], Platform]) -> None:
    """Have ``Platform.from_json`` hand a file with top-level ``key`` to ``reader``."""
    _FILE_FORMS[key] = reader


def _attrs_from_json(raw: Any) -> dict:
    if not isinstance(raw, dict):
        raise DivimlInputError("must be an object", field="attrs")
    return dict(raw)


def _servers_from_attrs(raw: Any) -> dict[str, Server]:
    """``attrs.servers`` of a file: ``{"s0": {"kind", "devices", "host"}, ...}``."""

    def well_formed(entry: Any) -> bool:
        return (
            isinstance(entry, dict)
            and isinstance(entry.get("kind"), str)
            and isinstance(entry.get("host"), str)
            and isinstance(entry.get("devices"), list)
            and all(isinstance(d, str) for d in entry["devices"])
        )

    if not isinstance(raw, dict) or not all(well_formed(entry) for entry in raw.values()):
        raise DivimlInputError('must map each server to {"kind", "devices", "host"}', field="attrs.servers")
    return {str(sid): Server(entry["kind"], tuple(entry["devices"]), entry["host"]) for sid, entry in raw.items()}


def _network_from_attrs(raw: Any) -> Network | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"bandwidth_Bps", "latency_s"}:
        raise DivimlInputError('must be {"bandwidth_Bps": B, "latency_s": S}', field="attrs.network")
    return Network(
        require_link_bandwidth(raw["bandwidth_Bps"], "attrs.network.bandwidth_Bps"),
        require_number(raw["latency_s"], "attrs.network.latency_s", minimum=0.0, maximum=MAX_SECONDS),
    )


def _check_servers(servers: dict[str, Server], device_names: list[str]) -> None:
    """Every device on exactly one server."""
    listed = [d for server in servers.values() for d in server.devices]
    if sorted(listed) != sorted(device_names):
        stray = sorted(set(listed) ^ set(device_names)) or [d for d in listed if listed.count(d) > 1]
        raise DivimlInputError(
            f"servers and devices disagree (e.g. '{stray[0]}')",
            field="attrs.servers",
            hint="every device must belong to exactly one server",
        )


def _check_device(dev: Device) -> None:
    if not isinstance(dev.name, str) or not dev.name:
        raise DivimlInputError(f"a device name must be a non-empty string, got {dev.name!r}", field="devices")
    where = f"devices[{dev.name}]"
    if not isinstance(dev.device, str) or not _DEVICE_RE.match(dev.device):
        raise DivimlInputError(
            f"TVM device '{dev.device}' is not of the form kind:index",
            field=f"{where}.device",
            hint="for example cpu:0 or cuda:1",
        )
    if isinstance(dev.target, str):
        if " " in dev.target.strip() or dev.target.strip().startswith("-"):
            raise DivimlInputError(
                f"target string '{dev.target}' has options, which TVM 0.27 rejects",
                field=f"{where}.target",
                hint='write it as a dict, e.g. {"kind": "llvm", "mcpu": "znver3"}',
            )
    elif not (isinstance(dev.target, dict) and isinstance(dev.target.get("kind"), str)):
        raise DivimlInputError("target must be a tag string or a dict with 'kind'", field=f"{where}.target")
    for attr in ("peak_flops", "bandwidth_Bps"):
        require_number(getattr(dev, attr), f"{where}.{attr}", above=0.0)
    require_number(dev.efficiency, f"{where}.efficiency", above=0.0)
    if not dev.efficiency <= 1:
        raise DivimlInputError(
            f"efficiency must be in (0, 1], got {dev.efficiency}",
            field=f"{where}.efficiency",
            hint="the fraction of the datasheet peak that the built kernels reach",
        )
    if dev.memory_bytes is not None:
        require_number(dev.memory_bytes, f"{where}.memory_bytes", above=0.0, hint="bytes > 0, or null for no limit")
    require_number(dev.launch_overhead_s, f"{where}.launch_overhead_s", minimum=0.0, maximum=MAX_SECONDS)
    if dev.num_threads is not None and (
        isinstance(dev.num_threads, bool) or not isinstance(dev.num_threads, int) or dev.num_threads < 1
    ):
        raise DivimlInputError(
            f"num_threads must be an integer of at least 1 (or null), got {dev.num_threads!r}",
            field=f"{where}.num_threads",
        )


def require_rate(value: Any, field: str, what: str, unit: str, example: str) -> float:
    """A rate per second of a device or link (``unit`` FLOP or B): more than 0, at most
    ``MAX_QUANTITY`` and, below ``MIN_RATE``, refused as the unit slip it is (costs of days per
    megabyte, which no solver's integers scale beside a real machine's microseconds)."""
    words = {"B": "bytes", "FLOP": "FLOP"}[unit]
    hint = f"{field.rsplit('.', 1)[-1]} is {words} per second: {example}"
    rate = require_number(value, field, above=0.0, hint=hint)
    if rate < MIN_RATE:
        raise DivimlInputError(f"{rate:g} {unit}/s is below any real {what}", field=field, hint=hint)
    return rate


def require_link_bandwidth(value: Any, field: str) -> float:
    return require_rate(value, field, "link", "B", "12 GB/s is 12e9; null for unlimited")


def check_link(link: Link, field: str) -> None:
    """A link's latency is seconds >= 0; its bandwidth bytes/s > 0, or None for unlimited."""
    require_number(link.latency_s, f"{field}.latency_s", minimum=0.0, maximum=MAX_SECONDS)
    if link.bandwidth_Bps is not None:
        require_number(link.bandwidth_Bps, f"{field}.bandwidth_Bps", above=0.0, hint="bytes/s, or null for unlimited")


def check_device_rates(dev: Device) -> None:
    """What a file may not say of a device though the API may (unit-scale test platforms): rates
    below ``MIN_RATE`` and efficiencies below ``MIN_EFFICIENCY``, the unit slips they are."""
    where = f"devices[{dev.name}]"
    require_rate(dev.peak_flops, f"{where}.peak_flops", "device", "FLOP", "10 TFLOP/s is 1e13")
    require_rate(dev.bandwidth_Bps, f"{where}.bandwidth_Bps", "memory", "B", "500 GB/s is 5e11")
    if dev.efficiency < MIN_EFFICIENCY:
        raise DivimlInputError(
            f"{dev.efficiency:g} is below any real build's efficiency",
            field=f"{where}.efficiency",
            hint=f"the fraction of the datasheet peak that the built kernels reach, from {MIN_EFFICIENCY:g} to 1",
        )


def _device_from_json(raw: Any, index: int) -> Device:
    where = f"devices[{index}]"
    if not isinstance(raw, dict):
        raise DivimlInputError("must be an object", field=where)
    known = set(Device.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise DivimlInputError(f"unknown keys {sorted(unknown)}", field=where, hint=f"known keys: {sorted(known)}")
    for key in ("name", "target", "device"):
        if key not in raw:
            raise DivimlInputError(f"missing '{key}'", field=where)
    try:
        return Device(**raw)
    except TypeError as error:
        raise DivimlInputError(str(error), field=where) from None


def link_from_json(raw: Any, where: str) -> Link:
    if not isinstance(raw, dict) or "src" not in raw or "dst" not in raw:
        raise DivimlInputError("a link needs 'src' and 'dst'", field=where)
    bandwidth = raw.get("bandwidth_Bps")
    latency = require_number(raw.get("latency_s", 0.0), f"{where}.latency_s", minimum=0.0, maximum=MAX_SECONDS)
    if bandwidth is not None:
        bandwidth = require_link_bandwidth(bandwidth, f"{where}.bandwidth_Bps")
    for end in ("src", "dst"):
        if not isinstance(raw[end], str):
            raise DivimlInputError(f"must be a device name, got {raw[end]!r}", field=f"{where}.{end}")
    return Link(raw["src"], raw["dst"], latency, bandwidth)
