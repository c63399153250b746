"""Device, Link, Platform: what the machine is, as presets or JSON.

A device has a TVM target (a dict such as ``{"kind": "cuda", "arch": "sm_90"}`` or a bare tag:
TVM 0.27 rejects target strings with options), a TVM device (``cpu:0``, ``cuda:1``), its memory,
its datasheet peaks and the *efficiency* that turns them into the effective figures that estimates
use. A link between two devices sends b bytes in ``latency_s + b / bandwidth_Bps`` seconds; a
missing bandwidth means the copy is free (two devices that share one memory).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .errors import DivimlInputError
from .jsonio import MAX_SECONDS, JsonFile, require_number

FORMAT = "diviml.platform/1"
_DEVICE_RE = re.compile(r"^(cpu|cuda|rocm|metal|vulkan|opencl|ext_dev):(\d+)$")
_TRANSFER_MODELS = ("direct", "host_staged")


@dataclass(frozen=True)
class Device:
    name: str
    target: dict | str                  # TVM target as a dict, or a tag without options
    device: str                         # TVM device, "kind:index"
    memory_bytes: float | None = None   # None: no limit
    peak_flops: float = 1e9             # datasheet FLOP/s (fp32)
    bandwidth_Bps: float = 1e9          # datasheet memory bandwidth, bytes/s
    efficiency: float = 1.0             # fraction of the datasheet peaks that estimates assume
    launch_overhead_s: float = 0.0      # fixed cost per kernel launch
    num_threads: int | None = None      # CPU devices: threads TVM's runtime may use
    measure: bool = True                # time kernels here when TVM finds this device; False for a
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
        out = {"name": self.name, "target": self.target, "device": self.device,
               "memory_bytes": self.memory_bytes, "peak_flops": self.peak_flops,
               "bandwidth_Bps": self.bandwidth_Bps, "efficiency": self.efficiency,
               "launch_overhead_s": self.launch_overhead_s}
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


@dataclass
class Platform(JsonFile):
    """Devices and the links between every ordered pair of distinct devices.

    ``host`` is where model inputs start and outputs return (default: the first CPU device).
    ``transfer_model`` is ``direct`` (device to device over the link) or ``host_staged``
    (every copy passes through host memory: the msr-fiddle model, where accelerators pay for
    transfers and CPUs do not); it selects the cost mode of throughput plans.
    """

    name: str
    devices: list[Device]
    links: dict[tuple[str, str], Link]
    host: str | None = None
    transfer_model: str = "direct"
    description: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [d.name for d in self.devices]
        if not names:
            raise DivimlInputError("a platform needs at least one device", field="devices")
        seen = set()
        for dev in self.devices:
            _check_device(dev)
            if dev.name in seen:
                raise DivimlInputError(f"device '{dev.name}' appears twice", field="devices",
                                       hint="device names must be unique")
            seen.add(dev.name)
        for (src, dst), link in self.links.items():
            for end in (src, dst):
                if end not in seen:
                    raise DivimlInputError(f"link {src} -> {dst} names unknown device '{end}'",
                                           field="links", hint=f"known devices: {', '.join(names)}")
            check_link(link, f"links[{src}->{dst}]")
        missing = [(a, b) for a in names for b in names if a != b and (a, b) not in self.links]
        if missing:
            a, b = missing[0]
            raise DivimlInputError(f"no link from '{a}' to '{b}' ({len(missing)} ordered pairs missing)",
                                   field="links", hint="give a link for every ordered pair of devices, "
                                   "or 'default_link' for all that are not listed")
        if self.host is None:
            cpus = [d.name for d in self.devices if d.kind == "cpu"]
            self.host = cpus[0] if cpus else names[0]
        if not isinstance(self.host, str) or self.host not in seen:
            raise DivimlInputError(f"host '{self.host}' is not a device", field="host",
                                   hint=f"known devices: {', '.join(names)}")
        if self.transfer_model not in _TRANSFER_MODELS:
            raise DivimlInputError(f"unknown transfer model '{self.transfer_model}'", field="transfer_model",
                                   hint=f"use one of {', '.join(_TRANSFER_MODELS)}")
        self.by_name = {d.name: d for d in self.devices}

    def device(self, name: str) -> Device:
        try:
            return self.by_name[name]
        except KeyError:
            raise DivimlInputError(f"unknown device '{name}' on platform '{self.name}'",
                                   hint=f"known devices: {', '.join(self.device_names)}") from None

    @property
    def device_names(self) -> list[str]:
        return [d.name for d in self.devices]

    def link(self, src: str, dst: str) -> Link:
        return self.links[(src, dst)]

    def transfer_s(self, nbytes: float, src: str, dst: str) -> float:
        """Seconds to send ``nbytes`` from ``src`` to ``dst``; nothing on one device."""
        if src == dst:
            return 0.0
        return self.links[(src, dst)].transfer_s(nbytes)

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        return {
            "format": FORMAT, "name": self.name, "description": self.description,
            "host": self.host, "transfer_model": self.transfer_model,
            "devices": [d.to_json() for d in self.devices],
            "links": [{"src": l.src, "dst": l.dst, "latency_s": l.latency_s, "bandwidth_Bps": l.bandwidth_Bps}
                      for l in self.links.values()],
            **({"attrs": self.attrs} if self.attrs else {}),   # e.g. which server each device is on
        }

    @classmethod
    def from_json(cls, data: Any) -> "Platform":
        if isinstance(data, dict) and "servers" in data:
            from .servers import servers_from_json  # several servers, each with its own devices

            return servers_from_json(data)
        if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
            raise DivimlInputError("not a platform: expected an object with a 'devices' list", field="devices",
                                   hint="see `diviml platforms --json NAME` for an example")
        devices = [_device_from_json(raw, i) for i, raw in enumerate(data["devices"])]
        names = [d.name for d in devices]
        links: dict[tuple[str, str], Link] = {}
        default = data.get("default_link")
        if default is not None and not isinstance(default, dict):
            raise DivimlInputError(f"must be an object {{latency_s, bandwidth_Bps}}, got {default!r}",
                                   field="default_link")
        if not isinstance(data.get("links", []), list):
            raise DivimlInputError(f"must be a list of links, got {data.get('links')!r}", field="links",
                                   hint="leave it out, or give [] when default_link covers every pair")
        if default is not None:
            for a in names:
                for b in names:
                    if a != b:
                        links[(a, b)] = link_from_json({**default, "src": a, "dst": b}, "default_link")
        for i, raw in enumerate(data.get("links", [])):
            link = link_from_json(raw, f"links[{i}]")
            links[(link.src, link.dst)] = link
            if raw.get("bidirectional"):
                links[(link.dst, link.src)] = Link(link.dst, link.src, link.latency_s, link.bandwidth_Bps)
        return cls(name=str(data.get("name", "platform")), devices=devices, links=links, host=data.get("host"),
                   transfer_model=str(data.get("transfer_model", "direct")),
                   description=str(data.get("description", "")), attrs=_attrs_from_json(data.get("attrs", {})))


def _attrs_from_json(raw: Any) -> dict:
    if not isinstance(raw, dict):
        raise DivimlInputError("must be an object", field="attrs")
    return dict(raw)


def _check_device(dev: Device) -> None:
    if not isinstance(dev.name, str) or not dev.name:
        raise DivimlInputError(f"a device name must be a non-empty string, got {dev.name!r}", field="devices")
    where = f"devices[{dev.name}]"
    if not isinstance(dev.device, str) or not _DEVICE_RE.match(dev.device):
        raise DivimlInputError(f"TVM device '{dev.device}' is not of the form kind:index",
                               field=f"{where}.device", hint="for example cpu:0 or cuda:1")
    if isinstance(dev.target, str):
        if " " in dev.target.strip() or dev.target.strip().startswith("-"):
            raise DivimlInputError(f"target string '{dev.target}' has options, which TVM 0.27 rejects",
                                   field=f"{where}.target",
                                   hint='write it as a dict, e.g. {"kind": "llvm", "mcpu": "znver3"}')
    elif not (isinstance(dev.target, dict) and isinstance(dev.target.get("kind"), str)):
        raise DivimlInputError("target must be a tag string or a dict with 'kind'", field=f"{where}.target")
    for attr in ("peak_flops", "bandwidth_Bps"):
        require_number(getattr(dev, attr), f"{where}.{attr}", above=0.0)
    require_number(dev.efficiency, f"{where}.efficiency", above=0.0)
    if not dev.efficiency <= 1:
        raise DivimlInputError(f"efficiency must be in (0, 1], got {dev.efficiency}", field=f"{where}.efficiency",
                               hint="the fraction of the datasheet peak that the built kernels reach")
    if dev.memory_bytes is not None:
        require_number(dev.memory_bytes, f"{where}.memory_bytes", above=0.0, hint="bytes > 0, or null for no limit")
    require_number(dev.launch_overhead_s, f"{where}.launch_overhead_s", minimum=0.0, maximum=MAX_SECONDS)
    if dev.num_threads is not None and (isinstance(dev.num_threads, bool) or not isinstance(dev.num_threads, int)
                                        or dev.num_threads < 1):
        raise DivimlInputError(f"num_threads must be an integer of at least 1 (or null), got {dev.num_threads!r}",
                               field=f"{where}.num_threads")


def check_link(link: Link, field: str) -> None:
    """A link's latency is seconds >= 0; its bandwidth bytes/s > 0, or None for unlimited."""
    require_number(link.latency_s, f"{field}.latency_s", minimum=0.0, maximum=MAX_SECONDS)
    if link.bandwidth_Bps is not None:
        require_number(link.bandwidth_Bps, f"{field}.bandwidth_Bps", above=0.0, hint="bytes/s, or null for unlimited")


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
        bandwidth = require_number(bandwidth, f"{where}.bandwidth_Bps", above=0.0, hint="bytes/s, or null for unlimited")
    for end in ("src", "dst"):
        if not isinstance(raw[end], str):
            raise DivimlInputError(f"must be a device name, got {raw[end]!r}", field=f"{where}.{end}")
    return Link(raw["src"], raw["dst"], latency, bandwidth)


