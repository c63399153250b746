"""CP-SAT for latency windows, in integer ticks, solved in an OR-Tools subprocess (``cpsat_worker.py``).

``tick_model`` states a window (default: the whole graph) as the worker reads it: optional intervals
per (kernel, device), NoOverlap per device, transfers priced as the simulator's ``latency`` mode prices
them, memory held conservatively (every activation a device receives, at once). Seconds become ticks
rounded down, so the model's optimum and bound are lower bounds in seconds. ``CpsatSession`` keeps one
worker process for many solves; this process never imports OR-Tools, which cannot share a process with
python-mip's CBC (docs/solvers.md#cp-sat).
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Self

from ..errors import DivimlInputError
from ..problem import Problem
from .deadline import Deadline, OutOfTime
from .windows import Context, WindowSolution, trivial_horizon_s, window_devices

log = logging.getLogger(__name__)


WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpsat_worker.py")


HORIZON_TICKS = 2**40
MEMORY_UNITS = 2**50  # the most memory units a request holds in all (bytes, or larger units past it)


PROOF_GAP = 1e-10  # CP-SAT stops here: closing the last ticks of a 2**40-tick gap can take minutes


WORKER_STARTUP_S = 60.0  # import of OR-Tools, before the worker's first answer, beyond the time limit
ANSWER_GRACE_S = 2.0  # past a solve's time limit (its model's building included), before it is stopped
# A model prices each edge into a window kernel on every pair of its ends' devices, at about 3 us a
# price in Python and as long again in the worker: a 2,000-kernel segment took 2.6 s to build on 8
# devices, minutes on 64; 16 kernels on 192 devices (64 servers) priced 1.2 million and ran 60 s past a
# 10 s limit. Past this many prices, a model keeps the devices its starting plan and context use.
MAX_PRICES = 200_000
FINISH_ANSWER_S = 10.0  # a closing session waits this long for a solve under way, unless stopped at once
LONGEST_WAIT_S = 3600.0  # one wait on the worker; a longer limit waits again


@dataclass
class TickModel:
    """The problem in integer ticks, as the worker reads it, with what maps its answer back."""

    data: dict
    scale: float  # ticks per second
    kernels: list[str]  # the window's kernels, in the worker's order
    devices: list[str]
    memory_binds: bool  # memory can cut plans: the model is a restriction of the problem
    restricted: bool = False  # some kernels left only the devices of the starting plan (``MAX_PRICES``)

    def solution(self, problem: Problem, answer: dict) -> WindowSolution | None:
        """The worker's answer in seconds (None when it found no solution)."""
        if "device" not in answer:
            return None
        assignment = {k: self.devices[d] for k, d in zip(self.kernels, answer["device"])}
        start = {k: tick / self.scale for k, tick in zip(self.kernels, answer["start"])}
        finish = {k: start[k] + problem.costs.compute_s(k, assignment[k]) for k in self.kernels}
        return WindowSolution(
            assignment,
            start,
            finish,
            answer["objective"] / self.scale,
            0.0 if self.restricted else answer["bound"] / self.scale,
            answer["status"] == "OPTIMAL" and not self.restricted,
        )


@dataclass(frozen=True)
class TickGrid:
    """Seconds to ticks, and (kernel, device) to the worker's indices. ``never``: one tick past the
    model's horizon, where every longer time stops (a kernel that long on a device, or a copy that
    long, cannot be in a schedule within the horizon, and 64-bit ticks hold it)."""

    scale: float  # ticks per second
    kernel: dict[str, int]
    device: dict[str, int]
    never: int

    def down(self, seconds: float) -> int:
        return math.floor(min(seconds * self.scale, self.never))

    def up(self, seconds: float) -> int:  # a time set by a fixed kernel: never earlier than it
        return math.ceil(min(seconds * self.scale, self.never))

    def on(self, kernel: str, device: str) -> list[int]:
        return [self.kernel[kernel], self.device[device]]


