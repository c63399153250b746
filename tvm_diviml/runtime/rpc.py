"""Run a placed model across several servers over TVM RPC, driven from one process.

Three modules, one job each: ``rpc_servers.py`` (the servers and one driver session with each),
``rpc_hops.py`` (what a tensor that crosses servers costs: two hops through the driver, measured and
priced into the platform the planner sees), and this module: the per-server build
(``ServersBuild``) and ``RpcRunner``, which uploads each build and its weights once, then runs the
*global* segment graph with the ``ConcurrentExecutor``, one worker per device whose calls go to that
device's server. TVM RPC has no server-to-server copy, so a crossing tensor goes through the driver
(two hops, counted and timed in ``HopStats``). ``RpcRunner.session`` is the stream driven by hand that
``runtime.replicas.ReplicatedRunner`` dispatches over, one runner per replica of a replicated plan.

Calls through one session are served one at a time, so the devices of one server do not overlap
here; servers do. A dead server fails the run at once, a hung one within ``timeout_s``, both as a
``ServerError`` naming the server, its address and the segment. Only ``tvm.runtime`` and ``tvm.rpc``
are used: no compiler. Design: docs/design.md#across-servers.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DivimlInputError, ServerFailure
from ..jsonio import read_json
from ..writes import write_text
from .executor import ConcurrentExecutor, SegmentCall, SegmentError, SegmentTimeoutError, StreamSession
from .placement import Placement, placement_path
from .rpc_servers import RemoteServer, last_line, within
from .vm import PlacedExecutable

# ---------------------------------------------------------------------- the build the driver runs
INDEX_FILE = "servers.json"  # a per-server export's index, beside one library per server


def server_library(directory: str, server: str) -> str:
    return os.path.join(directory, f"{server}.so")


def export_files(directory: str, servers: Iterable[str]) -> list[str]:
    """Every file a per-server export to ``directory`` may write (one library and placement per server
    that runs segments, and the index), for checks made before the build."""
    libraries = [server_library(directory, sid) for sid in servers]
    return [*libraries, *map(placement_path, libraries), os.path.join(directory, INDEX_FILE)]


@dataclass
class ServersBuild:
    """One PlacedExecutable per server that runs segments, and the driver's view of the whole: the
    global segment order (a topological order across servers) and each device's server."""

    builds: dict[str, PlacedExecutable]
    server_of: dict[str, str]  # device -> server
    segment_order: list[str]

    @property
    def segments(self) -> list[dict]:
        """Every server's segments (with a ``server`` key) in the global order."""
        position = {name: i for i, name in enumerate(self.segment_order)}
        found = [{**seg, "server": sid} for sid, built in self.builds.items() for seg in built.placement.segments]
        return sorted(found, key=lambda seg: position[seg["name"]])

    @property
    def placement(self) -> Placement:
        """One server's placement (inputs and outputs are the model's in every one)."""
        return next(iter(self.builds.values())).placement

    def export(self, directory: str) -> str:
        """``directory/SERVER.so`` (+ its placement) per server and ``directory/servers.json``, the index,
        written last: each file whole or not at all."""
        os.makedirs(directory, exist_ok=True)
        for sid, built in self.builds.items():
            built.export(server_library(directory, sid))
        index = {"servers": list(self.builds), "server_of": self.server_of, "segment_order": self.segment_order}
        write_text(os.path.join(directory, INDEX_FILE), json.dumps(index, indent=1), "the servers' index")
        return directory

    @classmethod
    def load(cls, directory: str) -> ServersBuild:
        path = os.path.join(directory, INDEX_FILE)
        index = read_json(path)  # bounded: a regular file of sane size
        try:
            servers, owner, order = index["servers"], index["server_of"], index["segment_order"]
        except (KeyError, TypeError) as error:
            raise DivimlInputError(
                f"not a per-server build ({error})", source=path, hint="write it with ServersBuild.export"
            ) from None
        return cls({sid: PlacedExecutable.load(server_library(directory, sid)) for sid in servers}, owner, order)


# ---------------------------------------------------------------------- running it
class ServerError(SegmentError, ServerFailure):
    """A server died, hung or failed while running a segment (or handing on a tensor)."""

    def __init__(self, message: str, *, server: str, address: str, segment: str, device: str, input_index: int):
        super().__init__(message, segment=segment, device=device, input_index=input_index)
        self.server, self.address = server, address


