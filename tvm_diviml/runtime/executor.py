"""Run a model's per-device segments concurrently: one long-lived worker thread per device.

Written against two injected callables, so it runs (and is tested) without TVM:
``make_caller(device)`` is called once inside the device's worker thread and returns
``call(segment_name, args) -> list`` (one TVM VirtualMachine per thread, say), and
``move(value, device)`` copies a tensor to a device. Calls into compiled code release the GIL,
so the devices' segments really overlap.

Scheduling is dataflow: among its device's tasks (one per segment per input) whose tensors have all
been made, a worker runs the one of the earliest input, then the earliest segment. So a device graph
with a cycle still pipelines, and nothing deadlocks. ``run``/``stream`` give up once nothing has
progressed for ``timeout_s``, naming the hung segment and device; the first failure of a batch stops
its remaining work and is re-raised in the caller.

Why nothing deadlocks, and what the simulator charges for it: docs/design.md#the-executor-model.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import DivimlInputError

log = logging.getLogger(__name__)

Caller = Callable[[str, list], list]


@dataclass
class SegmentCall:
    """One segment as the executor calls it: the tensor keys it takes and the keys of what it returns."""

    name: str
    device: str
    reads: list[str]
    writes: list[str]


class SegmentError(RuntimeError):
    """A segment's call, or a move of one of its inputs, failed; ``__cause__`` holds the original error."""

    def __init__(self, message: str, *, segment: str, device: str, input_index: int):
        super().__init__(message)
        self.segment, self.device, self.input_index = segment, device, input_index


class SegmentTimeoutError(SegmentError, TimeoutError):
    """Nothing progressed for ``timeout_s``: a call hangs, or a segment waited on one that does."""


class _Batch:
    """One ``run`` or ``stream``: its first failure, whether its caller is gone, and where time went."""

    def __init__(self, devices: list[str], segments: list[SegmentCall]):
        self.error: SegmentError | None = None
        self.abandoned = False
        self.busy_s = dict.fromkeys(devices, 0.0)
        self.move_s = dict.fromkeys(devices, 0.0)
        self.segment_s = dict.fromkeys((seg.name for seg in segments), 0.0)


class _InputRun:
    """The tensors of one input: ``values[(key, device)]``, device None for a model input as given."""

    def __init__(self, batch: _Batch, index: int, values: dict, readers: Counter):
        self.batch, self.index, self.values = batch, index, values
        self.unserved = Counter(readers)  # key -> reads (plus one if an output) still to come
        self.segments_done = 0


_STOPPED = object()


