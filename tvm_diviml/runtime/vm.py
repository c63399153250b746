"""Run a placed build in one Relax VM: weights uploaded once per device, then one call per inference."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from .. import __version__
from ..errors import DivimlInputError, raise_if_interrupted
from ..writes import write_text, written_whole
from .packing import PACKED, pack_array, packed_source, unpacked
from .placement import Placement, file_sha256, placement_path

log = logging.getLogger(__name__)

MAX_PLACEMENT_BYTES = 256 << 20  # a placement lists kernels and segments: far below this; read no more


def tvm_device(spec: str):
    """``"cuda:1"`` as a TVM device."""
    import tvm

    kind, index = spec.split(":")
    return tvm.device(kind, int(index))


_pool = threading.local()  # .size: the pool size this thread last configured
# The CPUs this process may use, read before TVM pins any thread (None where the OS cannot say).
_ALLOWED_CPUS = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def allow_every_core() -> None:
    """Let TVM's thread pools use every core this process may use. Without ``TVM_NUM_THREADS``, TVM
    0.27 halves the core count on x86 ("hyper-threading"): on this 2-core machine every pool had one
    thread, whatever ``set_threads`` asked, and a parallel loop ran on one core. A pool takes the
    figure when it is created (its thread's first parallel loop or ``set_threads``); a value the user
    set is kept."""
    os.environ.setdefault("TVM_NUM_THREADS", str(len(_ALLOWED_CPUS or ()) or os.cpu_count() or 1))


IDLE_SPIN_COUNT = 1000  # yields an idle TVM pool worker spins before it sleeps (TVM's default: 300,000)


def bound_idle_spinning() -> None:
    """Let an idle TVM pool worker spin ``IDLE_SPIN_COUNT`` yields before it sleeps (a value the user
    set is kept). Every thread that sizes its pool (``set_threads``) or runs a parallel loop gets a
    pool worker bound to a core; with TVM's default each one spins on that core for seconds, also after
    its thread has ended. Here eight short-lived threads left sixteen such workers taking a whole core
    for 3-10 s, and after the executor's calibration (~20 threads) the whole CPU's two-thread build of
    twin_branch ran 414-445 us a call against 130 us in a fresh process. The two-thread builds of
    twin_branch, mobilenet_v2 and resnet18 at 64x64 measured alike with 1,000 spins and the default."""
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(IDLE_SPIN_COUNT))


allow_every_core()
bound_idle_spinning()


def set_threads(num_threads: int | None) -> None:
    """The calling thread's TVM CPU thread pool size (TVM's pool is per calling thread; 0: TVM's default;
    None: leave it). A size the thread already has costs nothing (configuring costs ~17 us here).

    TVM also pins the calling thread to core 0 when it sizes the pool. Threads inherit their creator's
    pinning, so two device workers would then share one core; the calling thread is unpinned again
    (``pin_thread``: back to the CPUs the process may use)."""
    import tvm

    if num_threads is None or getattr(_pool, "size", None) == num_threads:
        return
    tvm.get_global_func("runtime.config_threadpool")(0, num_threads)
    pin_thread(None)
    _pool.size = num_threads


def usable_cores() -> list[int]:
    """The CPUs this process may use, in order (none where the OS cannot say or pin)."""
    return [] if _ALLOWED_CPUS is None else sorted(_ALLOWED_CPUS)


def worker_cores(placement: Placement) -> dict[str, list[int]]:
    """Disjoint cores for the workers of a placement's CPU devices, in device order, as many as each
    device has threads; empty when they do not all fit in the cores this process may use.

    Unpinned, the worker threads drift onto one core: the main thread wakes both, the scheduler puts
    a woken thread beside its waker, and load balancing takes milliseconds to move it (measured here:
    a two-branch split ran 1.9x slower than predicted in about half the processes, one worker's busy
    time doubled while the other idled)."""
    free = usable_cores()
    cpu = [
        (d, n or 1)
        for d, spec, n in zip(placement.devices, placement.tvm_devices, placement.num_threads, strict=True)
        if spec.startswith("cpu:")
    ]
    if sum(n for _, n in cpu) > len(free):
        return {}
    cores, taken = {}, 0
    for device, threads in cpu:
        cores[device] = free[taken : taken + threads]
        taken += threads
    return cores


def pin_thread(cores: list[int] | None) -> None:
    """Keep the calling thread on ``cores`` (all this process may use when None or empty)."""
    if _ALLOWED_CPUS is not None:
        os.sched_setaffinity(0, cores or _ALLOWED_CPUS)


def to_device(array, device):
    """A numpy array as a new TVM tensor on ``device``. On the CPU it is copied into a fresh 64-byte
    aligned buffer that TVM takes over without a second copy (~3 us against ~18 us for
    ``tvm.runtime.tensor`` here); never aliased, so a caller may reuse its array at once."""
    import tvm

    array = np.asarray(array)
    if device.dlpack_device_type() != _CPU or array.dtype.kind not in "fiuc" or array.size == 0:
        return tvm.runtime.tensor(array, device)
    return tvm.runtime.from_dlpack(_aligned_copy(array))


def to_numpy(tensor) -> np.ndarray:
    """A TVM tensor's values as numpy; a CPU tensor is shared, not copied (~0.4 us against ~8 us)."""
    if tensor.device.dlpack_device_type() == _CPU and str(tensor.dtype) in _SHARED_DTYPES:
        return np.from_dlpack(tensor)
    return tensor.numpy()