# ---------------------------------------------------------------------- presets
def _full_mesh(devices: list[Device], link_for: Callable[[Device, Device], tuple[float, float | None]]
               ) -> dict[tuple[str, str], Link]:
    links = {}
    for a in devices:
        for b in devices:
            if a.name != b.name:
                latency, bandwidth = link_for(a, b)
                links[(a.name, b.name)] = Link(a.name, b.name, latency, bandwidth)
    return links


# This machine's CPU: AMD EPYC (Zen 3, family 25), 2 cores, AVX2 with two 256-bit FMA units:
# 2 x 8 fp32 lanes x 2 FLOP x 2.45 GHz = 78 GFLOP/s per core. TVM 0.27 leaves CPU conv/matmul
# kernels unscheduled (about 0.4 GFLOP/s measured), so the effective efficiency is 0.005.
_HOST_CPU_CORE_FLOPS = 78.4e9
_UNSCHEDULED_CPU_EFFICIENCY = 0.005


def cpu2() -> Platform:
    """This machine's CPU as two devices (``cpu:0``, ``cpu:1``), one thread each: the platform
    that really runs here. Copies between them are memcpy within one memory (~5 µs, ~10 GB/s)."""
    devices = [Device(name=f"cpu{i}", target={"kind": "llvm"}, device=f"cpu:{i}", memory_bytes=8 * 2**30,
                      peak_flops=_HOST_CPU_CORE_FLOPS, bandwidth_Bps=20e9,
                      efficiency=_UNSCHEDULED_CPU_EFFICIENCY, launch_overhead_s=5e-6, num_threads=1)
               for i in range(2)]
    return Platform("cpu2", devices, _full_mesh(devices, lambda a, b: (5e-6, 10e9)),
                    description="this machine's CPU as two single-thread devices (runs here)")