def edge_timing(
    problem: Problem,
    kernels: list[str],
    context: Context,
    feasible: dict[str, list[str]],
    grid: TickGrid,
    deadline: Deadline | None = None,
) -> tuple[list, list, list]:
    """The window's edges as the worker reads them: precedences between window kernels, delays when a
    tensor crosses devices (the largest edge read on the destination, by the sibling rule), and release
    times after fixed producers. ``OutOfTime`` past ``deadline``."""
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    inside, k_index = set(kernels), grid.kernel
    ticks, ticks_up, on = grid.down, grid.up, grid.on
    precedences, delays, releases = [], [], []
    for w in kernels:
        if deadline is not None:
            deadline.check("building the CP-SAT model")
        for edge in graph.pred[w]:
            u = edge.src
            if u not in inside and u not in context.assignment:
                raise ValueError(f"window kernel '{w}' reads '{u}', which is neither in the window nor fixed")
            output = graph.kernels[u].output_bytes if u in graph.output_set else 0.0
            siblings = [s for s in graph.succ[u] if s.dst != w]
            if u in inside:
                precedences.append([k_index[u], k_index[w]])
                origins = [(d, None) for d in feasible[u]]
            else:
                finish = context.finish_s[u]
                releases.append([k_index[w], ticks_up(finish), []])
                origins = [(context.assignment[u], finish)]
            for d, finish in origins:
                for e in feasible[w]:
                    if d == e:
                        continue
                    fixed_there = [
                        s.bytes for s in siblings if s.dst not in inside and context.assignment.get(s.dst) == e
                    ]
                    nbytes = max([edge.bytes, *fixed_there, *([output] if e == host else [])])
                    for larger, condition in [(nbytes, [on(w, e)])] + [
                        (s.bytes, [on(w, e), on(s.dst, e)])
                        for s in siblings
                        if s.dst in inside and e in feasible[s.dst] and s.bytes > nbytes
                    ]:
                        delay = costs.transfer_s(larger, d, e)
                        if finish is not None:  # a fixed producer: a release time
                            releases.append([k_index[w], ticks_up(finish + delay), condition])
                        elif ticks(delay) > 0:
                            delays.append([k_index[u], k_index[w], ticks(delay), [on(u, d), *condition]])
    return precedences, delays, releases


def transfer_prices(problem: Problem, kernels: list[str], feasible: dict[str, list[str]]) -> int:
    """How many transfers a model of ``kernels`` prices: per edge into one, its ends' device pairs."""
    return sum(
        len(feasible.get(edge.src, [None])) * len(feasible[w]) for w in kernels for edge in problem.graph.pred[w]
    )


def input_releases(problem: Problem, kernels: list[str], feasible: dict[str, list[str]], grid: TickGrid) -> list:
    """Each model input reaches a window kernel's device from the host before the kernel starts there."""
    graph, costs, host, inside = problem.graph, problem.costs, problem.platform.host, set(kernels)
    return [
        [grid.kernel[w], grid.down(costs.transfer_s(graph_input.bytes, host, e)), [grid.on(w, e)]]
        for graph_input in graph.inputs
        for w in dict.fromkeys(graph_input.consumers)
        if w in inside
        for e in feasible[w]
        if e != host and grid.down(costs.transfer_s(graph_input.bytes, host, e)) > 0
    ]


def output_tails(
    problem: Problem,
    kernels: list[str],
    feasible: dict[str, list[str]],
    grid: TickGrid,
    tail_s: dict[str, float | dict[str, float]] | None,
    returning: set[str],
) -> list:
    """What must follow a window kernel before the makespan: its output's trip home (for the kernels
    ``returning`` it), and ``tail_s``."""
    graph, costs, host = problem.graph, problem.costs, problem.platform.host
    tails = [
        [grid.kernel[u], grid.down(costs.transfer_s(graph.kernels[u].output_bytes, d, host)), [grid.on(u, d)]]
        for u in kernels
        if u in returning and u in graph.output_set and graph.kernels[u].output_bytes > 0
        for d in feasible[u]
        if d != host
    ]
    for u, tail in (tail_s or {}).items():
        by_device = tail if isinstance(tail, dict) else {None: tail}
        tails += [
            [grid.kernel[u], grid.down(t), [grid.on(u, d)] if d is not None else []]
            for d, t in by_device.items()
            if grid.down(t) > 0 and (d is None or d in feasible[u])
        ]
    return tails


