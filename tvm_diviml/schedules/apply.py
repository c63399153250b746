"""Every kernel of a module scheduled by the default rules for its target (ours on llvm, dlight's on
GPUs), as the build and the cost model both do it. Each scheduled PrimFunc carries the name of what
scheduled it (``RULE_ATTR``).

A rule declines a kernel by returning None, and the next rule is tried. A rule that raises has a bug,
and its error propagates, as in dlight: were it taken for a decline, a broken ``Conv2d`` would quietly
leave its convolutions to the ``Fallback`` schedule, many times slower."""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

import tvm
from tvm import tirx
from tvm.s_tir import dlight

from .rules import cpu_rules, declining_where_it_asserts

RULE_ATTR = "diviml.schedule"  # the rule that scheduled a PrimFunc, or "tuned"
UNSCHEDULED = "unscheduled"
FALLBACKS = ("Fallback", UNSCHEDULED)  # what schedules a kernel that no class rule took
# This package's modules that decide no CPU kernel's schedule: its map, the tuning records' application,
# and the target (which the profile cache keys on its own).
NOT_SCHEDULING = frozenset({"__init__.py", "database.py", "target.py"})
GpuGEMV = declining_where_it_asserts(dlight.gpu.GEMV)  # named GEMV, as dlight's


def gpu_rules() -> list:
    return [
        dlight.gpu.Matmul(),
        GpuGEMV(),
        dlight.gpu.Reduction(),
        dlight.gpu.GeneralReduction(),
        dlight.gpu.Fallback(),
    ]


def rules_for(target) -> list:
    return cpu_rules() if target.kind.name == "llvm" else gpu_rules()


def default_schedule(func: tirx.PrimFunc, target, rules: list | None = None, kernel: str | None = None):
    """The schedule of the first rule that applies to ``func`` and that rule's name; (None,
    ``UNSCHEDULED``) when none does. An error a rule raises propagates, with a note naming the rule
    and the kernel (``kernel``, else the function's symbol)."""
    for rule in rules if rules is not None else rules_for(target):
        try:
            with target:
                scheduled = rule.apply(func, target, False)
        except Exception as error:
            error.add_note(f"raised by the {type(rule).__name__} schedule rule on {kernel or _name_of(func)}")
            raise
        if scheduled is not None:
            return scheduled, type(rule).__name__
    return None, UNSCHEDULED


def _name_of(func: tirx.PrimFunc) -> str:
    symbol = func.attrs.get("global_symbol") if func.attrs is not None else None
    return str(symbol) if symbol else "a kernel"


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
    """What the default CPU schedules are, as the profile cache keys them: a changed rule times its
    kernels again, a changed comment or docstring does not."""
    return schedules_digest(Path(__file__).parent)


def schedules_digest(folder: Path) -> str:
    """A digest of the code of the modules in ``folder`` that decide schedules (``NOT_SCHEDULING``
    left out): their syntax trees, which hold no comments, with the docstrings dropped."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        if path.name not in NOT_SCHEDULING:
            tree = _WithoutDocstrings().visit(ast.parse(path.read_text(), path.name))
            digest.update(f"{path.name}\n{ast.dump(tree)}\n".encode())
    return digest.hexdigest()[:12]


class _WithoutDocstrings(ast.NodeTransformer):
    """A syntax tree less its docstrings: every statement that is a string alone, which does nothing."""

    def visit_Expr(self, node: ast.Expr) -> ast.Expr | None:
        is_string = isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        return None if is_string else node


def schedule_names(mod) -> dict[str, str]:
    """PrimFunc name -> what scheduled it (a rule, "tuned" or "unscheduled")."""
    return {
        gvar.name_hint: str(func.attrs[RULE_ATTR]) if func.attrs and RULE_ATTR in func.attrs else UNSCHEDULED
        for gvar, func in mod.functions_items()
        if isinstance(func, tirx.PrimFunc)
    }