def paper_node() -> Platform:
    """A CPU plus two *distinct* GPUs on PCIe 3.0 x16, shaped like DiviML's testbed (one CPU and
    two different GPUs in one server).

    Data sheets: Intel Xeon Gold 6230 (20 cores, AVX-512, 2 FMA units, 2.1 GHz: 20 x 32 x 2 x 2.1
    = 2.7 TFLOP/s fp32; 6 channels DDR4-2933 = 140 GB/s); NVIDIA GeForce RTX 2080 Ti (13.4 TFLOP/s
    fp32 boost, 616 GB/s GDDR6, 11 GB); NVIDIA GeForce GTX 1080 Ti (11.3 TFLOP/s fp32, 484 GB/s
    GDDR5X, 11 GB); PCIe 3.0 x16: 15.75 GB/s raw, ~12 GB/s achieved, ~10 µs per copy. GPU efficiency
    0.35 (typical of untuned but scheduled kernels); CPU efficiency 0.005 reflects TVM 0.27's
    unscheduled CPU kernels (see DESIGN.md) and is printed with every estimate. GPU to GPU copies
    go peer to peer over the same PCIe switch. The CPU describes that testbed's Xeon, not this
    machine's CPU, so it is never measured here (``measure=False``): always the roofline estimate.
    """
    devices = [
        Device("cpu", {"kind": "llvm"}, "cpu:0", memory_bytes=192 * 2**30, peak_flops=2.69e12,
               bandwidth_Bps=140e9, efficiency=_UNSCHEDULED_CPU_EFFICIENCY, launch_overhead_s=5e-6, num_threads=20,
               measure=False),
        Device("rtx2080ti", {"kind": "cuda", "arch": "sm_75"}, "cuda:0", memory_bytes=11 * 2**30,
               peak_flops=13.4e12, bandwidth_Bps=616e9, efficiency=0.35, launch_overhead_s=5e-6),
        Device("gtx1080ti", {"kind": "cuda", "arch": "sm_61"}, "cuda:1", memory_bytes=11 * 2**30,
               peak_flops=11.3e12, bandwidth_Bps=484e9, efficiency=0.35, launch_overhead_s=5e-6),
    ]
    return Platform("paper-node", devices, _full_mesh(devices, lambda a, b: (10e-6, 12e9)),
                    description="CPU + RTX 2080 Ti + GTX 1080 Ti over PCIe 3.0 (DiviML-like testbed)")