class ConcurrentExecutor:
    """Runs ``segments`` (in a topological order) concurrently, one worker thread per device.

    ``run(inputs)`` returns the values of ``outputs``, as their segments returned them (on their
    devices); ``stream(inputs)`` does the same for many inputs with several in flight. Keys that
    no segment writes are model inputs: every input dict must give exactly those. ``busy_s``,
    ``move_s`` (per device) and ``segment_s`` (per segment, summed over inputs) describe the last
    run or stream.
    """

    def __init__(
        self,
        segments: list[SegmentCall],
        outputs: list[str],
        *,
        make_caller: Callable[[str], Caller],
        move: Callable[[Any, str], Any],
        timeout_s: float = 600.0,
    ):
        self.segments = list(segments)
        self.outputs = list(outputs)
        self.timeout_s = timeout_s
        self._producer = _check_segments(self.segments)
        self.devices = list(dict.fromkeys(seg.device for seg in self.segments))
        self.input_keys = list(
            dict.fromkeys(key for seg in self.segments for key in seg.reads if key not in self._producer)
        )
        self.input_keys += [
            key for key in dict.fromkeys(self.outputs) if key not in self._producer and key not in self.input_keys
        ]
        self._readers = Counter(key for seg in self.segments for key in seg.reads) + Counter(self.outputs)
        self._move = move
        # one lock; each worker and the callers wait on their own condition, so that a segment's end wakes
        # only the workers whose tasks it may have made ready (waking every thread cost ~30 us a segment)
        self._lock = threading.Lock()
        self._wakeup = {device: threading.Condition(self._lock) for device in self.devices}
        self._finished = threading.Condition(self._lock)
        self._wakes = _consumer_devices(self.segments)
        self._starters = {seg.device for seg in self.segments if not any(key in self._producer for key in seg.reads)}
        self._last_progress = time.monotonic()
        self._running: dict[str, tuple[SegmentCall, _InputRun, float]] = {}
        self._moving: dict[str, tuple[SegmentCall, str, _InputRun, float]] = {}  # device -> move under way
        self._closed = False
        self._batch = _Batch(self.devices, self.segments)
        self._pending: dict[str, list[tuple[_InputRun, int]]] = {device: [] for device in self.devices}
        self._threads = [
            threading.Thread(target=self._work, args=(device, make_caller), name=f"diviml-{device}", daemon=True)
            for device in self.devices
        ]
        for thread in self._threads:
            thread.start()
        log.debug("executor: %d segments on %d devices", len(self.segments), len(self.devices))

    # ------------------------------------------------------------------ public
    def run(self, inputs: Mapping[str, Any]) -> list:
        """The outputs for one input."""
        results = self.stream([inputs], in_flight=1)
        try:
            return next(results)
        finally:
            results.close()

    def stream(self, inputs: Iterable[Mapping[str, Any]], in_flight: int = 2) -> Iterator[list]:
        """The outputs for each input, in input order, with up to ``in_flight`` inputs started and not yet yielded.

        ``inputs`` is consumed lazily: an input is taken only when a slot is free.
        """
        if not isinstance(in_flight, int) or in_flight < 1:
            raise DivimlInputError(f"must be a positive integer, got {in_flight!r}", field="in_flight")
        self._check_open()
        return self._stream(iter(inputs), in_flight)

    @property
    def busy_s(self) -> dict[str, float]:
        """Seconds each device spent inside segment calls during the last run or stream."""
        with self._lock:
            return dict(self._batch.busy_s)

    @property
    def move_s(self) -> dict[str, float]:
        """Seconds each device's worker spent moving tensors to its device during the last run or stream."""
        with self._lock:
            return dict(self._batch.move_s)

    @property
    def segment_s(self) -> dict[str, float]:
        """Seconds inside each segment's calls during the last run or stream, summed over inputs."""
        with self._lock:
            return dict(self._batch.segment_s)

    def close(self) -> None:
        """Stop the workers and join them (up to ``timeout_s``): they abandon queued work and end.

        A worker inside a call that already ran past ``timeout_s`` is hung: it is not waited for,
        and stays behind as a daemon thread.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._notify_everyone()
            now = time.monotonic()
            hung = {
                f"diviml-{device}"
                for device, (_, _, started) in self._running.items()
                if now - started >= self.timeout_s
            }
        deadline = time.monotonic() + self.timeout_s
        for thread in self._threads:
            if thread.name not in hung:
                thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [thread.name for thread in self._threads if thread.is_alive()]
        if stuck:
            log.warning("executor closed, but %s did not stop (inside a call)", ", ".join(stuck))

    def __enter__(self) -> ConcurrentExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def session(self) -> StreamSession:
        """A stream driven by hand: ``submit`` inputs one by one and ``collect`` each one's outputs in
        any order (what a dispatcher over several executors needs); it replaces the last run or stream
        as the one ``busy_s`` describes."""
        self._check_open()
        return StreamSession(self)

    # ------------------------------------------------------------------ caller side
    def _stream(self, inputs: Iterator[Mapping[str, Any]], in_flight: int) -> Iterator[list]:
        pending: deque[_InputRun] = deque()
        with self.session() as session:
            while True:
                while len(pending) < in_flight:
                    values = next(inputs, _STOPPED)
                    if values is _STOPPED:
                        break
                    pending.append(session.submit(values))
                if not pending:
                    return
                yield session.collect(pending.popleft())

    def _submit(self, batch: _Batch, index: int, inputs: Mapping[str, Any]) -> _InputRun:
        if not isinstance(inputs, Mapping):
            raise DivimlInputError(
                f"input {index} must be a dict {{key: value}}, got {type(inputs).__name__}", field="inputs"
            )
        missing = [key for key in self.input_keys if key not in inputs]
        unknown = [key for key in inputs if key not in self.input_keys]
        if missing or unknown:
            raise DivimlInputError(
                f"input {index} lacks {missing} / has unknown {unknown}",
                field="inputs",
                hint=f"give exactly the model inputs {self.input_keys}",
            )
        run = _InputRun(batch, index, {(key, None): inputs[key] for key in self.input_keys}, self._readers)
        with self._lock:
            self._check_open()
            for position, seg in enumerate(self.segments):
                self._pending[seg.device].append((run, position))
            self._progressed()
            for device in self._starters:
                self._wakeup[device].notify()
        return run

    def _collect(self, run: _InputRun) -> list:
        with self._lock:
            finished = self._wait(self._finished, lambda: run.segments_done == len(self.segments) or self._stopped(run))
            if not finished:
                self._fail(run.batch, self._stall_error(run))
            if run.batch.error is not None:
                raise run.batch.error
            self._check_open()
            return [run.values[(key, self._origin(key))] for key in self.outputs]

    def _stall_error(self, run: _InputRun) -> SegmentTimeoutError:
        now = time.monotonic()
        running = [(seg, started) for seg, other, started in self._running.values() if other.batch is run.batch]
        moving = [(seg, key, started) for seg, key, other, started in self._moving.values() if other.batch is run.batch]
        if not running and moving:
            seg, key, started = min(moving, key=lambda item: item[2])
            return SegmentTimeoutError(
                f"segment '{seg.name}' on device '{seg.device}' has waited {now - started:.1f} s "
                f"for tensor '{key}' to be moved to it (timeout_s={self.timeout_s})",
                segment=seg.name,
                device=seg.device,
                input_index=run.index,
            )
        if not running:
            return SegmentTimeoutError(
                f"input {run.index}: nothing progressed for {self.timeout_s} s and no segment is running",
                segment="",
                device="",
                input_index=run.index,
            )
        seg, started = min(running, key=lambda item: item[1])
        return SegmentTimeoutError(
            f"segment '{seg.name}' on device '{seg.device}' has been running for "
            f"{now - started:.1f} s (timeout_s={self.timeout_s}) with nothing else "
            f"progressing",
            segment=seg.name,
            device=seg.device,
            input_index=run.index,
        )

    # ------------------------------------------------------------------ worker side
    def _work(self, device: str, make_caller: Callable[[str], Caller]) -> None:
        try:
            caller, startup_error = make_caller(device), None
        except Exception as error:  # noqa: BLE001 (reported to every run that needs this device)
            caller, startup_error = None, error
        while (task := self._next_task(device)) is not None:
            run, position = task
            seg = self.segments[position]
            if startup_error is not None:
                self._fail_segment(run, seg, f"could not create the caller for device '{device}'", startup_error)
                continue
            self._run_segment(caller, seg, run)

    def _next_task(self, device: str) -> tuple[_InputRun, int] | None:
        """The device's ready task of the earliest input and segment; waits for one; None once closed."""
        with self._lock:
            while not self._closed:
                pending = self._pending[device]
                pending[:] = [task for task in pending if not self._stopped(task[0])]
                ready = [
                    task
                    for task in pending
                    if all((key, self._origin(key)) in task[0].values for key in self.segments[task[1]].reads)
                ]
                if ready:
                    task = min(ready, key=lambda t: (t[0].index, t[1]))
                    pending.remove(task)
                    return task
                self._wakeup[device].wait()
            return None

    def _run_segment(self, caller: Caller, seg: SegmentCall, run: _InputRun) -> None:
        """Run one ready task (nothing happens when its batch stopped: failed, abandoned or closed)."""
        args = []
        for key in seg.reads:
            value = self._fetch(seg, key, run)
            if value is _STOPPED:
                return
            args.append(value)
        with self._lock:
            if self._stopped(run):
                return
            started = self._progressed()
            self._running[seg.device] = (seg, run, started)
        try:
            results = list(caller(seg.name, args))
            if len(results) != len(seg.writes):
                raise ValueError(f"returned {len(results)} values, expected {len(seg.writes)} {seg.writes}")
        except Exception as error:  # noqa: BLE001 (re-raised in the caller of run/stream)
            self._fail_segment(run, seg, "failed", error)
            return
        finally:
            with self._lock:
                self._running.pop(seg.device, None)
        del args
        with self._lock:
            elapsed = self._progressed() - started
            run.batch.busy_s[seg.device] += elapsed
            run.batch.segment_s[seg.name] += elapsed
            for key, value in zip(seg.writes, results):
                if self._readers[key]:
                    run.values[(key, seg.device)] = value
            for key in seg.reads:
                self._release(run, key)
            run.segments_done += 1
            for device in self._wakes[seg.name]:
                self._wakeup[device].notify()
            if run.segments_done == len(self.segments):
                self._finished.notify_all()

    def _fetch(self, seg: SegmentCall, key: str, run: _InputRun) -> Any:
        """The tensor ``key`` (already made: the task is ready) on the segment's device, moved there once per input."""
        origin = self._origin(key)
        with self._lock:
            if self._stopped(run):
                return _STOPPED
            if (key, seg.device) in run.values:
                return run.values[(key, seg.device)]
            source = run.values[(key, origin)]
            started = self._progressed()
            self._moving[seg.device] = (seg, key, run, started)
        # the copy runs outside the lock, so that the other workers go on meanwhile
        try:
            moved = self._move(source, seg.device)
        except Exception as error:  # noqa: BLE001 (re-raised in the caller of run/stream)
            self._fail_segment(run, seg, f"could not move tensor '{key}' to the device", error)
            return _STOPPED
        finally:
            with self._lock:
                self._moving.pop(seg.device, None)
        with self._lock:
            run.batch.move_s[seg.device] += self._progressed() - started
            run.values[(key, seg.device)] = moved
        return moved

    # ------------------------------------------------------------------ shared state (under self._lock)
    def _wait(self, condition: threading.Condition, predicate: Callable[[], bool]) -> bool:
        """Wait on ``condition`` until ``predicate`` holds; False once nothing has progressed for ``timeout_s``."""
        while not predicate():
            remaining = self._last_progress + self.timeout_s - time.monotonic()
            if remaining <= 0:
                return False
            condition.wait(remaining)
        return True

    def _notify_everyone(self) -> None:
        for condition in (*self._wakeup.values(), self._finished):
            condition.notify_all()

    def _progressed(self) -> float:
        self._last_progress = time.monotonic()
        return self._last_progress

    def _release(self, run: _InputRun, key: str) -> None:
        """One read of ``key`` is done; after the last, every copy of it is dropped."""
        run.unserved[key] -= 1
        if run.unserved[key] == 0:
            for device in (None, *self.devices):
                run.values.pop((key, device), None)

    def _stopped(self, run: _InputRun) -> bool:
        return run.batch.error is not None or run.batch.abandoned or self._closed

    def _fail_segment(self, run: _InputRun, seg: SegmentCall, what: str, error: BaseException) -> None:
        failure = SegmentError(
            f"segment '{seg.name}' on device '{seg.device}' {what} (input {run.index}): "
            f"{type(error).__name__}: {error}",
            segment=seg.name,
            device=seg.device,
            input_index=run.index,
        )
        failure.__cause__ = error
        with self._lock:
            self._fail(run.batch, failure)

    def _fail(self, batch: _Batch, error: SegmentError) -> None:
        if batch.error is None:
            batch.error = error
            log.debug("executor: %s", error)
        self._notify_everyone()

    def _origin(self, key: str) -> str | None:
        producer = self._producer.get(key)
        return producer.device if producer else None

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the executor is closed; make a new ConcurrentExecutor")