_CPU = 1  # DLDeviceType kDLCPU
_ALIGNMENT = 64  # what TVM requires of memory it adopts
_SHARED_DTYPES = {f"{kind}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)} | {
    "float16",
    "float32",
    "float64",
}


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    raw = np.empty(array.nbytes + _ALIGNMENT, dtype=np.uint8)
    offset = -raw.ctypes.data % _ALIGNMENT
    aligned = raw[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape)
    np.copyto(aligned, array)
    return aligned


_DEVICE_ID_OFFSET = 12  # bytes into a DLManagedTensor: DLTensor's data pointer, device type, then device id


def on_device(tensor, device):
    """``tensor`` as a tensor of ``device``: on the CPU, the same memory under that device's id (every CPU
    device of a machine addresses one memory, but a kernel refuses arguments of different device ids);
    elsewhere a copy. Replicas and batch-split copies on a machine's cores then read one copy of the
    weights: with one each, two single-thread replicas of mobilenet_v2 at 64x64 ran 1.18x as long per
    inference side by side as alone, with one between them as long as alone."""
    if tensor.device == device:
        return tensor
    if tensor.device.dlpack_device_type() != _CPU or device.dlpack_device_type() != _CPU:
        return tensor.copyto(device)
    import tvm

    capsule = tensor._to_dlpack()  # owns a reference to ``tensor``'s memory until the alias is freed
    address = _capsule_pointer(capsule, b"dltensor")
    ctypes.c_int32.from_address(address + _DEVICE_ID_OFFSET).value = device.index
    return tvm.runtime.from_dlpack(_Capsule(capsule, (_CPU, device.index)))


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


@dataclasses.dataclass
class _Capsule:
    """A DLPack capsule as the producer protocol hands it over."""

    capsule: Any
    device: tuple[int, int]

    def __dlpack__(self, **_):
        return self.capsule

    def __dlpack_device__(self):
        return self.device


def flatten(result) -> list:
    """A VM result (a tensor or nested tuples of tensors) as a flat list of tensors."""
    if hasattr(result, "numpy"):
        return [result]
    return [t for item in result for t in flatten(item)]


