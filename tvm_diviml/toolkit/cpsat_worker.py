"""The CP-SAT side of the ``cpsat`` solver and of ``split``'s windows, run in a process of its own.

OR-Tools and python-mip's CBC clash when loaded into one process, so the parent never imports
OR-Tools: it writes one JSON request a line to this script's stdin and reads one answer a line from
its stdout, until it closes stdin; OR-Tools is imported once per process. The script imports nothing
from ``tvm_diviml`` and is run by path (``python -P cpsat_worker.py``). Requests hold only numbers,
indices and 0/1 choices (durations in ticks, precedences, conditional delays, releases and tails,
busy intervals, co-location, memory items, a hint, the makespan's least value); answers give
``status``, ``device``, ``start``, ``objective`` and ``bound`` in ticks.

With several workers CP-SAT first runs alone for a quarter of the time limit, so a proof found then
is reproducible for its seed.

The request fields and the model: docs/solvers.md#cp-sat.
"""

import json
import math
import os
import sys
import time

SINGLE_WORKER_SHARE = 0.25  # measured: as good as all workers throughout, and proofs come reproducibly


def build(data: dict):
    """The CP-SAT model of one request: (model, x, start)."""
    from ortools.sat.python import cp_model

    duration = data["duration"]
    horizon = data["horizon"]
    kernels = range(len(duration))
    model = cp_model.CpModel()
    start = [model.new_int_var(0, horizon, f"start{v}") for v in kernels]
    end = [model.new_int_var(0, horizon, f"end{v}") for v in kernels]
    x = [{d: model.new_bool_var(f"x{v}_{d}") for d, p in enumerate(duration[v]) if p is not None} for v in kernels]
    intervals_on: dict[int, list] = {}
    for v in kernels:
        model.add_exactly_one(x[v].values())
        model.add(end[v] == start[v] + sum(duration[v][d] * x[v][d] for d in x[v]))
        for d, on_d in x[v].items():
            interval = model.new_optional_fixed_size_interval_var(start[v], duration[v][d], on_d, f"run{v}_{d}")
            intervals_on.setdefault(d, []).append(interval)
    for d, begin, size in data.get("busy", []):
        if d in intervals_on:
            intervals_on[d].append(model.new_fixed_size_interval_var(begin, size, f"busy{d}_{begin}"))
    for intervals in intervals_on.values():
        model.add_no_overlap(intervals)

    def holds(condition):
        return [x[k][d] for k, d in condition]

    for u, w in data["precedences"]:
        model.add(start[w] >= end[u])
    for u, w, ticks, condition in data["delays"]:
        model.add(start[w] >= end[u] + ticks).only_enforce_if(holds(condition))
    for w, ticks, condition in data["releases"]:
        model.add(start[w] >= ticks).only_enforce_if(holds(condition))
    for a, b in data["same_device"]:
        for d in set(x[a]) | set(x[b]):  # a device only one of them may use is closed to both
            model.add(x[a].get(d, 0) == x[b].get(d, 0))
    for device in data["memory"]:
        d, terms = device["device"], []
        for nbytes, users in device["items"]:
            users_here = [x[k][d] for k in users if d in x[k]]
            if not users_here:
                continue
            held = model.new_bool_var("")
            for on_d in users_here:
                model.add_implication(on_d, held)
            terms.append(nbytes * held)
        model.add(sum(terms) <= device["capacity"])

    makespan = model.new_int_var(min(data["lower_bound"], horizon), horizon, "C")
    for v in kernels:
        model.add(makespan >= end[v])
    for u, ticks, condition in data["tails"]:
        model.add(makespan >= end[u] + ticks).only_enforce_if(holds(condition))
    model.minimize(makespan)
    return model, x, start


def solve(data: dict) -> dict:
    """Solve one request: first with one worker for ``SINGLE_WORKER_SHARE`` of the time limit (a
    proof there is reproducible), then, unless proven, with all ``workers`` from the best found. The
    time limit counts from the request's arrival: building the model takes its share."""
    from ortools.sat.python import cp_model

    began = time.perf_counter()
    model, x, start = build(data)
    kernels = range(len(x))
    hint = data.get("hint")
    if hint:
        _hint(model, x, start, hint["device"], hint["start"])
    built_s = time.perf_counter() - began  # the limit holds for building and solving together
    limit, workers = max(float(data["time_limit_s"]) - built_s, 0.001), int(data["workers"])
    phases = (
        [(1, SINGLE_WORKER_SHARE * limit), (workers, (1 - SINGLE_WORKER_SHARE) * limit)]
        if workers > 1
        else [(1, limit)]
    )
    answer = {"status": "UNKNOWN", "bound": 0}
    for phase_workers, seconds in phases:
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = seconds
        solver.parameters.random_seed = int(data["seed"])
        solver.parameters.num_workers = phase_workers
        solver.parameters.relative_gap_limit = float(data["relative_gap"])
        status = solver.solve(model)
        bound = solver.best_objective_bound
        if math.isfinite(bound):
            answer["bound"] = max(answer["bound"], math.ceil(bound - 1e-6))
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) and (
            "objective" not in answer or round(solver.objective_value) < answer["objective"]
        ):
            answer["objective"] = round(solver.objective_value)
            answer["device"] = [next(d for d, on_d in x[v].items() if solver.boolean_value(on_d)) for v in kernels]
            answer["start"] = [solver.value(start[v]) for v in kernels]
        answer["status"] = solver.status_name(status)
        if status not in (cp_model.FEASIBLE, cp_model.UNKNOWN):  # proven optimal or infeasible
            break
        if "device" in answer:
            model.clear_hints()
            _hint(model, x, start, answer["device"], answer["start"])
    if answer["status"] == "UNKNOWN" and "device" in answer:
        answer["status"] = "FEASIBLE"
    answer["wall_s"] = time.perf_counter() - began
    return answer


def _hint(model, x, start, device: list[int], begin: list[int]) -> None:
    for v, on in enumerate(x):
        for d, on_d in on.items():
            model.add_hint(on_d, d == device[v])
        model.add_hint(start[v], begin[v])


def _die_with_parent() -> None:
    """Linux: the kernel stops this process when its parent ends, however it ends (SIGKILL included),
    so a killed diviml leaves no CP-SAT solve running. Elsewhere the closed stdin ends the loop."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent ended before the call above
        sys.exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops this process


def main() -> None:
    _die_with_parent()
    try:
        import ortools.sat.python.cp_model  # noqa: F401  (fail with a clear answer, not a traceback)
    except ImportError as error:
        missing = {"status": "NO_ORTOOLS", "error": str(error)}
    else:
        missing = None
    for line in sys.stdin:
        if not line.strip():
            continue
        answer = missing if missing is not None else solve(json.loads(line))
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