def h200_node() -> Platform:
    """A host CPU plus one NVIDIA H200 (the GPU this project is lent), over PCIe Gen5 x16.

    Data sheets: H200 SXM 141 GB HBM3e at 4.8 TB/s, 67 TFLOP/s fp32 (non-tensor); host AMD EPYC
    9654 class (96 cores, AVX-512, 2.4 GHz: about 7.4 TFLOP/s fp32; 12 channels DDR5-4800 = 460
    GB/s); PCIe Gen5 x16 64 GB/s per direction raw, ~50 GB/s achieved.
    """
    devices = [
        Device("cpu", {"kind": "llvm"}, "cpu:0", memory_bytes=512 * 2**30, peak_flops=7.4e12,
               bandwidth_Bps=460e9, efficiency=_UNSCHEDULED_CPU_EFFICIENCY, launch_overhead_s=5e-6, num_threads=96),
        Device("h200", {"kind": "cuda", "arch": "sm_90"}, "cuda:0", memory_bytes=141e9,
               peak_flops=67e12, bandwidth_Bps=4.8e12, efficiency=0.35, launch_overhead_s=4e-6),
    ]
    return Platform("h200-node", devices, _full_mesh(devices, lambda a, b: (8e-6, 50e9)),
                    description="host CPU + one H200 over PCIe Gen5")


def gpu_k(count: int) -> Platform:
    """``count`` identical H100-class GPUs and nothing else, joined by NVLink-class links
    (fourth-generation NVLink: 450 GB/s per direction, ~3 µs), for pipeline benchmarks. Data sheet:
    H100 SXM 67 TFLOP/s fp32, 3.35 TB/s HBM3, 80 GB. Inputs start on ``gpu0``."""
    if not 1 <= count <= 1024:
        raise DivimlInputError(f"gpuK needs 1 <= K <= 1024, got {count}", field="platform")
    gpus = [Device(f"gpu{i}", {"kind": "cuda", "arch": "sm_90"}, f"cuda:{i}", memory_bytes=80 * 2**30,
                   peak_flops=67e12, bandwidth_Bps=3.35e12, efficiency=0.35, launch_overhead_s=4e-6)
            for i in range(count)]
    return Platform(f"gpu{count}", gpus, _full_mesh(gpus, lambda a, b: (3e-6, 450e9)),
                    description=f"{count} identical H100-class GPUs on NVLink-class links")


def cpu1() -> Platform:
    """This machine's CPU as one single-thread device: a server kind for several loopback RPC servers
    on this 2-core machine (``servers:2xcpu1``), one core each."""
    device = replace(cpu2().devices[0], name="cpu")
    return Platform("cpu1", [device], {}, description="this machine's CPU as one single-thread device (runs here)")


PRESETS: dict[str, Callable[[], Platform]] = {"cpu1": cpu1, "cpu2": cpu2, "paper-node": paper_node,
                                              "h200-node": h200_node}


def preset_names() -> list[str]:
    return list(PRESETS) + ["gpuK (K = 1..1024, e.g. gpu4)", "servers:NxKIND[+MxKIND] (e.g. servers:4xpaper-node)"]


def get_platform(spec: str) -> Platform:
    """A preset name (``cpu2``, ``paper-node``, ``h200-node``, ``gpu8``), several servers
    (``servers:4xpaper-node``, see ``servers.py``) or a platform JSON file."""
    if spec.startswith("servers:"):
        from .servers import servers_platform  # the multi-server builder lives there

        return servers_platform(spec)
    if spec in PRESETS:
        return PRESETS[spec]()
    match = re.fullmatch(r"gpu(\d+)", spec)
    if match:
        return gpu_k(int(match.group(1)))
    if spec.endswith(".json"):
        return Platform.load(spec)
    raise DivimlInputError(f"unknown platform '{spec}'", field="platform",
                           hint=f"use a preset ({', '.join(preset_names())}) or a platform .json file")