class PlacedExecutable:
    """A compiled placed module and its Placement; ``export``/``load`` keep them together."""

    def __init__(self, executable, placement: Placement):
        self.executable, self.placement = executable, placement

    def export(self, path: str) -> str:
        """Write the library to ``path`` and the placement beside it (``placement_path``), each whole or
        not at all; the placement names the library's SHA-256, so that a pair from two exports (one
        interrupted between its two files, or one file replaced) is refused when loaded."""
        import tvm

        with written_whole(path, "the exported library") as library:
            self.executable.export_library(library)
            placement = dataclasses.replace(
                self.placement,
                library_sha256=file_sha256(library),
                versions={"tvm": tvm.__version__, "tvm_diviml": __version__},
            )
            write_text(placement_path(path), placement.to_json(), "the exported placement")
        return path

    @classmethod
    def load(cls, path: str) -> PlacedExecutable:
        import tvm

        sidecar = placement_path(path)
        if not os.path.isfile(path) or not os.path.isfile(sidecar):
            raise DivimlInputError(
                f"no placed build at {path} (it needs {os.path.basename(sidecar)} beside it)",
                source=path,
                hint="write it with PlacedExecutable.export",
            )
        try:
            with open(sidecar, encoding="utf-8") as raw:
                placement = Placement.from_json(raw.read(MAX_PLACEMENT_BYTES))
        except (ValueError, TypeError) as error:  # not JSON, or written by another version
            raise DivimlInputError(
                f"{os.path.basename(sidecar)} is not a placement this version reads ({error})",
                source=sidecar,
                hint="export the build again",
            ) from None
        if placement.library_sha256 is None:
            log.warning("%s names no library fingerprint (an older export): its pairing is not checked", sidecar)
        elif placement.library_sha256 != file_sha256(path):
            raise DivimlInputError(
                f"the library and {os.path.basename(sidecar)} come from different exports (one was interrupted "
                "or replaced)",
                source=path,
                hint="export the build again",
            )
        built_with = placement.versions.get("tvm")
        if built_with and built_with != tvm.__version__:
            log.warning("%s was built with TVM %s; this is TVM %s", path, built_with, tvm.__version__)
        try:
            executable = tvm.runtime.load_module(path)
        except RuntimeError as error:  # e.g. CUDA code on a machine whose TVM has no CUDA runtime
            raise_if_interrupted()
            kinds = sorted({spec.split(":")[0] for spec in placement.tvm_devices})
            raise DivimlInputError(
                f"this machine's TVM cannot load the build for {', '.join(kinds)} ({error})",
                source=path,
                hint="load it where TVM has those devices' runtimes",
            ) from None
        return cls(executable, placement)

    def devices(self) -> list:
        return [tvm_device(d) for d in self.placement.tvm_devices]

    def missing_devices(self) -> list[str]:
        """The TVM devices this build needs that this machine lacks."""
        return [spec for spec, dev in zip(self.placement.tvm_devices, self.devices(), strict=True) if not dev.exist]

    def new_vm(self, devices: list | None = None):
        """A VM over this machine's devices of the placement, or over ``devices`` (a remote session's,
        in the placement's order, for an executable loaded there)."""
        from tvm.runtime.vm import VirtualMachine  # not tvm.relax: a runtime-only TVM has no compiler

        if devices is not None:
            return VirtualMachine(self.executable, devices)
        missing = self.missing_devices()
        if missing:
            raise DivimlInputError(
                f"this build needs device {missing[0]}, which this machine lacks",
                field="platform",
                hint="run it where the platform's devices exist, or plan for a platform of this machine (e.g. cpu2)",
            )
        return VirtualMachine(self.executable, self.devices())

    def upload_weights(
        self,
        vm,
        params: list[np.ndarray],
        devices: list | None = None,
        *,
        pack: Callable[[list], Any] = list,
        unpack: Callable[[Any], list] = flatten,
        prepared: dict[tuple[str, str], Any] | None = None,
    ) -> dict[tuple[str, str, str], Any]:
        """Every weight parameter on its device, once: (kind, id, device) -> tensor. The lifted weight
        preparation and the constants function run on the host first, then the packing of the weights
        that kernels read packed (``packing.py``); CPU devices read the host's tensors (``on_device``).
        ``devices``: as for ``new_vm``; ``pack``/``unpack``: how a list becomes a tuple argument and a
        tuple result a list (an RPC session passes no lists); ``prepared``: the host's tensors by
        (kind, id), filled here and reused by the next upload given it, of another build of the same
        model and weights (each replica's, each batch-split copy's)."""
        import tvm

        placement = self.placement
        if len(params) != placement.num_params:
            raise DivimlInputError(
                f"the model has {placement.num_params} weights, {len(params)} were given", field="params"
            )
        devices = devices or self.devices()
        host = devices[0]
        on_host = {} if prepared is None else prepared
        if any(unpacked(kind, wid) not in on_host for kind, wid, _ in placement.weight_params):
            host_params = [tvm.runtime.tensor(p, host) for p in params]
            if placement.transform_params:
                host_params = unpack(vm[placement.transform_params](pack(host_params)))
            on_host.update({("weight", wid): t for wid, t in zip(placement.weight_ids, host_params, strict=True)})
            if placement.constants_func:
                constants = unpack(vm[placement.constants_func]())
                on_host.update({("const", cid): t for cid, t in zip(placement.constant_ids, constants, strict=True)})
        for kind, wid, _ in placement.weight_params:
            if kind == PACKED and (kind, wid) not in on_host:
                source_kind, source, lanes = packed_source(wid)
                packed = pack_array(on_host[(source_kind, source)].numpy(), lanes)
                on_host[(kind, wid)] = tvm.runtime.tensor(packed, host)
        device_of = dict(zip(placement.devices, devices, strict=True))
        return {
            (kind, wid, device): on_device(on_host[(kind, wid)], device_of[device])
            for kind, wid, device in placement.weight_params
        }