@dataclass
class HopStats:
    """Tensors the driver moved during the last run or stream: cross-server hops (two per tensor that
    crosses: download, upload), model inputs uploaded, outputs downloaded."""

    hops: int = 0
    hop_s: float = 0.0
    hop_bytes: float = 0.0
    input_uploads: int = 0
    input_s: float = 0.0
    output_downloads: int = 0
    output_s: float = 0.0
    by_pair: dict[str, int] = field(default_factory=dict)  # "s0->s1" -> tensors that crossed


_UPLOADS = itertools.count()


@dataclass(frozen=True)
class _Held:
    """A tensor on a server, as the executor passes it around."""

    tensor: Any
    server: str


class _RemoteOpFailed(RuntimeError):
    """A move's remote operation failed: ``server`` is the one to name."""

    def __init__(self, server: str, what: str, error: BaseException):
        super().__init__(f"{what}: {type(error).__name__}: {last_line(error)}")
        self.server = server


class RpcRunner:
    """``runner(inputs)`` / ``runner.stream(many, in_flight)`` across servers; numpy in and out.

    Uploads each server's library and weights (once per device) within ``timeout_s`` per server, then
    runs the global segment graph; ``busy_s`` (per device), ``server_busy_s`` and ``stats`` describe
    the last run or stream."""

    def __init__(
        self,
        build: ServersBuild,
        remotes: Mapping[str, RemoteServer],
        params: list[np.ndarray],
        *,
        timeout_s: float = 60.0,
    ):
        self.build, self.remotes, self.timeout_s = build, dict(remotes), timeout_s
        missing = [sid for sid in build.builds if sid not in self.remotes]
        if missing:
            raise DivimlInputError(f"no RPC session for server {missing[0]}", field="--rpc")
        self.stats = HopStats()
        self._lock = threading.Lock()
        self._alive: list = []  # remote objects of the run under way (_kept)
        self._remote_ops: dict[int, tuple[str, str]] = {}  # thread -> (server, what) of a move under way
        self._devices: dict[str, Any] = {}  # platform device -> its server's remote device
        self._functions: dict[str, Callable] = {}  # segment -> the remote VM function
        self._weights: dict[str, list] = {}
        with tempfile.TemporaryDirectory(prefix="diviml-rpc-") as scratch:
            for sid, built in build.builds.items():
                remote = self.remotes[sid]
                try:
                    within(
                        timeout_s,
                        f"setting up {remote.name}",
                        lambda built=built, remote=remote: self._set_up(built, remote, params, scratch),
                    )
                except (RuntimeError, TimeoutError) as error:  # TVM's errors are RuntimeErrors
                    raise ServerError(
                        f"{remote.name} failed while taking its build and weights: {last_line(error)}",
                        server=sid,
                        address=remote.address,
                        segment="",
                        device="",
                        input_index=-1,
                    ) from error
        calls = [
            SegmentCall(seg["name"], seg["device"], list(seg["reads"]), list(seg["writes"])) for seg in build.segments
        ]
        self.executor = ConcurrentExecutor(
            calls, build.placement.outputs, make_caller=self._make_caller, move=self._move, timeout_s=timeout_s
        )

    def _set_up(self, built: PlacedExecutable, remote: RemoteServer, params: list[np.ndarray], scratch: str) -> None:
        """Upload the library, load it, size the session's thread pool, upload the weights, make the VM."""
        # a fresh name per upload: the server's loader would reuse a library already loaded under that name
        path = built.export(os.path.join(scratch, f"diviml-{remote.server}-{next(_UPLOADS)}.so"))
        with remote.calling():
            remote.session.upload(path)
            placement = built.placement
            loaded = PlacedExecutable(remote.session.load_module(os.path.basename(path)), placement)
            threads = max((n for n in placement.num_threads if n), default=None)
            if threads:  # the session serves every call from one thread: size its pool
                remote.function("runtime.config_threadpool")(0, threads)
            devices = [remote.device(spec) for spec in placement.tvm_devices]
            vm = loaded.new_vm(devices)
            uploaded = loaded.upload_weights(
                vm,
                params,
                devices,
                pack=lambda tensors: remote.pack(tensors, keep=self._kept),
                unpack=lambda result: remote.unpack(result, keep=self._kept),
            )
        for seg in placement.segments:
            self._functions[seg["name"]] = vm[seg["name"]]
            self._weights[seg["name"]] = [uploaded[tuple(key)] for key in seg["weights"]]
        self._devices.update(zip(placement.devices, devices, strict=True))

    def _make_caller(self, device: str):
        server = self.build.server_of[device]
        functions, weights, remote = self._functions, self._weights, self.remotes[server]

        def call(segment: str, args: list) -> list:
            with remote.calling():
                results = self._kept(functions[segment](*(held.tensor for held in args), *weights[segment]))
                tensors = remote.unpack(results, keep=self._kept)
            return [self._kept(_Held(tensor, server)) for tensor in tensors]

        return call

    def _move(self, value, device: str) -> _Held:
        import tvm

        target, server = self._devices[device], self.build.server_of[device]
        if isinstance(value, _Held) and value.server == server:
            if value.tensor.device == target:
                return value
            with self._waiting_on(server, f"copying a tensor to {device}"):
                return self._kept(_Held(value.tensor.copyto(target), server))
        began = time.perf_counter()
        if not isinstance(value, _Held):  # a model input, from the driver
            with self._waiting_on(server, f"uploading a model input to {device}"):
                moved = self._kept(_Held(tvm.runtime.tensor(np.asarray(value), target), server))
            with self._lock:
                self.stats.input_uploads += 1
                self.stats.input_s += time.perf_counter() - began
            return moved
        with self._waiting_on(value.server, f"downloading a tensor for {device}"):
            array = value.tensor.numpy()
        with self._waiting_on(server, f"uploading a tensor to {device}"):
            moved = self._kept(_Held(tvm.runtime.tensor(array, target), server))
        with self._lock:
            stats = self.stats
            stats.hops += 2
            stats.hop_s += time.perf_counter() - began
            stats.hop_bytes += 2 * array.nbytes
            pair = f"{value.server}->{server}"
            stats.by_pair[pair] = stats.by_pair.get(pair, 0) + 1
        return moved

    @contextlib.contextmanager
    def _waiting_on(self, server: str, what: str):
        """A remote operation outside segment calls: a failure blames ``server``, and while it runs a
        stall names it (the executor only knows the segment calls it is running)."""
        thread = threading.get_ident()
        with self._lock:
            self._remote_ops[thread] = (server, what)
        try:
            with self.remotes[server].calling():
                yield
        except Exception as error:
            raise _RemoteOpFailed(server, what, error) from error
        finally:
            with self._lock:
                self._remote_ops.pop(thread, None)

    def _inputs(self, arrays: list[np.ndarray]) -> dict:
        names = self.build.placement.inputs
        if len(arrays) != len(names):
            raise DivimlInputError(
                f"the model takes {len(names)} inputs ({', '.join(names)}), {len(arrays)} were given", field="inputs"
            )
        return {f"input:{name}": np.asarray(a) for name, a in zip(names, arrays, strict=True)}

    def _outputs(self, values: list) -> list[np.ndarray]:
        began = time.perf_counter()
        out = []
        for value in values:
            try:
                if isinstance(value, _Held):
                    with self.remotes[value.server].calling():
                        out.append(value.tensor.numpy())
                else:
                    out.append(np.asarray(value))
            except Exception as error:  # noqa: BLE001 (named like a segment's failure)
                raise self._server_error(
                    SegmentError(f"downloading an output failed: {error}", segment="", device="", input_index=-1),
                    value.server,
                ) from error
        with self._lock:
            self.stats.output_downloads += len(values)
            self.stats.output_s += time.perf_counter() - began
        return out

    def _kept(self, remote):
        """``remote`` (a remote object) kept alive until the run or stream ends. Freeing a remote object
        sends its server a message from the object's destructor, which holds the interpreter lock: a
        free that waits on a hung server's session froze the driver, its timeouts included."""
        with self._lock:
            self._alive.append(remote)
        return remote

    def _finished(self, failed: bool) -> None:
        """After a run or stream: free what it kept, here, with nothing in flight; after a failure keep
        everything remote forever (a server may be hung: freeing would freeze the process)."""
        if failed:
            _never_free((self, self._alive))
        self._alive = []

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self.stats = HopStats()
        try:
            outputs = self._outputs(self.executor.run(self._inputs(inputs)))
        except SegmentError as error:
            self._finished(failed=True)
            raise self._server_error(error) from error
        self._finished(failed=False)
        return outputs

    def stream(self, inputs: Iterable[list[np.ndarray]], in_flight: int = 2) -> Iterator[list[np.ndarray]]:
        """Outputs per input, in input order, with up to ``in_flight`` inputs in the servers at once."""
        self.stats = HopStats()
        results = self.executor.stream((self._inputs(x) for x in inputs), in_flight=in_flight)
        failed = False
        try:
            for outputs in results:
                yield self._outputs(outputs)
        except SegmentError as error:
            failed = True
            raise self._server_error(error) from error
        finally:
            results.close()
            self._finished(failed)

    def session(self) -> RpcSession:
        """A stream driven by hand, numpy in and out (``ConcurrentExecutor.session``), its failures
        named as ``stream`` names them: what ``ReplicatedRunner`` drives, one replica per runner."""
        self.stats = HopStats()
        return RpcSession(self, self.executor.session())

    def _server_error(self, error: SegmentError, server: str | None = None) -> ServerError:
        """``error`` restated with the server to blame: the one a download failed from, else (a stall)
        the one a hop still out waits on, else the segment's."""
        if isinstance(error, ServerError):
            return error
        detail = str(error)
        if server is None and isinstance(error.__cause__, _RemoteOpFailed):
            server = error.__cause__.server
        if server is None and isinstance(error, SegmentTimeoutError):  # a stall: a hop still out names the
            with self._lock:  # server it waits on (not the reader's)
                server, what = next(iter(self._remote_ops.values()), (None, ""))
            detail += f"; {what} waits on it" if what else ""
        if server is None:
            server = self.build.server_of.get(error.device)
        remote = self.remotes.get(server) if server else None
        where = remote.name if remote else "an unknown server"
        if isinstance(error, SegmentTimeoutError):
            return ServerTimeoutError(
                f"{where} did not answer: {detail} (is it stopped or overloaded?)",
                server=server or "",
                address=remote.address if remote else "",
                segment=error.segment,
                device=error.device,
                input_index=error.input_index,
            )
        return ServerError(
            f"{where} failed: {detail} (is its process alive and the network up?)",
            server=server or "",
            address=remote.address if remote else "",
            segment=error.segment,
            device=error.device,
            input_index=error.input_index,
        )

    @property
    def busy_s(self) -> dict[str, float]:
        return self.executor.busy_s

    @property
    def server_busy_s(self) -> dict[str, float]:
        """Seconds inside segment calls per server (its devices' busy time added up)."""
        out: dict[str, float] = {}
        for device, seconds in self.executor.busy_s.items():
            server = self.build.server_of[device]
            out[server] = out.get(server, 0.0) + seconds
        return out

    def close(self) -> None:
        self.executor.close()

    def __enter__(self) -> RpcRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RpcSession:
    """``RpcRunner.session``: ``submit(arrays) -> ticket``, ``done(ticket)``, ``collect(ticket) -> arrays``; ``close``
    frees what the stream kept on the servers, unless it failed (``RpcRunner._finished``)."""

    def __init__(self, runner: RpcRunner, session: StreamSession):
        self._runner, self._session, self._failed = runner, session, False

    def submit(self, arrays: list[np.ndarray]):
        return self._session.submit(self._runner._inputs(arrays))

    def collect(self, ticket) -> list[np.ndarray]:
        try:
            return self._runner._outputs(self._session.collect(ticket))
        except SegmentError as error:
            self._failed = True
            raise self._runner._server_error(error) from error

    def done(self, ticket) -> bool:
        return self._session.done(ticket)

    def close(self) -> None:
        self._session.close()
        self._runner._finished(self._failed)


def _never_free(value) -> None:
    """A reference that nothing releases: ``value`` and all it holds are never freed, not even when the
    interpreter ends (a free would wait on a hung server's session with the interpreter lock held)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(value))


class ServerTimeoutError(ServerError, TimeoutError):
    """A server did not answer within ``timeout_s``."""
