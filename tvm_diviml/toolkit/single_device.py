"""The whole model on one device, for each device: the baseline every report compares against, kept
per device (None where it does not fit, with the reason).
"""

from __future__ import annotations

from ..errors import DivimlInputError
from ..plan import Plan
from ..problem import Problem
from ..simulator import simulate
from .device_classes import interchangeable_devices


def single_device_plan(problem: Problem, device: str) -> Plan:
    """Every kernel on ``device``, in graph order; one stage for pipelines."""
    graph = problem.graph
    assignment = {k: device for k in graph.kernels}
    stages = [list(graph.topo_order)] if problem.objective == "pipeline" else None
    return Plan(
        assignment,
        objective=problem.objective,
        mode=problem.mode,
        stages=stages,
        stage_devices=[device] if stages else None,
    )


def single_device_values(problem: Problem) -> tuple[Plan | None, dict[str, dict]]:
    """The fastest feasible single-device plan (None when no device can run the whole model), and
    per device its value (None where it does not fit) and first problems. Interchangeable devices
    (``interchangeable_devices``) share the simulation of the first of them."""
    per_device: dict[str, dict] = {}
    best: tuple[float, int, Plan] | None = None
    index = {d: i for i, d in enumerate(problem.platform.device_names)}
    for first, *others in interchangeable_devices(problem):
        plan = single_device_plan(problem, first)
        sim = simulate(problem, plan)
        for device in (first, *others):
            per_device[device] = {"value_s": sim.value_s if sim.feasible else None, "problems": sim.problems[:3]}
        if sim.feasible and (best is None or sim.value_s < best[0]):
            best = (sim.value_s, index[first], plan)
    per_device = {d: per_device[d] for d in problem.platform.device_names}
    if best is None:
        return None, per_device
    value, _, plan = best
    plan.value_s = value
    plan.attrs["per_device"] = per_device
    return plan, per_device


def no_single_device_reasons(per_device: dict[str, dict]) -> str:
    """Why each device cannot run the whole model, in one line."""
    return "; ".join(f"{d}: {v['problems'][0] if v['problems'] else 'infeasible'}" for d, v in per_device.items())


def fastest_single_device(problem: Problem) -> Plan:
    """The best single-device plan, or an error naming why each device cannot run the whole model."""
    plan, per_device = single_device_values(problem)
    if plan is None:
        raise DivimlInputError(
            f"no single device can run the whole model ({no_single_device_reasons(per_device)})",
            field="platform",
            hint="use a solver that splits the model across devices",
        )
    plan.solver = "fastest_single_device"
    return plan
