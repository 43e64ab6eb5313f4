"""Guards of the classes a codemod cannot change: a quantized class (one of
its calls passes ``quantization_type=``) gets an ``__init__`` that raises
``NotImplementedError`` naming the feature, and its kernel calls are
declared handled (they never run)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.base import FileContext
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    dotted,
    method,
    string_value,
    walk,
)


def _guard_message(stmt: cst.CSTNode) -> str | None:
    if (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Raise)
    ):
        exc = stmt.body[0].exc
        if isinstance(exc, cst.Call) and dotted(exc.func) == "NotImplementedError" and len(exc.args) == 1:
            value = exc.args[0].value
            if isinstance(value, cst.SimpleString):
                return string_value(value)
    return None


def _is_super_init(stmt: cst.CSTNode) -> bool:
    if (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
    ):
        call = stmt.body[0].value
        return isinstance(call, cst.Call) and (dotted(call.func) or code_of(call.func)).endswith("__init__")
    return False


def guard_edit(cls: cst.ClassDef, message: str, module: cst.Module) -> dict:
    """An edit making ``cls.__init__`` raise ``NotImplementedError(message)``
    right after ``super().__init__()`` (none when it already does). Guards of
    several codemods are kept sorted by message, so that the codemods commute."""
    init = method(cls, "__init__")
    if init is None or not isinstance(init.body, cst.IndentedBlock):
        raise ValueError(f"{cls.name.value} has no __init__ to guard")
    body = list(init.body.body)
    start = next((i + 1 for i, s in enumerate(body) if _is_super_init(s)), 0)
    end = start
    while end < len(body) and _guard_message(body[end]) is not None:
        end += 1
    messages = [m for s in body[start:end] if (m := _guard_message(s)) is not None]
    if message in messages:
        return {}
    guard = parse_statement(f"raise NotImplementedError({_quoted(message)})", module)
    position = start + sum(1 for m in messages if m < message)

    def edit(updated: cst.FunctionDef) -> cst.FunctionDef:
        stmts = list(updated.body.body)
        stmts.insert(position, guard)
        return updated.with_changes(body=updated.body.with_changes(body=stmts))

    return {id(init): edit}


def declare_guarded(cls: cst.ClassDef, ctx: FileContext, reason: str) -> None:
    """Declare every call of a guarded class unaffected (the class raises
    before any of them runs)."""
    for node in walk(cls):
        if isinstance(node, cst.Call):
            ctx.unaffected(node, f"guarded: {reason}")


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
