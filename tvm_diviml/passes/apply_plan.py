"""ApplyPlan: turn a Plan into a heterogeneous Relax module that ``tvm.compile(mod, target=None)`` builds.

The module is lowered as extraction lowers it (so the plan's kernel names match), then the entry
function is re-emitted from the Extraction (``emit.FunctionEmitter``): the platform's devices become
the module's ``vdevice`` global infos; every kernel's outputs live on its device's vdevice; a tensor
read on another device crosses once per destination device (``to_vdevice``); model inputs start on the
host and outputs return to it; weights and constants become parameters, one per device that reads
them, so they are uploaded once (``PlacedExecutable.upload_weights``) and never copied per inference.
Each PrimFunc carries its device's target (FuseTIR drops it; a CPU kernel would otherwise compile
for CUDA) and is scheduled as the cost model measured it: dlight's default rules on GPU targets, a
MetaSchedule database where one is given, nothing else on llvm
(see docs/design.md#tvm-027-traps). The module's other Relax functions (a decode step beside a
prefill, a cache creator) are kept as they were, run on the host: a pass never deletes what it did not place.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.plan import Plan
from tvm_diviml.platform import Platform
from tvm_diviml.runtime.packing import packed_shape, unpacked
from tvm_diviml.runtime.placement import Placement
from tvm_diviml.schedules.database import schedule_for_target
from tvm_diviml.schedules.target import device_target
from tvm_diviml.segments import split_segments
from tvm_diviml.servers import server_platform
from tvm_diviml.simulator import PlanError, run_order

from .emit import FunctionEmitter, Param, TargetFunc
from .extract import Extraction, Ref, extract, lower
from .segments import emit_segments, tensor_key

log = logging.getLogger(__name__)

PLACEMENT_ATTR = "diviml_placement"


@dataclass
class AppliedPlan:
    mod: Any  # the placed tvm.IRModule
    placement: Placement
    extraction: Extraction


def vdevices_of(platform: Platform, device_names: list[str]) -> dict[str, Any]:
    """One VDevice per platform device; two devices on one TVM device would be indistinguishable."""
    seen: dict[str, str] = {}
    out = {}
    for name in device_names:
        device = platform.device(name)
        if device.device in seen:
            raise DivimlInputError(
                f"devices '{seen[device.device]}' and '{name}' are both TVM device "
                f"{device.device}; a build needs one TVM device each",
                field="devices",
                hint="give every platform device its own kind:index; a plan across "
                "servers is built per server (tvm_diviml.app.rpc_run.build_per_server)",
            )
        seen[device.device] = name
        out[name] = relax.VDevice(device_target(device), device.index, "global")
    return out


def check_plan(plan: Plan, extraction: Extraction, platform: Platform) -> None:
    """Errors for a plan that does not match this module or platform, or that the build cannot run."""
    plan.check(extraction.graph, platform)
    if plan.replicas or plan.batch_split > 1:
        raise PlanError(
            "one module runs each kernel on one device; this plan replicates kernels (replicas or batch_split)",
            field="replicas",
            hint="build it with passes.timing.build_runnable (one build per replica; diviml run does), "
            "or a batch split with diviml run --batch-split",
        )


def apply_plan(
    mod,
    plan: Plan,
    platform: Platform,
    *,
    entry: str | None = None,
    fused: bool = True,
    database=None,
    extraction: Extraction | None = None,
    server: str | None = None,
) -> AppliedPlan:
    """The placed module for ``plan`` (see the module docstring); ``extraction`` skips re-extracting.

    ``server`` (a server of a multi-server platform, see ``servers.py``) places only the segment
    functions of that server's devices, with that server's host first: its devices' TVM device
    strings repeat on other servers, so each server gets its own build and there is no entry function
    (the driver runs the global segment graph)."""
    extraction = extraction or extract(mod, entry, fused=fused)
    check_plan(plan, extraction, platform)
    graph = extraction.graph
    local = platform if server is None else server_platform(platform, server)
    host = local.host
    assignment = {k: d for k, d in plan.assignment.items() if d in local.by_name}
    used = [d.name for d in local.devices if d.name in set(assignment.values()) | {host}]
    devices = [host] + [d for d in used if d != host]
    vdevices = vdevices_of(local, devices)
    builder = relax.BlockBuilder()
    target_funcs = _add_targeted_primfuncs(builder, extraction, assignment, local, database)
    emitter = FunctionEmitter(extraction, plan.assignment, vdevices)
    order = run_order(graph, plan)
    if server is None:
        reads = [Param(Ref("input", i.name), host) for i in graph.inputs]
        returns = [Param(ref, host) for ref in extraction.outputs]
        weight_params = [
            [p.ref.kind, p.ref.name, p.device]
            for p in emitter.emit(builder, extraction.entry, order, reads, returns, target_funcs)
        ]
    segments = emit_segments(
        builder,
        emitter,
        extraction,
        split_segments(graph, plan.assignment, order),
        target_funcs,
        devices=None if server is None else set(local.by_name),
    )
    placed = builder.get()
    if server is None:
        entry_gvar = placed.get_global_var(extraction.entry)
        placed[entry_gvar] = placed[entry_gvar].with_attr("num_input", len(reads))
        copies = _count_copies(placed[extraction.entry])
    else:
        weight_params = list(map(list, dict.fromkeys(tuple(w) for seg in segments for w in seg["weights"])))
        copies = sum(_count_copies(placed[seg["name"]]) for seg in segments)
    if extraction.transform_params is not None:
        placed.update(_host_functions(extraction.mod, [extraction.transform_params], placed, suffix="_weights"))
    if server is None:
        placed.update(_unplaced_functions(mod, extraction.entry, placed))
    sources = [unpacked(kind, name) for kind, name, _ in weight_params]
    constant_ids = sorted({name for kind, name in sources if kind == "const"})
    constants_func = f"{extraction.entry}_constants" if constant_ids else None
    if constants_func:
        placed[tvm.ir.GlobalVar(constants_func)] = _constants_function(extraction, constant_ids)
    placed.update_global_info("vdevice", [vdevices[d] for d in devices])
    host_target = device_target(platform.device(host))
    placed = relax.transform.RealizeVDevice()(placed)
    placed = _attach_host_target(placed, host_target)
    placement = _placement(
        plan,
        platform,
        extraction,
        devices=devices,
        weight_params=weight_params,
        constant_ids=constant_ids,
        constants_func=constants_func,
        copies=copies,
        segments=segments,
    )
    return AppliedPlan(placed, placement, extraction)


def _placement(
    plan: Plan,
    platform: Platform,
    extraction: Extraction,
    *,
    devices: list[str],
    weight_params: list[list[str]],
    constant_ids: list[str],
    constants_func: str | None,
    copies: int,
    segments: list[dict],
) -> Placement:
    """What the runtime needs beside the placed module to run it: the devices in vdevice order, which
    parameter goes to which device, the constants and segments, and the copies a run makes."""
    return Placement(
        entry=extraction.entry,
        devices=devices,
        tvm_devices=[platform.device(d).device for d in devices],
        num_threads=[platform.device(d).num_threads for d in devices],
        inputs=[i.name for i in extraction.graph.inputs],
        weight_params=weight_params,
        num_params=_num_params(extraction.mod, extraction),
        weight_ids=list(extraction.weight_params),
        transform_params=extraction.transform_params,
        constant_ids=constant_ids,
        constants_func=constants_func,
        num_outputs=len(extraction.outputs),
        copies_per_run=copies,
        assignment=dict(plan.assignment),
        outputs=[tensor_key(r) for r in extraction.outputs],
        segments=segments,
    )


def _host_functions(lowered, names: list[str], taken, suffix: str) -> dict:
    """The Relax functions ``names`` of ``lowered`` (run on the host) and the PrimFuncs they call. A
    PrimFunc whose name is in ``taken`` already (the same transpose that a kernel calls, with that
    kernel's target and schedule) gets its own copy, renamed with ``suffix``."""
    gvars = [lowered.get_global_var(name) for name in names]
    taken_names = {g.name_hint for g in taken.get_global_vars()}
    callees = {
        callee: lowered[callee]
        for gvar in gvars
        for callee in _global_vars_in(lowered[gvar])
        if isinstance(lowered[callee], tvm.tirx.PrimFunc)
    }
    renamed = {
        old: _renamed_global_var(old, f"{old.name_hint}{suffix}") for old in callees if old.name_hint in taken_names
    }
    functions = {
        renamed.get(old, old): func.with_attr("global_symbol", renamed.get(old, old).name_hint)
        for old, func in callees.items()
    }
    for gvar in gvars:
        functions[gvar] = _CalleeRenamer(lowered, renamed).visit_expr(lowered[gvar]) if renamed else lowered[gvar]
    return functions


def _unplaced_functions(mod, entry: str, taken) -> dict:
    """Every Relax function of ``mod`` but the placed ``entry``, with the PrimFuncs it calls: a pass never
    deletes functions it did not place (a module's prefill, decode and cache creator stay callable).
    They run on the host, lowered as extraction lowers but with their weights not lifted, so that
    each keeps the calling convention of a plain build."""
    names = [g.name_hint for g, f in mod.functions_items() if isinstance(f, relax.Function) and g.name_hint != entry]
    clash = next((name for name in names if any(g.name_hint == name for g in taken.get_global_vars())), None)
    if clash:
        raise DivimlInputError(
            f"the module's function '{clash}' has the name of a function the placed build adds",
            field="MODEL",
            hint="rename that function",
        )
    caller = next((name for name in names if entry in {g.name_hint for g in _global_vars_in(mod[name])}), None)
    if caller:
        raise DivimlInputError(
            f"the module's function '{caller}' calls '{entry}', the function being placed, whose "
            "calling convention placing changes",
            field="MODEL",
            hint=f"call '{entry}' from your own code rather than from '{caller}'",
        )
    if not names:
        return {}
    unplaced = tvm.IRModule(
        {g: f for g, f in mod.functions_items() if g.name_hint != entry}, attrs=mod.attrs, global_infos=mod.global_infos
    )
    return _host_functions(lower(unplaced, lift_params=False), names, taken, suffix="_host")


def _global_vars_in(func) -> list:
    """The functions ``func`` refers to, in order of first use."""
    found: dict = {}

    def visit(expr):
        if isinstance(expr, tvm.ir.GlobalVar):
            found.setdefault(expr, None)

    relax.analysis.post_order_visit(func, visit)
    return list(found)


def _renamed_global_var(gvar, name: str):
    renamed = tvm.ir.GlobalVar(name)
    relax.expr._update_type(renamed, gvar.ty)  # call_tir's normalization needs the callee's type
    return renamed


@relax.expr_functor.mutator
class _CalleeRenamer(relax.PyExprMutator):
    def __init__(self, mod, renamed: dict):
        super().__init__(mod)
        self.renamed = renamed

    def visit_global_var_(self, gvar):
        return self.renamed.get(gvar, gvar)


def _num_params(lowered, extraction: Extraction) -> int:
    """How many weights the model takes: the weight preparation's inputs, or the entry's weights."""
    if extraction.transform_params is None:
        return len(extraction.weight_params)
    (bundle,) = lowered[extraction.transform_params].params
    return len(bundle.ty.fields)


def _constants_function(extraction: Extraction, constant_ids: list[str]):
    """A function that returns the module's constants: run once on the host, then uploaded to each
    device that reads them (the VM would otherwise keep every constant on its first device)."""
    func = relax.Function([], relax.Tuple([extraction.constants[c] for c in constant_ids]), is_pure=True)
    return func.with_attr("global_symbol", f"{extraction.entry}_constants")


def _target_key(target: tvm.target.Target) -> str:
    return json.dumps(target.export(), sort_keys=True, default=str)


def _add_targeted_primfuncs(
    builder: relax.BlockBuilder, extraction: Extraction, assignment: dict[str, str], platform: Platform, database
) -> dict[tuple[str, str], TargetFunc]:
    """Add each kernel's PrimFunc to ``builder`` with its device's target attached and scheduled for it;
    a PrimFunc used on several targets gets one copy per target (suffixed with the target's kind and
    index). Returns (PrimFunc name, device) -> the compiled PrimFunc."""
    targets: dict[str, tvm.target.Target] = {}
    key_of_device: dict[str, str] = {}
    for name in dict.fromkeys(assignment.values()):
        target = device_target(platform.device(name))
        key = _target_key(target)
        targets.setdefault(key, target)
        key_of_device[name] = key
    uses: dict[str, list[str]] = {}
    for kernel, func_name in extraction.kernel_func.items():
        if kernel not in assignment:  # another server's kernel
            continue
        keys_used = uses.setdefault(func_name, [])
        if key_of_device[assignment[kernel]] not in keys_used:
            keys_used.append(key_of_device[assignment[kernel]])
    keys = list(targets)
    by_target: dict[str, dict[str, Any]] = {key: {} for key in keys}
    names: dict[tuple[str, str], str] = {}
    for func_name, func_keys in uses.items():
        for key in func_keys:
            new_name = func_name if len(func_keys) == 1 else f"{func_name}_{_slug(targets[key])}{keys.index(key)}"
            by_target[key][new_name] = (
                extraction.mod[func_name].with_attr("target", targets[key]).with_attr("global_symbol", new_name)
            )
            names[(func_name, key)] = new_name
    compiled: dict[str, TargetFunc] = {}
    for key, funcs in by_target.items():
        if funcs:
            scheduled = schedule_for_target(tvm.IRModule(funcs), targets[key], database)
            for gvar, func in scheduled.functions_items():
                compiled[gvar.name_hint] = TargetFunc(
                    builder.add_func(func, gvar.name_hint), packed_params(funcs[gvar.name_hint], func)
                )
    return {
        (func_name, device): compiled[names[(func_name, key)]]
        for func_name in uses
        for device, key in key_of_device.items()
        if (func_name, key) in names
    }


def packed_params(func, scheduled) -> dict[int, int]:
    """The parameter positions whose tensor ``scheduled`` reads packed (``runtime/packing.py``), with the
    lanes of the packing; any other change of a parameter's shape by a schedule is refused."""
    packed = {}
    for position, (before, after) in enumerate(zip(func.params, scheduled.params, strict=True)):
        shape, now = [int(d) for d in before.shape], [int(d) for d in after.shape]
        if now == shape:
            continue
        if len(now) != len(shape) + 1 or now != packed_shape(shape, now[-1]):
            raise ValueError(f"a schedule changed parameter {position}'s shape from {shape} to {now}")
        packed[position] = now[-1]
    return packed


def _slug(target: tvm.target.Target) -> str:
    return re.sub(r"\W", "", target.kind.name)


def _attach_host_target(mod, host_target):
    """PrimFuncs without a target (the weight preparation's) compile for the host."""
    updates = {}
    for gvar, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and (func.attrs is None or "target" not in func.attrs):
            updates[gvar] = func.with_attr("target", host_target)
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod


def _count_copies(func) -> int:
    count = 0

    def visit(expr):
        nonlocal count
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.to_vdevice":
            count += 1

    relax.analysis.post_order_visit(func, visit)
    return count


@tvm.transform.module_pass(opt_level=0, name="diviml.ApplyPlan")
class ApplyPlan:
    """Module pass: ``ApplyPlan(plan, platform)(mod)`` is the placed module; how to call it (devices,
    weight parameters) is in the module attribute ``diviml_placement`` (JSON, see ``Placement``)."""

    def __init__(self, plan: Plan, platform: Platform, *, entry: str | None = None, fused: bool = True, database=None):
        self.plan, self.platform, self.entry, self.fused, self.database = plan, platform, entry, fused, database

    def transform_module(self, mod, ctx):
        applied = apply_plan(mod, self.plan, self.platform, entry=self.entry, fused=self.fused, database=self.database)
        return applied.mod.with_attr(PLACEMENT_ATTR, applied.placement.to_json())