def tick_model(
    problem: Problem,
    window: list[str] | None = None,
    context: Context | None = None,
    *,
    fixed_start_s: dict[str, float] | None = None,
    tail_s: dict[str, float | dict[str, float]] | None = None,
    hint: WindowSolution | None = None,
    horizon_s: float | None = None,
    ends_on: dict[str, str] | None = None,
    lower_bound_s: float = 0.0,
    deadline: Deadline | None = None,
    prices_at_most: int | None = None,
) -> TickModel:
    """The worker's input for ``window`` (default: every kernel) with ``context`` fixed: durations and
    transfers in ticks, rounded down. ``fixed_start_s``: start times of fixed kernels, whose runs
    (to their ``context.finish_s``) then occupy their devices; ``tail_s``: per window kernel, time
    that must follow its end before the makespan (seconds, or {device: seconds} where it depends on
    the kernel's device); ``hint``: a schedule to start from; ``horizon_s``: a known upper bound on the
    window's optimum (ignored where memory binds: the model may then exclude the plan that gave it).
    ``window`` lists its kernels in a topological order, and each predecessor of a window kernel is
    in the window or in ``context``. ``ends_on``: window kernels that end it on a given device (a
    series segment's closing cut kernel), whose output's trip home belongs to what follows.
    ``lower_bound_s``: a proven bound on the makespan (whole graph only), less what rounding every
    duration and transfer down may take off one path, so that it never cuts off the ticks' optimum.
    ``deadline``: building stops there (``OutOfTime``). ``prices_at_most``: where the model would
    price more transfers (``transfer_prices``), each kernel keeps only the devices that ``hint`` and
    ``context`` use and the host, and the model is ``restricted`` (no bound, no proof); ``OutOfTime``
    where that is still more, or there is no hint."""
    context = context or Context()
    kernels = list(window) if window is not None else list(problem.graph.topo_order)
    k_index = {k: i for i, k in enumerate(kernels)}
    d_index = {d: i for i, d in enumerate(problem.platform.device_names)}
    feasible, restricted = window_choices(problem, kernels, context, ends_on, hint, prices_at_most)
    memory, memory_binds = memory_items(problem, feasible, k_index, d_index, context)
    horizon = trivial_horizon_s(problem, kernels, context, tail_s)
    if horizon_s is not None and not memory_binds:
        horizon = min(horizon, max(horizon_s, *context.finish_s.values()) if context.finish_s else horizon_s)
    scale = tick_scale(horizon)
    horizon_ticks = math.ceil(horizon * scale) + len(kernels)  # a tick of rounding per kernel on a path
    grid = TickGrid(scale, k_index, d_index, never=horizon_ticks + 1)
    data = {
        **schedule_items(problem, kernels, context, feasible, grid, fixed_start_s, tail_s, ends_on, deadline),
        "horizon": horizon_ticks,
        "memory": memory,
        "hint": None,
        "lower_bound": max(0, grid.down(lower_bound_s) - 2 * (len(kernels) + len(problem.graph.edges) + 2)),
    }
    if hint is not None:
        data["hint"] = {
            "device": [d_index[hint.assignment[k]] for k in kernels],
            "start": [min(grid.up(hint.start_s[k]), data["horizon"]) for k in kernels],
        }
    return TickModel(data, scale, kernels, problem.platform.device_names, memory_binds, restricted)


def window_choices(
    problem: Problem,
    kernels: list[str],
    context: Context,
    ends_on: dict[str, str] | None,
    hint: WindowSolution | None,
    prices_at_most: int | None,
) -> tuple[dict[str, list[str]], bool]:
    """Each window kernel's devices (one for a kernel of ``ends_on``), and whether they were restricted:
    past ``prices_at_most`` transfer prices, each kernel keeps the devices ``hint`` and ``context``
    use and the host (``OutOfTime`` where that is still more, or there is no hint)."""
    platform = problem.platform
    feasible = {k: window_devices(problem, k, context.assignment) for k in kernels}
    for kernel, device in (ends_on or {}).items():
        if device not in feasible[kernel]:
            raise DivimlInputError(f"kernel '{kernel}' cannot end the window on '{device}'", field="allowed_devices")
        feasible[kernel] = [device]
    restricted = prices_at_most is not None and transfer_prices(problem, kernels, feasible) > prices_at_most
    if restricted:
        used = {platform.host, *context.assignment.values(), *(hint.assignment.values() if hint else ())}
        feasible = {k: [d for d in options if d in used] or options for k, options in feasible.items()}
        prices = transfer_prices(problem, kernels, feasible)
        if hint is None or prices > prices_at_most:
            raise OutOfTime(f"a CP-SAT model pricing {prices} transfers cannot be built in time", field="time_limit")
        log.info("cpsat: %d kernels kept to the %d devices their plan uses (a restriction)", len(kernels), len(used))
    return feasible, restricted


