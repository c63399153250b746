"""Every kernel of a module scheduled by the default rules for its target (ours on llvm, dlight's on
GPUs), as the build and the cost model both do it. Each scheduled PrimFunc carries the name of what
scheduled it (``RULE_ATTR``)."""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path

import tvm
from tvm import tirx

from ..errors import raise_if_interrupted
from .rules import cpu_rules

log = logging.getLogger(__name__)

RULE_ATTR = "diviml.schedule"  # the rule that scheduled a PrimFunc, or "tuned"
UNSCHEDULED = "unscheduled"


def gpu_rules() -> list:
    from tvm.s_tir import dlight as dl

    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]


def rules_for(target) -> list:
    return cpu_rules() if target.kind.name == "llvm" else gpu_rules()


def default_schedule(func: tirx.PrimFunc, target, rules: list | None = None):
    """The schedule of the first rule that applies to ``func`` and that rule's name; (None,
    ``UNSCHEDULED``) when none does. A rule that fails while scheduling counts as not applying."""
    for rule in rules if rules is not None else rules_for(target):
        try:
            with target:
                scheduled = rule.apply(func, target, False)
        except Exception as error:  # noqa: BLE001 (a schedule primitive refused: try the next rule)
            raise_if_interrupted()
            log.debug("%s did not schedule a kernel: %s", type(rule).__name__, str(error).splitlines()[-1:])
            continue
        if scheduled is not None:
            return scheduled, type(rule).__name__
    return None, UNSCHEDULED


def apply_rules(func: tirx.PrimFunc, target, rules: list):
    """``func`` scheduled by the first rule that applies, with that rule's name; unchanged and
    ``UNSCHEDULED`` when none does."""
    scheduled, name = default_schedule(func, target, rules)
    if scheduled is None:
        return func, name
    return scheduled.mod["main"].with_attr("tirx.is_scheduled", True).with_attr(RULE_ATTR, name), name


def schedule_module(mod, target):
    """The module's PrimFuncs scheduled by the default rules for ``target``; those scheduled already
    (from a tuning database) keep their schedule, marked "tuned"."""
    rules = rules_for(target)
    out = {}
    for gvar, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            out[gvar] = func
        elif func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False)):
            out[gvar] = func if RULE_ATTR in func.attrs else func.with_attr(RULE_ATTR, "tuned")
        else:
            out[gvar] = apply_rules(func, target, rules)[0]
    return tvm.IRModule(out, attrs=mod.attrs, global_infos=mod.global_infos)


@functools.cache
def rules_digest() -> str:
    """A digest of this package's code: what the default CPU schedules are."""
    sources = sorted(Path(__file__).parent.glob("*.py"))
    return hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()[:12]


def schedule_names(mod) -> dict[str, str]:
    """PrimFunc name -> what scheduled it (a rule, "tuned" or "unscheduled")."""
    return {
        gvar.name_hint: str(func.attrs[RULE_ATTR]) if func.attrs and RULE_ATTR in func.attrs else UNSCHEDULED
        for gvar, func in mod.functions_items()
        if isinstance(func, tirx.PrimFunc)
    }
