"""Every kernel of a module scheduled by the default rules for its target (ours on llvm, dlight's on
GPUs), as the build and the cost model both do it. Each scheduled PrimFunc carries the name of what
scheduled it (``RULE_ATTR``).

A rule that raises is a rule that failed, not one that declined (those return None): the next rule
schedules the kernel, and a warning names both, since a raise that ends on the fallback is a slow
kernel nobody chose. One of our own rules raising is a bug: with ``DIVIML_STRICT_SCHEDULES=1`` (the
test suite sets it) it propagates."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path

import tvm
from tvm import tirx

from ..errors import first_line, raise_if_interrupted
from .rules import cpu_rules

log = logging.getLogger(__name__)

RULE_ATTR = "diviml.schedule"  # the rule that scheduled a PrimFunc, or "tuned"
UNSCHEDULED = "unscheduled"
FALLBACKS = ("Fallback", UNSCHEDULED)  # what schedules a kernel that no class rule took
STRICT_ENV = "DIVIML_STRICT_SCHEDULES"


def gpu_rules() -> list:
    from tvm.s_tir import dlight as dl

    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]


def rules_for(target) -> list:
    return cpu_rules() if target.kind.name == "llvm" else gpu_rules()


def default_schedule(func: tirx.PrimFunc, target, rules: list | None = None, kernel: str | None = None):
    """The schedule of the first rule that applies to ``func`` and that rule's name; (None,
    ``UNSCHEDULED``) when none does. A rule that raises counts as not applying, said in a warning
    (``kernel`` names the function there) where it was one of ours or the kernel ends on a fallback."""
    failed = []
    scheduled, name = None, UNSCHEDULED
    for rule in rules if rules is not None else rules_for(target):
        try:
            with target:
                scheduled = rule.apply(func, target, False)
        except Exception as error:  # noqa: BLE001 (reported below; the next rule may schedule it)
            raise_if_interrupted()
            if _ours(rule) and os.environ.get(STRICT_ENV) == "1":
                raise
            failed.append((rule, error))
            continue
        if scheduled is not None:
            name = type(rule).__name__
            break
    instead = "no rule scheduled it" if name == UNSCHEDULED else f"the {name} rule scheduled it instead"
    for rule, error in failed:
        _report_failed_rule(
            type(rule).__name__,
            kernel or _name_of(func),
            f"{type(error).__name__}: {first_line(error)}",
            instead,
            loud=_ours(rule) or name in FALLBACKS,
        )
    return scheduled, name


def _ours(rule) -> bool:
    return type(rule).__module__.startswith("tvm_diviml.")


def _name_of(func: tirx.PrimFunc) -> str:
    symbol = func.attrs.get("global_symbol") if func.attrs is not None else None
    return str(symbol) if symbol else "a kernel"


@functools.cache
def _report_failed_rule(rule: str, kernel: str, error: str, instead: str, loud: bool) -> None:
    """Once per process for each rule, kernel and error: schedules are made again for every build."""
    (log.warning if loud else log.info)("the %s schedule rule raised on %s (%s); %s", rule, kernel, error, instead)


def apply_rules(func: tirx.PrimFunc, target, rules: list, kernel: str | None = None):
    """``func`` scheduled by the first rule that applies, with that rule's name; unchanged and
    ``UNSCHEDULED`` when none does."""
    scheduled, name = default_schedule(func, target, rules, kernel)
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
            out[gvar] = apply_rules(func, target, rules, gvar.name_hint)[0]
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