def schedule_items(
    problem: Problem,
    kernels: list[str],
    context: Context,
    feasible: dict[str, list[str]],
    grid: TickGrid,
    fixed_start_s: dict[str, float] | None,
    tail_s: dict[str, float | dict[str, float]] | None,
    ends_on: dict[str, str] | None,
    deadline: Deadline | None,
) -> dict[str, list]:
    """The window's schedule as the worker reads it, in ticks: durations, precedences, transfer delays,
    release times, tails, the fixed kernels' runs on their devices (``busy``) and co-located pairs."""
    graph, costs, devices = problem.graph, problem.costs, problem.platform.device_names
    ticks, ticks_up, k_index = grid.down, grid.up, grid.kernel
    duration = [[ticks(costs.compute_s(k, d)) if d in feasible[k] else None for d in devices] for k in kernels]
    precedences, delays, releases = edge_timing(problem, kernels, context, feasible, grid, deadline)
    releases += input_releases(problem, kernels, feasible, grid)
    tails = output_tails(problem, kernels, feasible, grid, tail_s, returning=set(kernels) - set(ends_on or {}))
    groups: dict[str, str] = {}
    same_device = [
        [k_index[groups.setdefault(graph.kernels[k].colocate, k)], k_index[k]]
        for k in kernels
        if graph.kernels[k].colocate is not None
    ]
    earliest = min(earliest_starts(kernels, precedences, releases, duration), default=0)
    busy = {k: (s, context.finish_s[k]) for k, s in (fixed_start_s or {}).items()}
    busy_ticks = merged_intervals(
        [
            (grid.device[context.assignment[k]], ticks(s), ticks_up(f))
            for k, (s, f) in busy.items()
            if ticks_up(f) > max(ticks(s), earliest)
        ]
    )
    return {
        "duration": duration,
        "precedences": precedences,
        "delays": delays,
        "releases": releases,
        "tails": tails,
        "busy": busy_ticks,
        "same_device": [pair for pair in same_device if pair[0] != pair[1]],
    }


def merged_intervals(runs: list[tuple[int, int, int]]) -> list[list[int]]:
    """(device, begin, end) runs as [device, begin, size], overlapping runs of a device merged: fixed
    runs rounded outwards may overlap by a tick, which NoOverlap would reject."""
    merged: list[list[int]] = []
    for device, begin, end in sorted(runs):
        if merged and merged[-1][0] == device and begin <= merged[-1][1] + merged[-1][2]:
            merged[-1][2] = max(merged[-1][2], end - merged[-1][1])
        else:
            merged.append([device, begin, end - begin])
    return merged


def earliest_starts(kernels: list[str], precedences: list, releases: list, duration: list) -> list[int]:
    """Per window kernel, in ticks: no start can be earlier (unconditional releases along paths,
    fastest durations). Fixed runs that end before the earliest of these cannot matter."""
    earliest = [0] * len(kernels)
    for w, t, condition in releases:
        if not condition:
            earliest[w] = max(earliest[w], t)
    before: dict[int, list[int]] = {}
    for u, w in precedences:
        before.setdefault(w, []).append(u)
    for w in range(len(kernels)):  # window order is topological
        for u in before.get(w, ()):
            earliest[w] = max(earliest[w], earliest[u] + min(p for p in duration[u] if p is not None))
    return earliest


