"""Device, Link, Platform: what the machine is, and its JSON form (the presets are in ``presets.py``).

A device has a TVM target (a dict such as ``{"kind": "cuda", "arch": "sm_90"}`` or a bare tag:
TVM 0.27 rejects target strings with options), a TVM device (``cpu:0``, ``cuda:1``), its memory,
its datasheet peaks and the *efficiency* that turns them into the effective figures that estimates
use. A link between two devices sends b bytes in ``latency_s + b / bandwidth_Bps`` seconds; a
bandwidth of None means the copy is free (two devices that share one memory).

The file form is documented in docs/platform.md and checked by ``platform.schema.json`` beside this
module; ``Platform.from_json`` refuses whatever that schema refuses, with errors that name the field.
A file gives every device's peaks, or ``"estimate"`` for this machine's CPU or a known GPU part
(``machine.py``); the estimates are noted under ``attrs.estimates`` so that reports say so.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import DivimlInputError
from .jsonio import MAX_SECONDS, MIN_RATE, JsonFile, long_integers_as_floats, require_number
from .machine import gpu_part, host_copy, host_cpu, known_part_names

FORMAT = "diviml.platform/1"
_DEVICE_RE = re.compile(r"^(cpu|cuda|rocm|metal|vulkan|opencl|ext_dev):(\d+)$")
_TRANSFER_MODELS = ("direct", "host_staged")
# The keys of a platform file of devices (the servers form has its own: ``servers.py``).
_FILE_KEYS = ("format", "name", "description", "host", "transfer_model", "devices", "default_link", "links", "attrs")
_LINK_FIGURES = ("latency_s", "bandwidth_Bps")
# A device figure a file may leave to tvm-diviml: this machine's CPU, or a known GPU's datasheet.
ESTIMATE = "estimate"
ESTIMABLE = ("peak_flops", "bandwidth_Bps")
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
    part: str | None = None  # the product, e.g. "NVIDIA L4": what "estimate" looks up (machine.GPU_PARTS)

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
        if self.part is not None:
            out["part"] = self.part
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

    @property
    def estimates(self) -> dict[str, dict[str, str]]:
        """Device -> figure -> how it was estimated (``attrs.estimates``): the figures a report must
        call estimates."""
        return self.extra_attrs.get("estimates", {})

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
                hint="see docs/platform.md, or start from `diviml platforms --detect`",
            )
        _check_file_keys(data)
        estimates: dict[str, dict[str, str]] = {}
        devices = [_device_from_json(raw, i, estimates) for i, raw in enumerate(data["devices"])]
        names = [d.name for d in devices]
        links: dict[tuple[str, str], Link] = {}
        default = data.get("default_link")
        if default is not None:
            figures = _link_figures_from_json(default, "default_link", set(_LINK_FIGURES))
            links = LinkTable(names, (figures.latency_s, figures.bandwidth_Bps))
        if not isinstance(data.get("links", []), list):
            raise DivimlInputError(
                f"must be a list of links, got {data.get('links')!r}",
                field="links",
                hint="leave it out, or give [] when default_link covers every pair",
            )
        for i, raw in enumerate(data.get("links", [])):
            where = f"links[{i}]"
            _link_figures_from_json(raw, where, {"src", "dst", "bidirectional", *_LINK_FIGURES})
            link = link_from_json(raw, where)
            links[(link.src, link.dst)] = link
            if raw.get("bidirectional", False):
                links[(link.dst, link.src)] = Link(link.dst, link.src, link.latency_s, link.bandwidth_Bps)
        attrs = _attrs_from_json(data.get("attrs", {}))
        given_estimates = _estimates_from_attrs(attrs.pop("estimates", {}), names)
        for device, notes in estimates.items():
            given_estimates.setdefault(device, {}).update(notes)
        if given_estimates:
            attrs["estimates"] = given_estimates
        platform = cls(
            name=data.get("name", "platform"),
            devices=devices,
            links=links,
            host=data.get("host"),
            transfer_model=data.get("transfer_model", "direct"),
            description=data.get("description", ""),
            servers=_servers_from_attrs(attrs.pop("servers", {})),
            network=_network_from_attrs(attrs.pop("network", None)),
            extra_attrs=attrs,
        )
        for device in platform.devices:
            check_device_rates(device)
        return platform


def _check_file_keys(data: dict) -> None:
    """The top level of a platform file of devices: known keys, its format, text where text is meant."""
    unknown = sorted(set(data) - set(_FILE_KEYS))
    if unknown:
        raise DivimlInputError(
            f"unknown keys {unknown}",
            field=unknown[0],
            hint=f"a platform file has {', '.join(_FILE_KEYS)} (docs/platform.md)",
        )
    if "format" in data and data["format"] != FORMAT:
        raise DivimlInputError(
            f"unknown format {data['format']!r}", field="format", hint=f'write "{FORMAT}", or leave it out'
        )
    for key in ("name", "description", "transfer_model"):
        if key in data and not isinstance(data[key], str):
            raise DivimlInputError(f"must be a string, got {data[key]!r}", field=key)


def _link_figures_from_json(raw: Any, where: str, keys: set[str]) -> Link:
    """A platform file's link (or its default_link): only ``keys``, both figures given (null bandwidth:
    unlimited), ``bidirectional`` true or false."""
    if not isinstance(raw, dict):
        raise DivimlInputError(
            f"must be an object {{{', '.join(sorted(keys))}}}, got {raw!r}", field=where, hint="docs/platform.md"
        )
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise DivimlInputError(f"unknown keys {unknown}", field=where, hint=f"a link has {', '.join(sorted(keys))}")
    for figure in _LINK_FIGURES:
        if figure not in raw:
            raise DivimlInputError(
                f"missing '{figure}'",
                field=f"{where}.{figure}",
                hint="give latency_s in seconds and bandwidth_Bps in bytes/s (null: unlimited, for devices "
                "that share one memory)",
            )
    if not isinstance(raw.get("bidirectional", False), bool):
        raise DivimlInputError(f"must be true or false, got {raw['bidirectional']!r}", field=f"{where}.bidirectional")
    return link_from_json({"src": "", "dst": "", **raw}, where)


def _estimates_from_attrs(raw: Any, names: list[str]) -> dict[str, dict[str, str]]:
    """``attrs.estimates`` of a file: ``{device: {figure: how it was estimated}}``."""
    well_formed = isinstance(raw, dict) and all(
        isinstance(notes, dict) and all(f in ESTIMABLE and isinstance(n, str) for f, n in notes.items())
        for notes in raw.values()
    )
    if not well_formed:
        raise DivimlInputError(
            "must map devices to {figure: how it was estimated}",
            field="attrs.estimates",
            hint=f"figures are {' and '.join(ESTIMABLE)}",
        )
    stray = sorted(set(raw) - set(names))
    if stray:
        raise DivimlInputError(
            f"names unknown device '{stray[0]}'", field="attrs.estimates", hint=f"known devices: {', '.join(names)}"
        )
    return {device: dict(notes) for device, notes in raw.items()}


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
            and set(entry) == {"kind", "devices", "host"}
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


def _check_identity(name: Any, device: Any, target: Any) -> None:
    """A device's name, TVM device string and target: what every other check names it by."""
    if not isinstance(name, str) or not name:
        raise DivimlInputError(f"a device name must be a non-empty string, got {name!r}", field="devices")
    where = f"devices[{name}]"
    if not isinstance(device, str) or not _DEVICE_RE.fullmatch(device):
        raise DivimlInputError(
            f"TVM device {device!r} is not of the form kind:index",
            field=f"{where}.device",
            hint="for example cpu:0 or cuda:1",
        )
    if isinstance(target, str):
        if not re.fullmatch(r"[^\s-]\S*", target):
            raise DivimlInputError(
                f"target string '{target}' has options, which TVM 0.27 rejects",
                field=f"{where}.target",
                hint='write it as a dict, e.g. {"kind": "llvm", "mcpu": "znver3"}',
            )
    elif not (isinstance(target, dict) and isinstance(target.get("kind"), str) and target["kind"]):
        raise DivimlInputError("target must be a tag string or a dict with 'kind'", field=f"{where}.target")


