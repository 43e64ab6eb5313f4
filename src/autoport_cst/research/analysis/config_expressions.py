"""Constants a model computes from several config fields, as arithmetic a
port can compute at run time (``checkpoint.config_keys``).

MiniCPM3 scales each residual branch by ``config.scale_depth /
math.sqrt(config.num_hidden_layers)`` and divides the LM head's input by its
config's ``logits_scaling`` property, ``self.hidden_size /
self.dim_model_base``. :func:`config_expression` reads such an expression
from the code (``ast``) as ``scale_depth / num_hidden_layers ** 0.5``: config
fields, numbers, ``+ - * / // **`` and ``sqrt``; anything else
(a call, a subscript, a field of another object) gives None.
:func:`evaluate` computes one on config values, which research checks
against the constant the model holds before a port is told to read it.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from typing import Any

from autoport_cst.research.findings import CODE, known

_OPERATORS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Pow: "**",
}


def config_expression(node: ast.expr, owners: frozenset[str] = frozenset({"config"})) -> str | None:
    """``node`` over ``<owner>.<field>`` reads (an owner: a name in ``owners``,
    or ``self.config``) as arithmetic of the field names; None when it reads
    anything else or no field."""
    text = _text(node, owners)
    if text is None or not any(isinstance(n, ast.Name) for n in ast.walk(ast.parse(text, mode="eval"))):
        return None
    return text


def _text(node: ast.expr, owners: frozenset[str]) -> str | None:
    if isinstance(node, ast.Attribute) and _is_owner(node.value, owners):
        return node.attr
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return repr(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _text(node.left, owners), _text(node.right, owners)
        if left is None or right is None:
            return None
        return f"({left}) {_OPERATORS[type(node.op)]} ({right})"
    if isinstance(node, ast.Call) and _is_sqrt(node.func) and len(node.args) == 1 and not node.keywords:
        inner = _text(node.args[0], owners)
        return None if inner is None else f"({inner}) ** 0.5"
    return None


def _is_owner(node: ast.expr, owners: frozenset[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in owners
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "config"
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _is_sqrt(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id == "sqrt"
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "sqrt"
        and isinstance(func.value, ast.Name)
        and func.value.id in ("math", "np", "numpy")
    )


def simplified(text: str) -> str:
    """``text`` without the parentheses it does not need."""
    return ast.unparse(ast.parse(text, mode="eval"))


def fields_of(text: str) -> list[str]:
    """The config fields ``text`` reads, in order of first use."""
    names = [n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)]
    return list(dict.fromkeys(names))


def evaluate(text: str, values: Mapping[str, Any]) -> float | None:
    """``text`` computed on ``values``; None when a field is not a number."""
    return _value(ast.parse(text, mode="eval").body, values)


def _value(node: ast.expr, values: Mapping[str, Any]) -> float | None:
    if isinstance(node, ast.Name):
        held = values.get(node.id)
        return float(held) if isinstance(held, (int, float)) and not isinstance(held, bool) else None
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _value(node.operand, values)
        return None if inner is None else -inner
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left, values), _value(node.right, values)
        if left is None or right is None:
            return None
        try:
            return float(_apply(type(node.op), left, right))
        except (ZeroDivisionError, OverflowError, ValueError):
            return None
    return None


def _apply(op: type[ast.operator], left: float, right: float) -> Any:
    if op is ast.Add:
        return left + right
    if op is ast.Sub:
        return left - right
    if op is ast.Mult:
        return left * right
    if op is ast.Div:
        return left / right
    if op is ast.FloorDiv:
        return left // right
    result = left**right
    return result if not isinstance(result, complex) else math.nan


def assigned_in(method: ast.FunctionDef | ast.AsyncFunctionDef, attr: str) -> ast.expr | None:
    """The value of the one ``self.<attr> = <value>`` statement of ``method``."""
    found = [
        stmt.value
        for stmt in ast.walk(method)
        if isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Attribute)
        and stmt.targets[0].attr == attr
        and isinstance(stmt.targets[0].value, ast.Name)
        and stmt.targets[0].value.id == "self"
    ]
    return found[0] if len(found) == 1 else None


def matching(text: str | None, values: Mapping[str, Any], value: float) -> bool:
    """``text`` computes ``value`` on ``values``."""
    if text is None:
        return False
    computed = evaluate(text, values)
    return computed is not None and math.isclose(computed, value, rel_tol=1e-9)


def config_values(config: Any, text: str) -> dict[str, Any]:
    """The fields ``text`` reads, from the interpreter's config view."""
    return {key: config.read(key, None) for key in fields_of(text) if config.has(key)}


def add_config_key(st: Any, name: str, text: str, evidence: str) -> None:
    """Tell the port to compute its field ``name`` as ``text`` from config.json
    (merged into the ``checkpoint.config_keys`` code finding)."""
    held = st.result.get("checkpoint.config_keys")
    keys = dict(held.value) if held is not None and held.known and held.value else {}
    keys[name] = simplified(text)
    shown = "; ".join(f"{k} = {v}" for k, v in sorted(keys.items()))
    st.add(known(keys, "checkpoint.config_keys", CODE, f"{evidence} ({shown})"))