class StreamSession:
    """One stream of an executor, driven by hand (``ConcurrentExecutor.session``): ``submit(inputs)``
    starts an input at once and returns its ticket, ``collect(ticket)`` waits for its outputs.
    ``close`` (or leaving the ``with``) abandons whatever was submitted and not collected."""

    def __init__(self, executor: ConcurrentExecutor):
        self._executor = executor
        self._batch = _Batch(executor.devices, executor.segments)
        self._submitted = 0
        self._collected = 0
        with executor._lock:
            executor._batch = self._batch

    def submit(self, inputs: Mapping[str, Any]) -> _InputRun:
        run = self._executor._submit(self._batch, self._submitted, inputs)
        self._submitted += 1
        return run

    def collect(self, ticket: _InputRun) -> list:
        outputs = self._executor._collect(ticket)
        self._collected += 1
        return outputs

    def done(self, ticket: _InputRun) -> bool:
        """Whether ``ticket``'s input has stopped running: its outputs ready, or its batch stopped."""
        executor = self._executor
        with executor._lock:
            return ticket.segments_done == len(executor.segments) or executor._stopped(ticket)

    def close(self) -> None:
        executor = self._executor
        with executor._lock:
            self._batch.abandoned = True  # a consumer that stopped early leaves nothing running
            if self._collected < self._submitted:
                executor._notify_everyone()

    def __enter__(self) -> StreamSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _consumer_devices(segments: list[SegmentCall]) -> dict[str, set[str]]:
    """Per segment, the other devices whose segments read what it writes (the workers its end may unblock)."""
    device_of_reader: dict[str, set[str]] = {}
    for seg in segments:
        for key in seg.reads:
            device_of_reader.setdefault(key, set()).add(seg.device)
    return {
        seg.name: {device for key in seg.writes for device in device_of_reader.get(key, ())} - {seg.device}
        for seg in segments
    }


def _check_segments(segments: list[SegmentCall]) -> dict[str, SegmentCall]:
    """Which segment writes each key; every read must come from an earlier segment or be a model input."""
    if not segments:
        raise DivimlInputError("no segments to run", field="segments", hint="give at least one SegmentCall")
    names = Counter(seg.name for seg in segments)
    twice = [name for name, count in names.items() if count > 1]
    if twice:
        raise DivimlInputError(
            f"segment '{twice[0]}' appears twice", field="segments", hint="segment names must be unique"
        )
    producer: dict[str, SegmentCall] = {}
    for seg in segments:
        for key in seg.writes:
            if key in producer:
                raise DivimlInputError(
                    f"segments '{producer[key].name}' and '{seg.name}' both write '{key}'",
                    field="segments",
                    hint="every tensor key has one writer",
                )
            producer[key] = seg
    position = {seg.name: i for i, seg in enumerate(segments)}
    for seg in segments:
        for key in seg.reads:
            if key in producer and position[producer[key].name] >= position[seg.name]:
                raise DivimlInputError(
                    f"segment '{seg.name}' reads '{key}', written by '{producer[key].name}', "
                    f"which does not come before it",
                    field="segments",
                    hint="list segments in a topological order (split_segments returns one)",
                )
    return producer