class SingleVMRunner:
    """One Relax VM runs the whole placed function: kernels in order, copies between devices by TVM.

    Its ``stream`` is one call after another on the calling thread: a one-device build gains nothing
    from inputs in flight, and the concurrent executor's worker beside the calling thread cost the
    whole CPU's two-thread build of mobilenet_v2@64 15-20% a call (0.85 ms a call, 1.02 ms an
    inference in a stream: the driver's wake-ups take a core from one of the kernel's threads)."""

    def __init__(
        self,
        built: PlacedExecutable,
        params: list[np.ndarray],
        *,
        num_threads: int | None = None,
        prepared: dict | None = None,
    ):
        """``num_threads``: the calling thread's CPU pool during each call (default: the most the platform
        gives a device; TVM's default when it gives none); ``prepared``: as for ``upload_weights``."""
        self.built = built
        self.vm = built.new_vm()
        uploaded = built.upload_weights(self.vm, params, prepared=prepared)
        self.weights = [uploaded[tuple(key)] for key in built.placement.weight_params]
        self.host = built.devices()[0]
        self.num_threads = num_threads or max((n for n in built.placement.num_threads if n), default=None)
        self.entry = self.vm[built.placement.entry]
        self.device = (built.placement.kernel_devices or built.placement.devices)[0]  # where the kernels run
        self.busy_s: dict[str, float] = {}  # seconds in VM calls over the last ``stream``

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        args = self.arguments(inputs)
        set_threads(self.num_threads)
        return [to_numpy(t) for t in flatten(self.entry(*args))]

    def stream(self, inputs: Iterable[list[np.ndarray]], in_flight: int = 1) -> Iterator[list[np.ndarray]]:
        """Outputs per input, in input order, one inference at a time (``in_flight`` is accepted for
        the runners' common interface: one VM holds one input)."""
        busy = 0.0
        try:
            for arrays in inputs:
                began = time.perf_counter()
                outputs = self(arrays)
                busy += time.perf_counter() - began
                yield outputs
        finally:
            self.busy_s = {self.device: busy}

    def close(self) -> None:
        """Nothing to stop (no worker threads); for the runners' common interface."""

    def __enter__(self) -> SingleVMRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def arguments(self, inputs: list[np.ndarray]) -> list:
        """The entry's arguments: ``inputs`` on the host, then the uploaded weights."""
        placement = self.built.placement
        if len(inputs) != len(placement.inputs):
            raise DivimlInputError(
                f"the model takes {len(placement.inputs)} inputs "
                f"({', '.join(placement.inputs)}), {len(inputs)} were given",
                field="inputs",
            )
        return [to_device(x, self.host) for x in inputs] + self.weights

    def bare_call(self, inputs: list[np.ndarray]) -> Callable[[], Any]:
        """The VM call alone, inputs uploaded once and outputs left on the device: what TVM's own
        ``time_evaluator`` times, so a timing of it less one of the runner is the runner's Python work."""
        args = self.arguments(inputs)

        def call():
            set_threads(self.num_threads)
            return self.entry(*args)

        return call
