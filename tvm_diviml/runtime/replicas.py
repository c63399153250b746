"""Several runners of one model as one: replicas, and a batch cut into sub-batches.

A *lane* is a runner of the whole model on its own devices (a ``ConcurrentRunner`` over one build);
all it must offer is ``session()``, a stream driven by hand (``submit(inputs) -> ticket``,
``done(ticket)``: whether its outputs are ready, ``collect(ticket) -> outputs``, ``close()``),
``busy_s`` and ``close()``. TVM-free, so the dispatching is tested with plain Python callables.

``ReplicatedRunner`` sends each input of a stream to one lane: in proportion to the plan's shares (a
smooth weighted rotation, so any run of n inputs gives lane i ``share_i x n`` of them, within one), or
to the lane with the fewest inputs still running in it (``next_free``: outputs ready and not yet
collected do not count, so a lane that ran ahead of the input order is free). Outputs come back in
input order.
``SplitBatchRunner`` cuts each input along its batch axis into the lanes' sub-batches, runs the pieces
side by side and joins the outputs.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import DivimlInputError

POLICIES = ("shares", "next_free")


class Lane(Protocol):
    def session(self) -> Any: ...

    @property
    def busy_s(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class ReplicaError(RuntimeError):
    """A replica failed on an input; ``__cause__`` holds its error. The stream stops: nothing hangs."""

    def __init__(self, message: str, *, replica: str, input_index: int):
        super().__init__(message)
        self.replica, self.input_index = replica, input_index


class ShareRotation:
    """Smooth weighted round robin: each pick adds every lane's share to its credit and takes the
    lane of most credit (the first on a tie), which then pays 1. Deterministic; after n picks lane i
    was picked ``share_i x n`` times, give or take one."""

    def __init__(self, shares: Sequence[float]):
        total = sum(shares)
        if not shares or total <= 0 or any(s < 0 for s in shares):
            raise DivimlInputError(f"replica shares must be non-negative and not all zero, got {list(shares)}")
        self.shares = [s / total for s in shares]
        self.credit = [0.0] * len(shares)

    def pick(self, allowed: Sequence[int] | None = None) -> int:
        for i, share in enumerate(self.shares):
            self.credit[i] += share
        lanes = [i for i in (allowed if allowed is not None else range(len(self.shares))) if self.shares[i] > 0]
        best = max(lanes, key=lambda i: (self.credit[i], -i))
        self.credit[best] -= 1.0
        return best


def _sessions(lanes: Sequence[Lane]) -> list:
    sessions = []
    try:
        for lane in lanes:
            sessions.append(lane.session())
    except BaseException:
        for session in sessions:
            session.close()
        raise
    return sessions


class _SideBySide:
    """What both runners share: one input, or a stream of them kept in input order with up to
    ``in_flight`` in the lanes; each runner says how an input is submitted (``_submit``: to which
    sessions, as what) and its outputs collected (``_collect``)."""

    lanes: list

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return next(self.stream([inputs], in_flight=1))

    def stream(self, inputs: Iterable[list[np.ndarray]], in_flight: int = 2) -> Iterator[list[np.ndarray]]:
        """Outputs per input, in input order, with up to ``in_flight`` inputs in the lanes at once."""
        if not isinstance(in_flight, int) or in_flight < 1:
            raise DivimlInputError(f"must be a positive integer, got {in_flight!r}", field="in_flight")
        return self._stream(iter(inputs), in_flight)

    def _stream(self, inputs: Iterator[list[np.ndarray]], in_flight: int) -> Iterator[list[np.ndarray]]:
        sessions = _sessions(self.lanes)
        self._started()
        pending: deque[tuple[int, Any]] = deque()  # (input index, what _submit returned)
        index = 0
        try:
            while True:
                while len(pending) < in_flight:
                    arrays = next(inputs, None)
                    if arrays is None:
                        break
                    pending.append((index, self._submit(sessions, index, arrays)))
                    index += 1
                if not pending:
                    return
                yield self._collect(sessions, *pending.popleft())
        finally:
            for session in sessions:
                session.close()

    def _started(self) -> None:
        """A stream begins (its per-stream state reset)."""

    def _submit(self, sessions: list, index: int, arrays: list[np.ndarray]) -> Any:
        raise NotImplementedError

    def _collect(self, sessions: list, index: int, submitted: Any) -> list[np.ndarray]:
        raise NotImplementedError

    @property
    def busy_s(self) -> dict[str, float]:
        """Seconds each device spent in calls during the last stream, over every lane."""
        total: Counter = Counter()
        for lane in self.lanes:
            total.update(lane.busy_s)
        return dict(total)

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ReplicatedRunner(_SideBySide):
    """``runner(inputs)`` for one inference (on the lane of the largest share), ``runner.stream(many,
    in_flight)`` for a stream over every lane; ``names`` name the replicas in errors and reports."""

    def __init__(self, lanes: Sequence[Lane], shares: Sequence[float], names: Sequence[str], policy: str = "shares"):
        if not (len(lanes) == len(shares) == len(names)) or not lanes:
            raise DivimlInputError("a replicated runner needs one share and one name per lane, and a lane")
        if policy not in POLICIES:
            raise DivimlInputError(f"unknown replica policy '{policy}'", field="policy", hint=f"use {POLICIES}")
        self.lanes, self.names, self.policy = list(lanes), list(names), policy
        self.shares = ShareRotation(shares).shares
        self.sent: Counter = Counter()  # inputs each lane took in the last stream
        self._started()

    def _started(self) -> None:
        self._rotation = ShareRotation(self.shares)
        self._inside: list[deque] = [deque() for _ in self.lanes]  # per lane, its tickets not collected
        self.sent = Counter()

    def _submit(self, sessions: list, index: int, arrays: list[np.ndarray]) -> tuple[int, Any]:
        lane = self._choose(sessions)
        try:
            ticket = sessions[lane].submit(arrays)
        except DivimlInputError:
            raise
        except Exception as error:  # noqa: BLE001 (named and re-raised)
            raise self._failure(lane, index, error) from error
        self._inside[lane].append(ticket)
        self.sent[self.names[lane]] += 1
        return lane, ticket

    def _collect(self, sessions: list, index: int, submitted: tuple[int, Any]) -> list[np.ndarray]:
        lane, ticket = submitted
        try:
            outputs = sessions[lane].collect(ticket)
        except Exception as error:  # noqa: BLE001 (named and re-raised)
            raise self._failure(lane, index, error) from error
        self._inside[lane].popleft()  # a lane's inputs are collected in the order they were sent
        return outputs

    def _choose(self, sessions: list) -> int:
        if self.policy == "shares":
            return self._rotation.pick()
        running = [sum(not sessions[i].done(t) for t in tickets) for i, tickets in enumerate(self._inside)]
        fewest = min(running[i] for i, s in enumerate(self.shares) if s > 0)
        return self._rotation.pick([i for i, n in enumerate(running) if n == fewest])

    def _failure(self, lane: int, index: int, error: BaseException) -> ReplicaError:
        return ReplicaError(
            f"replica {self.names[lane]} failed on input {index}: {type(error).__name__}: {error}",
            replica=self.names[lane],
            input_index=index,
        )


class SplitBatchRunner(_SideBySide):
    """A batch-B input run as R sub-batches, piece i on ``lanes[i]`` (side by side; a lane named for
    two pieces runs both, as two inputs in flight), outputs joined along the batch axis.
    ``batched``: per model input, whether axis 0 is the batch (others go whole to every piece)."""

    def __init__(self, lanes: Sequence[Lane], names: Sequence[str], batched: Sequence[bool]):
        if len(lanes) != len(names) or not lanes:
            raise DivimlInputError("a split batch needs one name per piece, and a piece")
        self.names, self.batched = list(names), list(batched)
        self.lanes = list({id(lane): lane for lane in lanes}.values())
        self._lane_of_piece = [next(i for i, lane in enumerate(self.lanes) if lane is piece) for piece in lanes]

    def _pieces(self, arrays: list[np.ndarray]) -> list[list[np.ndarray]]:
        if len(arrays) != len(self.batched):
            raise DivimlInputError(f"the model takes {len(self.batched)} inputs, {len(arrays)} were given")
        count = len(self._lane_of_piece)
        split = [
            np.split(np.asarray(a), count) if batched else [a] * count
            for a, batched in zip(arrays, self.batched, strict=True)
        ]
        return [[parts[i] for parts in split] for i in range(count)]

    def _submit(self, sessions: list, index: int, arrays: list[np.ndarray]) -> list:
        pieces = self._pieces(arrays)
        return [sessions[lane].submit(piece) for lane, piece in zip(self._lane_of_piece, pieces, strict=True)]

    def _collect(self, sessions: list, index: int, submitted: list) -> list[np.ndarray]:
        parts = []
        for piece, (lane, ticket) in enumerate(zip(self._lane_of_piece, submitted, strict=True)):
            try:
                parts.append(sessions[lane].collect(ticket))
            except Exception as error:  # noqa: BLE001 (named and re-raised)
                raise ReplicaError(
                    f"sub-batch {self.names[piece]} failed on input {index}: {type(error).__name__}: {error}",
                    replica=self.names[piece],
                    input_index=index,
                ) from error
        return [np.concatenate(outputs, axis=0) for outputs in zip(*parts, strict=True)]
