"""Classes, methods and ``self`` attributes of a model file: the one class of a
role, a required method, what ``__init__`` assigns and which attributes hold
parameters or modules of a role. Missing ones are positioned preconditions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    dotted,
    keyword_arg,
    method,
    nodes_of,
    self_assignment,
    walk,
)

# -- the class of a role in this file ---------------------------------------------


def class_here(module: cst.Module, ctx: FileContext, role: str, what: str) -> cst.ClassDef | None:
    """The single class of ``role`` in this file; None when the file has
    none and another file of the package defines one (a model file of FP8
    sublayers beside ``model.py``); otherwise a precondition error."""
    if defined_elsewhere(module, ctx, role):
        return None
    return one_class(module, ctx, role, what)


def defined_elsewhere(module: cst.Module, ctx: FileContext, role: str) -> bool:
    """This file defines no class of ``role``, another file of the package does."""
    return not classes_with_role(module, role) and any(
        class_role(n) == role for n in ctx.port.package_classes
    )


def is_quantized(cls: cst.ClassDef) -> bool:
    """A class running quantized kernels: one of its calls passes
    ``quantization_type=``."""
    return any(keyword_arg(n, "quantization_type") is not None for n in nodes_of(cls, cst.Call))  # type: ignore[arg-type]


# Methods that run at load time or build the module, not on the forward path.
LOAD_TIME = ("__init__", "_setup_weight_loaders", "load_weights", "load_weights_lite", "from_configs")

# -- classes and statements -----------------------------------------------------


def one_class(module: cst.Module, ctx: FileContext, role: str, what: str) -> cst.ClassDef:
    """The single class of ``role`` in the file, or a precondition error."""
    found = classes_with_role(module, role)
    if len(found) != 1:
        names = ", ".join(c.name.value for c in found) or "none"
        raise ctx.refuse(f"expected one {what} class in this file, found: {names}")
    return found[0]


def require_method(module: cst.Module, ctx: FileContext, cls: cst.ClassDef, name: str) -> cst.FunctionDef:
    found = method(cls, name)
    if found is None:
        raise ctx.refuse(f"{cls.name.value} has no {name} method", cls, module)
    return found


def self_assignments(node: cst.CSTNode) -> dict[str, tuple[cst.SimpleStatementLine, cst.BaseExpression]]:
    """``attr -> (statement, value)`` of every ``self.attr = value`` under
    ``node`` (first assignment wins)."""
    found: dict[str, tuple[cst.SimpleStatementLine, cst.BaseExpression]] = {}
    for stmt in nodes_of(node, cst.SimpleStatementLine):
        if isinstance(stmt, cst.SimpleStatementLine):
            pair = self_assignment(stmt)
            if pair is not None and pair[0] not in found:
                found[pair[0]] = (stmt, pair[1])
    return found


def is_parameter(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Call) and dotted(value.func) in (
        "nn.Parameter",
        "torch.nn.Parameter",
        "Parameter",
    )


def parameters(cls: cst.ClassDef) -> dict[str, cst.SimpleStatementLine]:
    """``attr -> statement`` of ``self.attr = nn.Parameter(...)`` in ``cls``."""
    return {attr: stmt for attr, (stmt, value) in self_assignments(cls).items() if is_parameter(value)}


def _call_role(value: cst.BaseExpression) -> str | None:
    """The class role of ``<Class>(...)`` by the called name's suffix."""
    if not isinstance(value, cst.Call):
        return None
    name = dotted(value.func)
    return class_role(name.split(".")[-1]) if name else None


def instances_of_role(module: cst.Module, role: str) -> dict[str, list[cst.SimpleStatementLine]]:
    """``attr -> statements`` of ``self.attr = <Class of role>(...)`` anywhere
    in the module (the role read from the class name's suffix)."""
    found: dict[str, list[cst.SimpleStatementLine]] = {}
    for stmt in nodes_of(module, cst.SimpleStatementLine):
        if isinstance(stmt, cst.SimpleStatementLine):
            pair = self_assignment(stmt)
            if pair is not None and _call_role(pair[1]) == role:
                found.setdefault(pair[0], []).append(stmt)
    return found


def attr_of_role(cls: cst.ClassDef, module: cst.Module, role: str) -> list[str]:
    """Attributes of ``cls`` holding an instance of a class of ``role``
    (``self.self_attn = LlamaAttention(...)`` for ``attention``)."""
    return [attr for attr, (_, value) in self_assignments(cls).items() if _call_role(value) == role]


def param_ctor(stmt: cst.SimpleStatementLine) -> cst.Call | None:
    """``torch.empty(...)`` of ``self.x = nn.Parameter(torch.empty(...))``."""
    pair = self_assignment(stmt)
    value = pair[1] if pair is not None else None
    if not (isinstance(value, cst.Call) and is_parameter(value) and value.args):
        return None
    inner = value.args[0].value
    return inner if isinstance(inner, cst.Call) else None


def forward_path_functions(module: cst.Module) -> list[cst.FunctionDef]:
    """Functions and methods that are not load-time code (``__init__``,
    loader setup, ``load_weights``...)."""
    functions = cast(list[cst.FunctionDef], nodes_of(module, cst.FunctionDef))
    return [node for node in functions if node.name.value not in LOAD_TIME]


def assigned_name(stmt: cst.CSTNode | None) -> str | None:
    """``x`` for a one-target ``x = ...`` statement line."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if (
            isinstance(small, cst.Assign)
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
        ):
            return small.targets[0].target.value
    return None


def assigned_value(stmt: cst.CSTNode) -> cst.BaseExpression | None:
    """The value of a one-target ``x = <value>`` statement line."""
    if assigned_name(stmt) is None or not isinstance(stmt, cst.SimpleStatementLine):
        return None
    small = stmt.body[0]
    return small.value if isinstance(small, cst.Assign) else None


def assigned_call(stmt: cst.CSTNode) -> cst.Call | None:
    """The call of ``x = <call>(...)``."""
    value = assigned_value(stmt)
    return value if isinstance(value, cst.Call) else None


def other_uses(module: cst.Module, attr: str, handled: Iterable[cst.CSTNode]) -> cst.CSTNode | None:
    """The first ``<...>.attr`` attribute read outside ``handled`` nodes."""
    skipped = {id(n) for h in handled for n in walk(h)}
    for node in walk(module):
        if id(node) in skipped:
            continue
        if isinstance(node, cst.Attribute) and node.attr.value == attr:
            return node
    return None
