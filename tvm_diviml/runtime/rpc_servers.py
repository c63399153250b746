"""The RPC servers that ``diviml run --rpc`` runs on, and the driver's sessions with them.

A multi-server platform (``servers.py``) gets one TVM RPC server per server: given as ``HOST:PORT``
addresses in server order (``parse_addresses``), or started on the loopback (``start_local_servers``,
for ``--rpc local`` and the tests: each in its own process group, so that killing one kills its
sessions too, and each ending with the driver that started it). ``connect_servers`` opens one session
per server (``RemoteServer``). An RPC call has no timeout of its own, so whatever waits on a server
goes through ``within``, which names the server when it stops answering.

``python -m tvm_diviml.runtime.rpc_servers --host H --port P`` serves one server: TVM's own server
loop without ``tvm.exec.rpc_server``'s process pool, which needs ``cloudpickle`` (not a dependency of
TVM). Stock ``python -m tvm.exec.rpc_server --host H --port P`` serves as well where ``cloudpickle``
is installed. Only ``tvm.rpc`` is used, imported where needed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import DivimlInputError
from ..platform import Platform
from ..servers import server_devices
from .vm import allow_every_core, bound_idle_spinning

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
ADDRESS_HELP = "HOST:PORT,HOST:PORT (one RPC server per server of the platform, in server order) or local"
SERVER_START_TIMEOUT_S = 120.0  # importing TVM alone takes ~5 s here; several servers start at once


def server_command(host: str, port: int) -> str:
    """How a user starts one RPC server for this runtime."""
    return f"python -m tvm_diviml.runtime.rpc_servers --host {host} --port {port}"


# ---------------------------------------------------------------------- addresses
def parse_addresses(text: str, servers: int) -> list[tuple[str, int]]:
    """``HOST:PORT,HOST:PORT`` as (host, port) pairs; exactly ``servers`` of them."""
    parts = [part.strip() for part in text.split(",")] if text.strip() else []
    addresses = []
    for part in parts:
        match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):(\d+)", part)
        if not match:
            raise DivimlInputError(f"'{part}' is not HOST:PORT", field="--rpc", hint=f"write {ADDRESS_HELP}")
        port = int(match.group(2))
        if not 1 <= port <= 65535:
            raise DivimlInputError(
                f"port {port} of '{part}' is not between 1 and 65535", field="--rpc", hint=f"write {ADDRESS_HELP}"
            )
        addresses.append((match.group(1).strip("[]"), port))
    if len(addresses) != servers:
        raise DivimlInputError(
            f"{len(addresses)} address(es) given, the platform has {servers} server(s)",
            field="--rpc",
            hint=f"give {servers}: {ADDRESS_HELP}",
        )
    return addresses


def format_address(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---------------------------------------------------------------------- local servers
def serve(host: str, port: int, exit_with: int | None = None) -> None:
    """One RPC server on ``host:port`` (each session in a forked process), until killed, or until
    process ``exit_with`` ends (the driver that started it: no server outlives a killed test run)."""
    # the server tvm.exec.rpc_server runs, minus its process pool (which needs cloudpickle)
    from tvm.rpc.server import PopenRPCServerState

    allow_every_core()
    bound_idle_spinning()
    state = PopenRPCServerState(host, port, port + 1, silent=True)
    while state.thread.is_alive():
        state.thread.join(1.0)
        if exit_with is not None and not _alive(exit_with):
            os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalServers:
    """RPC servers started on the loopback by ``start_local_servers``: their addresses, and ``kill``."""

    def __init__(self):
        self.addresses: list[tuple[str, int]] = []
        self.processes: list[subprocess.Popen] = []  # the server at each address
        self._spawned: list[tuple[subprocess.Popen, Any]] = []

    def kill(self, index: int) -> None:
        """Kill server ``index`` and its session processes (its whole process group)."""
        _kill_group(self.processes[index])

    def close(self) -> None:
        for process, handle in self._spawned:
            _kill_group(process)
            handle.close()

    def _spawn(self) -> tuple[subprocess.Popen, int, Any]:
        port = _free_port()
        handle = tempfile.TemporaryFile()
        env = {**os.environ, "TVM_BIND_THREADS": "0"}  # never pin the sessions of all servers to one core
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, "--host", LOOPBACK, "--port", str(port), "--exit-with", str(os.getpid())],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self._spawned.append((process, handle))
        return process, port, handle

    def _start(self, count: int, deadline: float) -> None:
        """Start ``count`` servers at once (each imports TVM: seconds), then wait for each to accept."""
        pending = [self._spawn() for _ in range(count)]
        for index in range(count):
            for attempt in range(3):  # another program may take the free port first
                process, port, handle = pending[index]
                if _wait_listening(process, (LOOPBACK, port), deadline):
                    self.processes.append(process)
                    self.addresses.append((LOOPBACK, port))
                    break
                _kill_group(process)
                handle.seek(0)
                output = handle.read().decode(errors="replace").splitlines()
                if time.monotonic() >= deadline or attempt == 2:
                    raise RuntimeError(
                        f"local RPC server {index} ({LOOPBACK}:{port}) did not start in time: "
                        f"{output[-1].strip() if output else 'no output'}"
                    )
                log.warning("local RPC server on port %d failed (%s); trying another port", port, output[-1:])
                pending[index] = self._spawn()


def _kill_group(process: subprocess.Popen) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@contextlib.contextmanager
def start_local_servers(count: int, *, timeout_s: float = SERVER_START_TIMEOUT_S) -> Iterator[LocalServers]:
    """``count`` RPC servers on free loopback ports, each accepting before this yields; killed on exit."""
    if count < 1:
        raise DivimlInputError(f"needs at least one server, got {count}", field="servers")
    servers = LocalServers()
    try:
        servers._start(count, time.monotonic() + timeout_s)
        log.info("local RPC servers: %s", ", ".join(map(format_address, servers.addresses)))
        yield servers
    finally:
        servers.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def _wait_listening(process: subprocess.Popen, address: tuple[str, int], deadline: float) -> bool:
    """Whether the server accepts connections before ``deadline`` (False once it has exited)."""
    while time.monotonic() < deadline and process.poll() is None:
        try:
            socket.create_connection(address, timeout=1).close()  # the server drops a connection
            return True  # that sends no handshake
        except OSError:
            time.sleep(0.05)
    return False


# ---------------------------------------------------------------------- sessions
@dataclass
class RemoteServer:
    """One server of the platform and its RPC session.

    Every call through the session goes inside ``calling()``: TVM's ``CloseRPCConnection`` frees the
    session's channel without taking the lock its calls hold, so a thread still inside a call (one
    waiting on a hung server) would wake on freed memory; ``close`` leaves such a session open."""

    server: str  # "s0", "s1", ...
    host: str
    port: int
    session: Any  # tvm.rpc.RPCSession
    _guard: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _calls: int = field(default=0, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)
    _functions: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    @property
    def address(self) -> str:
        return format_address((self.host, self.port))

    @property
    def name(self) -> str:
        return f"server {self.server} ({self.address})"

    def device(self, spec: str):
        """``"cpu:1"`` as a device of this server."""
        kind, index = spec.split(":")
        return self.session.device(kind, int(index))

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """A call through the session is under way (refused once the session is closed)."""
        with self._guard:
            if self._closed:
                raise RuntimeError(f"the session with {self.name} is closed")
            self._calls += 1
        try:
            yield
        finally:
            with self._guard:
                self._calls -= 1

    def function(self, name: str):
        """The server's global function ``name``, fetched once: a remote function handle freed sends
        its server a message from a destructor that holds the interpreter lock (a hung server would
        freeze every thread of the driver)."""
        with self._guard:
            if name not in self._functions:
                self._functions[name] = self.session.get_function(name)
            return self._functions[name]

    def close(self, timeout_s: float = 10.0) -> bool:
        """End the session, so that the server takes its next one (a dead or hung server: nothing to
        do); False, and the session left open, while a call is still inside it (its server hung)."""
        with self._guard:
            if self._calls:
                log.warning("%s: a call is still waiting on it; its session is left open", self.name)
                return False
            if self._closed:
                return True
            self._closed = True
        with contextlib.suppress(Exception):
            within(timeout_s, f"closing {self.name}", self.session.get_function("CloseRPCConnection"))
        return True

    def pack(self, tensors: list, keep: Callable[[Any], Any] = lambda handle: handle) -> Any:
        """Tensors of this server as one tuple argument there (an RPC call takes no lists): through the
        server's tensor cache, which holds proper tensors. ``keep`` takes the remote handle made."""
        update = self.function("vm.builtin.tensor_cache.update")
        remove = self.function("vm.builtin.tensor_cache.remove")
        prefix = f"diviml_pack_{threading.get_ident()}"
        names = [f"{prefix}_{i}" for i in range(len(tensors))]
        for name, tensor in zip(names, tensors, strict=True):
            update(name, tensor, True)
        packed = keep(self.function("vm.builtin.param_array_from_cache")(prefix, len(tensors)))
        for name in names:
            remove(name)
        return packed

    def unpack(self, result, keep: Callable[[Any], Any] = lambda handle: handle) -> list:
        """A VM result of this server (a tensor, or a handle to nested tuples of them) as a flat list;
        ``keep`` takes every remote handle met on the way (so that none is freed in the caller)."""
        if hasattr(result, "numpy"):
            return [result]
        size, item = self.function("ffi.ArraySize"), self.function("ffi.ArrayGetItem")
        return [t for i in range(size(result)) for t in self.unpack(keep(item(result, i)), keep)]


