"""The attention classes of a model file and every attention kernel call in
them, path by path (flash, segmented, segmented with CP, decode, and the
op-by-op substitutes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.anatomy.classes import is_parameter
from autoport_cst.transform.anatomy.sites import is_forward_method
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    dotted,
    is_call,
    nodes_of,
    self_assignment,
    self_attr,
    walk,
)

# -- the kernel sites of an attention class ------------------------------------------------

FLASH, SEGMENTED, SEGMENTED_CP, DECODE = "flash", "segmented", "segmented_cp", "decode"

UNFUSED_DECODE_CALL = "_attention_decode_unfused"


UNFUSED_PREFILL_CALL = "_flash_attention_unfused"


UNFUSED_SEGMENTED_CALL = "_segmented_attention_unfused"

_KINDS = {
    "flash_attention": FLASH,
    UNFUSED_PREFILL_CALL: FLASH,
    "segmented_attention": SEGMENTED,
    UNFUSED_SEGMENTED_CALL: SEGMENTED,
    "attention_decode": DECODE,
    UNFUSED_DECODE_CALL: DECODE,
}

KERNEL_NAMES = {
    FLASH: "NF.flash_attention",
    SEGMENTED: "NF.segmented_attention",
    SEGMENTED_CP: "NF.segmented_attention_cp",
    DECODE: "NF.attention_decode",
}


def kernel_kind(call: cst.Call) -> str | None:
    """The kind of attention kernel ``call`` runs (its substitute counts as
    the kernel; any call whose name holds ``segmented_attention_cp``, such as
    a module helper wrapping it, is the context-parallel kind)."""
    name = dotted(call.func)
    if name is None or name.startswith("self."):
        return None
    last = name.rsplit(".", 1)[-1]
    if "segmented_attention_cp" in last:
        return SEGMENTED_CP
    return _KINDS.get(last)


@dataclass(frozen=True)
class KernelSite:
    call: cst.Call
    kind: str
    method: cst.FunctionDef

    def where(self, cls: cst.ClassDef) -> str:
        return f"{cls.name.value}.{self.method.name.value}"


def kernel_sites(cls: cst.ClassDef) -> list[KernelSite]:
    """Every attention kernel call in the forward methods of ``cls``."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    sites = []
    for func in body:
        if not isinstance(func, cst.FunctionDef) or not is_forward_method(func):
            continue
        for node in cast(list[cst.Call], nodes_of(func, cst.Call)):
            if (kind := kernel_kind(node)) is not None:
                sites.append(KernelSite(node, kind, func))
    return sites


def attention_classes_in(module: cst.Module, ctx: FileContext) -> list[cst.ClassDef]:
    """The attention classes of this file (``<Prefix>Attention`` with a fused
    ``self.qkv_proj_weight`` parameter). A file without one (an FP8 variant's
    helpers, an embedding runner) is left alone, unless it runs attention
    kernels elsewhere or the package has no attention class at all."""
    found = [c for c in classes_with_role(module, "attention") if _has_parameter(c, "qkv_proj_weight")]
    if found:
        return found
    stray = next((n for n in walk(module) if isinstance(n, cst.Call) and kernel_kind(n) is not None), None)
    if stray is not None or not any(class_role(name) == "attention" for name in ctx.port.package_classes):
        raise ctx.refuse(
            "no attention class (<Prefix>Attention with "
            "self.qkv_proj_weight = nn.Parameter(...)) in this file",
            stray,
            module,
        )
    return []


def _has_parameter(cls: cst.ClassDef, name: str) -> bool:
    for node in cast(list[cst.Assign], nodes_of(cls, cst.Assign)):
        if len(node.targets) == 1 and self_attr(node.targets[0].target) == name and is_parameter(node.value):
            return True
    return False


# -- finding targets -------------------------------------------------------------


def self_parameters(cls: cst.ClassDef) -> dict[str, cst.SimpleStatementLine]:
    """``self.<name> = nn.Parameter(...)`` statements of a class, by name."""
    found: dict[str, cst.SimpleStatementLine] = {}
    for node in nodes_of(cls, cst.SimpleStatementLine):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and is_parameter(pair[1]):
                found.setdefault(pair[0], node)
    return found


def attention_classes(module: cst.Module, ctx: FileContext) -> list[cst.ClassDef]:
    """Attention classes with a fused ``self.qkv_proj_weight`` parameter."""
    found = [c for c in classes_with_role(module, "attention") if "qkv_proj_weight" in self_parameters(c)]
    if not found:
        raise ctx.refuse(
            "no attention class (<Prefix>Attention with "
            "self.qkv_proj_weight = nn.Parameter(...)) in this file"
        )
    return found


def calls_in(node: cst.CSTNode, name: str) -> list[cst.Call]:
    return [n for n in walk(node) if isinstance(n, cst.Call) and is_call(n, name)]


def statement_containing(func: cst.FunctionDef, target: cst.CSTNode) -> cst.BaseStatement | None:
    """The top-level statement of ``func``'s body that contains ``target``."""
    body = func.body.body if isinstance(func.body, cst.IndentedBlock) else []
    for stmt in body:
        if any(n is target for n in walk(stmt)):
            return stmt
    return None


def find_self_assignment_deep(func: cst.FunctionDef, attr: str):
    for node in walk(func):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and pair[0] == attr:
                return node
    return None