def memory_items(
    problem: Problem,
    feasible: dict[str, list[str]],
    k_index: dict[str, int],
    d_index: dict[str, int],
    context: Context | None = None,
) -> tuple[list[dict], bool]:
    """Per device with a capacity, what it holds when given window kernels run there: each weight
    (once), and each activation tensor (a kernel's output where it or a consumer runs, a model input
    where a consumer runs), bytes rounded up. What a fixed kernel of ``context`` already holds on a
    device takes its room there; kernels neither in the window nor fixed hold nothing yet. Also
    whether memory can cut any plan at all. Past ``MEMORY_UNITS`` bytes in all, the worker counts in
    a power of two of bytes (items rounded up, room down: a restriction still), so that no sum of
    them overflows 64 bits."""
    graph = problem.graph
    fixed = context.assignment if context is not None else {}
    items: list[tuple[float, list[str]]] = []
    users: dict[str, list[str]] = {}
    for kernel in graph.topo_order:
        for weight in graph.kernels[kernel].weights:
            users.setdefault(weight, []).append(kernel)
        items.append((graph.kernels[kernel].output_bytes, [kernel, *(e.dst for e in graph.succ[kernel])]))
    items += [(graph.weights[weight], kernels) for weight, kernels in users.items()]
    items += [(graph_input.bytes, list(graph_input.consumers)) for graph_input in graph.inputs]
    everything = sum(math.ceil(nbytes) for nbytes, _ in items)
    unit = 1 << max(0, math.ceil(math.log2(max(everything, 1) / MEMORY_UNITS)))
    out, binds = [], False
    for device in problem.platform.devices:
        d = device.name
        if device.memory_bytes is None or everything <= device.memory_bytes:
            continue  # even the whole graph fits: no constraint
        held = sum(math.ceil(nbytes / unit) for nbytes, kernels in items if any(fixed.get(k) == d for k in kernels))
        here = [
            [math.ceil(nbytes / unit), [k_index[k] for k in kernels if k in k_index and d in feasible[k]]]
            for nbytes, kernels in items
            if not any(fixed.get(k) == d for k in kernels)
        ]
        here = [item for item in here if item[0] > 0 and item[1]]
        capacity = math.floor(device.memory_bytes / unit) - held
        if sum(nbytes for nbytes, _ in here) <= capacity:
            continue  # everything fits: no constraint
        binds = True
        out.append({"device": d_index[d], "capacity": capacity, "items": here})
    return out, binds


def tick_scale(horizon: float) -> float:
    """Ticks per second: the power of two that puts ``horizon`` seconds at most HORIZON_TICKS (within
    what a float holds: a horizon of 1e-300 s gets 2**1000 ticks a second)."""
    exponent = 40 if horizon <= 0 else math.floor(math.log2(HORIZON_TICKS / horizon))
    return math.ldexp(1.0, max(-1000, min(exponent, 1000)))