def connect_servers(
    platform: Platform, addresses: list[tuple[str, int]], *, timeout_s: float = 60.0, session_timeout_s: float = 0.0
) -> dict[str, RemoteServer]:
    """One session per server of ``platform`` (addresses in server order). ``session_timeout_s`` > 0 lets
    each server end its session after that long (TVM's ``session_timeout``)."""
    from tvm import rpc

    servers = list(server_devices(platform))
    if len(addresses) != len(servers):
        raise DivimlInputError(
            f"{len(addresses)} address(es) given, platform '{platform.name}' has {len(servers)} server(s)",
            field="--rpc",
            hint=f"give {len(servers)}: {ADDRESS_HELP}",
        )
    remotes = {}
    for sid, (host, port) in zip(servers, addresses, strict=True):
        where = f"server {sid} ({format_address((host, port))})"
        try:
            session = within(
                timeout_s,
                f"connecting to {where}",
                lambda host=host, port=port: rpc.connect(host, port, session_timeout=session_timeout_s),
            )
        except TimeoutError as error:
            raise DivimlInputError(
                f"{error}: is it busy with another session, or stopped?",
                field="--rpc",
                hint="a TVM RPC server serves one session at a time",
            ) from None
        except RuntimeError as error:
            raise DivimlInputError(
                f"cannot connect to {where}: {last_line(error)}",
                field="--rpc",
                hint=f"start one there with `{server_command(host, port)}`, or use --rpc local",
            ) from None
        remotes[sid] = RemoteServer(sid, host, port, session)
    return remotes


def within(timeout_s: float, what: str, call: Callable[[], Any]) -> Any:
    """``call()`` in a helper thread, waited for at most ``timeout_s``: a remote that stopped answering
    (an RPC call has no timeout of its own) raises TimeoutError naming ``what``; the thread stays behind."""
    outcome: dict[str, Any] = {}

    def target():
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 (re-raised in the caller)
            outcome["error"] = error

    thread = threading.Thread(target=target, name=f"diviml-rpc {what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{what}: no answer within {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def last_line(error: BaseException) -> str:
    """The last non-empty line of an error's message: a TVM RPC error ends with the remote's own
    message, after the traceback it carries."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tvm_diviml.runtime.rpc_servers", description="one TVM RPC server for `diviml run --rpc`"
    )
    parser.add_argument("--host", default=LOOPBACK, help="address to listen on (default: the loopback only)")
    parser.add_argument("--port", type=int, default=9090)
    parser.add_argument("--exit-with", type=int, metavar="PID", help="stop when process PID ends")
    args = parser.parse_args(argv)
    serve(args.host, args.port, args.exit_with)


if __name__ == "__main__":
    main()