def _check_device(dev: Device) -> None:
    _check_identity(dev.name, dev.device, dev.target)
    where = f"devices[{dev.name}]"
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
    if not isinstance(dev.measure, bool):
        raise DivimlInputError(f"must be true or false, got {dev.measure!r}", field=f"{where}.measure")
    if dev.part is not None and not (isinstance(dev.part, str) and dev.part):
        raise DivimlInputError(
            f"must be the product's name, got {dev.part!r}", field=f"{where}.part", hint='e.g. "NVIDIA L4", or null'
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


def _device_from_json(raw: Any, index: int, estimates: dict[str, dict[str, str]]) -> Device:
    """A file's device; its ``"estimate"`` figures filled in, and noted in ``estimates``."""
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
    _check_identity(raw["name"], raw["device"], raw["target"])
    named = f"devices[{raw['name']}]"
    missing = [figure for figure in ESTIMABLE if figure not in raw]
    if missing:
        raise DivimlInputError(
            f"missing {' and '.join(repr(figure) for figure in missing)}",
            field=f"{named}.{missing[0]}",
            hint="give the datasheet figure (peak_flops in FLOP/s fp32, bandwidth_Bps in bytes/s of memory), or "
            '"estimate" for this machine\'s CPU or a known GPU part (docs/platform.md)',
        )
    filled = dict(raw)
    for key, value in raw.items():
        if value == ESTIMATE and key not in (*ESTIMABLE, "name", "part"):
            raise DivimlInputError(
                f'"{ESTIMATE}" stands only for {" and ".join(ESTIMABLE)}',
                field=f"{named}.{key}",
                hint="give the figure",
            )
        if key not in ESTIMABLE or not isinstance(value, str):
            continue
        if value != ESTIMATE:
            raise DivimlInputError(
                f'must be a number or "{ESTIMATE}", got {value!r}',
                field=f"{named}.{key}",
                hint='a number per second (10 TFLOP/s is 1e13), or "estimate" (docs/platform.md)',
            )
        filled[key], note = _estimate(raw, key, f"{named}.{key}")
        estimates.setdefault(raw["name"], {})[key] = note
    try:
        return Device(**filled)
    except TypeError as error:
        raise DivimlInputError(str(error), field=where) from None


def _estimate(raw: dict, figure: str, where: str) -> tuple[float, str]:
    """The figure that ``"estimate"`` stands for on this device, and how it was reached: this machine's
    CPU for a CPU device that is this machine's, a known part's datasheet for a GPU."""
    kind = raw["device"].split(":")[0]
    target_kind = raw["target"]["kind"] if isinstance(raw["target"], dict) else raw["target"]
    if kind == "cpu" and target_kind == "llvm":
        if raw.get("measure", True) is not True:
            raise DivimlInputError(
                '"estimate" describes this machine\'s CPU, and this device describes another machine (measure false)',
                field=where,
                hint="give that machine's datasheet figure",
            )
        if figure == "bandwidth_Bps":
            copy = host_copy()
            return copy.bandwidth_Bps, copy.note
        threads = raw.get("num_threads")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            threads = host_cpu().cores
        return host_cpu().core_flops * threads, host_cpu().flops_note(threads)
    if kind in ("cuda", "rocm"):
        named = raw.get("part") or raw["name"]
        part = gpu_part(named) or (
            gpu_part(raw["target"]) if raw.get("part") is None and isinstance(raw["target"], str) else None
        )
        if part is None:
            raise DivimlInputError(
                f'"estimate" needs a known GPU part, and {named!r} names none',
                field=where,
                hint=f'give the datasheet figure, or name the part in "part" (known: {known_part_names()}); '
                "`diviml platforms --detect` estimates the GPUs it finds",
            )
        return (part.fp32_flops if figure == "peak_flops" else part.bandwidth_Bps), part.note()
    raise DivimlInputError(
        f"no estimate for a {kind} device with target {target_kind!r}",
        field=where,
        hint='"estimate" knows llvm CPUs (this machine\'s) and CUDA/ROCm GPUs of known parts: give the figure',
    )


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
