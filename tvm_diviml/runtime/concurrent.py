"""The placed build's segment functions run concurrently: one worker thread and one VM per device.

``ConcurrentExecutor`` does the scheduling; this module adapts it to TVM: each worker creates its own
``VirtualMachine`` over the shared executable, sizes its thread's CPU pool from the platform, and
calls segment functions with the device's copies of the weights appended; tensors read on another
device are copied by TVM (``Tensor.copyto``). The workers of CPU devices are pinned to cores of their
own where they fit (``vm.worker_cores``).

While a runner is open, Python's thread switch interval is 0.2 ms instead of 5 ms: a worker woken to
start its segment otherwise waited up to 5 ms for the interpreter lock (measured here: one device's
branch started 3.3 ms after the other's), which cost a third of the concurrency of two branches.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator

import numpy as np

from ..errors import DivimlInputError
from .executor import ConcurrentExecutor, SegmentCall, StreamSession
from .vm import PlacedExecutable, flatten, pin_thread, set_threads, to_device, to_numpy, tvm_device, worker_cores

SWITCH_INTERVAL_S = 2e-4


class ConcurrentRunner:
    """``runner(inputs)`` for one inference, ``runner.stream(many, in_flight)`` for a stream; numpy in and out."""

    def __init__(
        self,
        built: PlacedExecutable,
        params: list[np.ndarray],
        *,
        timeout_s: float = 600.0,
        prepared: dict | None = None,
    ):
        """``prepared``: the host's weights of another build of the model, shared (``upload_weights``)."""
        placement = built.placement
        if not placement.segments:
            raise DivimlInputError("this build has no segment functions", hint="rebuild it with this version")
        self.built = built
        loader = built.new_vm()
        uploaded = built.upload_weights(loader, params, prepared=prepared)
        self._weights = {seg["name"]: [uploaded[tuple(key)] for key in seg["weights"]] for seg in placement.segments}
        self._threads = dict(zip(placement.devices, placement.num_threads, strict=True))
        self._devices = dict(zip(placement.devices, placement.tvm_devices, strict=True))
        self._cores = worker_cores(placement)
        self.host = built.devices()[0]
        calls = [
            SegmentCall(seg["name"], seg["device"], list(seg["reads"]), list(seg["writes"]))
            for seg in placement.segments
        ]
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, SWITCH_INTERVAL_S))
        self.executor = ConcurrentExecutor(
            calls, placement.outputs, make_caller=self._make_caller, move=self._move, timeout_s=timeout_s
        )

    def _make_caller(self, device: str):
        set_threads(self._threads[device])
        if device in self._cores:
            pin_thread(self._cores[device])
        vm = self.built.new_vm()
        functions = {seg["name"]: vm[seg["name"]] for seg in self.built.placement.segments if seg["device"] == device}
        weights = self._weights

        def call(segment: str, args: list) -> list:
            return flatten(functions[segment](*args, *weights[segment]))

        return call

    def _move(self, value, device: str):
        target = tvm_device(self._devices[device])
        if value.device == target:
            return value
        return value.copyto(target)

    def _inputs(self, arrays: list[np.ndarray]) -> dict:
        names = self.built.placement.inputs
        if len(arrays) != len(names):
            raise DivimlInputError(
                f"the model takes {len(names)} inputs ({', '.join(names)}), {len(arrays)} were given", field="inputs"
            )
        return {f"input:{name}": to_device(a, self.host) for name, a in zip(names, arrays)}

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return [to_numpy(t) for t in self.executor.run(self._inputs(inputs))]

    def stream(self, inputs: Iterable[list[np.ndarray]], in_flight: int = 2) -> Iterator[list[np.ndarray]]:
        """Outputs per input, in input order, with up to ``in_flight`` inputs in the devices at once."""
        for outputs in self.executor.stream((self._inputs(x) for x in inputs), in_flight=in_flight):
            yield [to_numpy(t) for t in outputs]

    def session(self) -> RunnerSession:
        """A stream driven by hand, numpy in and out (``ConcurrentExecutor.session``)."""
        return RunnerSession(self, self.executor.session())

    @property
    def busy_s(self) -> dict[str, float]:
        return self.executor.busy_s

    def close(self) -> None:
        self.executor.close()
        sys.setswitchinterval(self._switch_interval)

    def __enter__(self) -> ConcurrentRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RunnerSession:
    """``ConcurrentRunner.session``: ``submit(arrays) -> ticket``, ``done(ticket)``, ``collect(ticket) -> arrays``."""

    def __init__(self, runner: ConcurrentRunner, session: StreamSession):
        self._runner, self._session = runner, session

    def submit(self, arrays: list[np.ndarray]):
        return self._session.submit(self._runner._inputs(arrays))

    def collect(self, ticket) -> list[np.ndarray]:
        return [to_numpy(t) for t in self._session.collect(ticket)]

    def done(self, ticket) -> bool:
        return self._session.done(ticket)

    def close(self) -> None:
        self._session.close()