class CpsatSession:
    """One OR-Tools process (``cpsat_worker.py``) for many solves, as a context manager: JSON lines
    of plain numbers go in and come back, and the parent never imports OR-Tools. The process starts
    on entry (importing OR-Tools while the caller prepares its first model) and ends on exit; one
    that overran its time is stopped, and the next request starts another."""

    def __init__(self, *, workers: int = 1, seed: int = 0):
        self.workers, self.seed = workers, seed
        self._process: subprocess.Popen | None = None
        self._errors = None
        self._pending = b""
        self._answered = False

    def __enter__(self) -> Self:
        self._start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(at_once=exc_type is not None)  # interrupted or failed: do not wait for the solve to end

    def _start(self) -> None:
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the process; closed in close())
        self._process = subprocess.Popen(
            [sys.executable, "-P", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            bufsize=0,
        )
        self._pending = b""
        self._answered = False

    def close(self, at_once: bool = False) -> None:
        """End the CP-SAT process: let it finish its answer (up to ``FINISH_ANSWER_S``), or kill it
        ``at_once``; the log says which (what a stopped run is checked by)."""
        process, self._process = self._process, None
        if process is None:
            return
        try:
            process.stdin.close()
            process.wait(timeout=0 if at_once else FINISH_ANSWER_S)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
            when = "at once" if at_once else f"after waiting {FINISH_ANSWER_S:g} s for its answer"
            log.debug("cpsat: stopped the CP-SAT process %s", when)
        process.stdout.close()
        self._errors.close()

    def request(self, data: dict, until: Deadline, deadline: Deadline | None = None) -> dict:
        """Send one request (``cpsat_worker``'s format) and wait for its answer until ``until`` (the
        worker builds and solves by then) and ``ANSWER_GRACE_S`` more, plus OR-Tools' start-up before the
        process's first answer; never more than ``ANSWER_GRACE_S`` past ``deadline``."""
        if self._process is None:
            self._start()
        limit_s = until.left()
        wait_s = limit_s + (ANSWER_GRACE_S if self._answered else WORKER_STARTUP_S)
        if deadline is not None:
            wait_s = min(wait_s, deadline.left() + ANSWER_GRACE_S)
        give_up_at = time.monotonic() + wait_s  # a wait on a pipe
        try:
            self._process.stdin.write(json.dumps(data).encode() + b"\n")
        except BrokenPipeError:
            self._failed()
        line = self._read_line(give_up_at)
        if line is None:
            log.warning("cpsat: the CP-SAT process ran past %.3g s and was stopped", limit_s)
            self._process.kill()
            self.close()
            return {"status": "TIMEOUT", "bound": 0, "wall_s": limit_s}
        answer = json.loads(line)
        self._answered = True
        if answer["status"] == "NO_ORTOOLS":  # installed (a dependency) but broken, e.g. a protobuf clash
            raise DivimlInputError(
                f"the CP-SAT process cannot import OR-Tools: {answer['error']}",
                field="solver",
                hint="reinstall ortools (a dependency of tvm-diviml), e.g. pip install --force-reinstall ortools",
            )
        return answer

    def solve(
        self,
        model: TickModel,
        until: Deadline,
        *,
        relative_gap: float = PROOF_GAP,
        deadline: Deadline | None = None,
    ) -> dict:
        """The worker's answer for ``model``, solved by ``until`` (building the model in the worker
        included), and waited for no later than ``deadline`` allows (see ``request``)."""
        data = {
            **model.data,
            "time_limit_s": until.left(),
            "seed": self.seed,
            "workers": self.workers,
            "relative_gap": relative_gap,
        }
        return self.request(data, until, deadline)

    def solve_window(
        self,
        problem: Problem,
        window: list[str],
        context: Context,
        *,
        fixed_start_s: dict[str, float] | None = None,
        tail_s: dict[str, float | dict[str, float]] | None = None,
        hint: WindowSolution | None = None,
        until: Deadline,
        deadline: Deadline | None = None,
    ) -> WindowSolution | None:
        """The best schedule of ``window`` found around ``context`` by ``until`` (see ``tick_model``; on
        the devices ``hint`` and ``context`` use where it would price more than ``MAX_PRICES``
        transfers); None when CP-SAT found none in time. ``hint`` (a list schedule) seeds the
        search, and its makespan (window tails included) bounds the horizon. ``OutOfTime`` where
        ``deadline`` passes while the model is built."""
        model = tick_model(
            problem,
            window,
            context,
            fixed_start_s=fixed_start_s,
            tail_s=tail_s,
            hint=hint,
            horizon_s=hint.objective_s if hint is not None else None,
            deadline=deadline,
            prices_at_most=MAX_PRICES,
        )
        return model.solution(problem, self.solve(model, until, deadline=deadline))

    def _read_line(self, give_up_at: float) -> bytes | None:
        """The worker's next line, or None where none came by ``give_up_at`` (``time.monotonic``)."""
        stdout = self._process.stdout
        while b"\n" not in self._pending:
            remaining = give_up_at - time.monotonic()
            if remaining <= 0:
                return None
            if not select.select([stdout], [], [], min(remaining, LONGEST_WAIT_S))[0]:
                continue  # select takes no timeout past the platform's time_t (a limit of 1e10 s)
            chunk = os.read(stdout.fileno(), 1 << 16)
            if not chunk:
                self._failed()
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def _failed(self) -> None:
        process = self._process
        process.wait()
        self._errors.seek(0)
        detail = self._errors.read().decode(errors="replace")[-2000:]
        self.close()
        raise RuntimeError(f"the CP-SAT process failed (exit {process.returncode}): {detail}")
