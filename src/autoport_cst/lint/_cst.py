"""Small helpers over LibCST nodes used by the engine and the rules.

They work on plain nodes with ``isinstance`` checks. ``libcst.matchers`` is not
imported on the lint path: its import alone costs about half a second, more
than the whole budget of a pre-commit run on one file.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import libcst as cst


def dotted(node: cst.CSTNode | None) -> str | None:
    """``torch.nn.Module`` for an Attribute chain of Names, ``x`` for a Name,
    None for anything else."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def call_name(node: cst.CSTNode | None) -> str | None:
    """Dotted name of a call's function (``NF.attention_decode``), or None."""
    if isinstance(node, cst.Call):
        return dotted(node.func)
    return None


def method_name(call: cst.Call) -> str | None:
    """``to`` for ``<anything>.to(...)``; None for calls of plain names."""
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def receiver(call: cst.Call) -> cst.BaseExpression | None:
    """``x`` for ``x.m(...)``."""
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.value
    return None


def keyword(call: cst.Call, name: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def positional(call: cst.Call) -> list[cst.Arg]:
    return [a for a in call.args if a.keyword is None and not a.star]


def has_star_args(call: cst.Call) -> bool:
    return any(a.star for a in call.args)


def is_none(node: cst.CSTNode | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def string_value(node: cst.CSTNode | None) -> str | None:
    """The text of a plain (non-f, non-bytes) string literal, else None."""
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    if isinstance(node, cst.ConcatenatedString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def int_value(node: cst.CSTNode | None) -> int | None:
    """The value of an integer literal, including a negated one."""
    if isinstance(node, cst.Integer):
        try:
            return int(node.value, 0)
        except ValueError:
            return None
    if (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
    ):
        value = int_value(node.expression)
        return None if value is None else -value
    return None


def self_attribute(node: cst.CSTNode | None) -> str | None:
    """``foo`` for ``self.foo``."""
    if (
        isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and node.value.value == "self"
    ):
        return node.attr.value
    return None


def strip_optional(annotation: cst.BaseExpression | None) -> list[cst.BaseExpression]:
    """The alternatives of an annotation: ``Optional[X]``, ``X | None`` and
    ``Union[X, Y]`` are unpacked; a string annotation is left as is."""
    if annotation is None:
        return []
    if isinstance(annotation, cst.BinaryOperation) and isinstance(annotation.operator, cst.BitOr):
        return strip_optional(annotation.left) + strip_optional(annotation.right)
    if isinstance(annotation, cst.Subscript):
        base = dotted(annotation.value)
        if base in ("Optional", "typing.Optional", "Union", "typing.Union"):
            out: list[cst.BaseExpression] = []
            for element in annotation.slice:
                if isinstance(element.slice, cst.Index):
                    out += strip_optional(element.slice.value)
            return out
    return [annotation]


_NODE_FIELDS: dict[type, tuple[str, ...]] = {}


def iter_nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and every node under it (whitespace fields skipped)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        t = type(current)
        fields = _NODE_FIELDS.get(t)
        if fields is None:
            fields = _NODE_FIELDS[t] = tuple(
                f.name for f in dataclasses.fields(t) if not f.name.startswith("whitespace")
            )
        for name in fields:
            value = getattr(current, name)
            if isinstance(value, cst.CSTNode):
                stack.append(value)
            elif isinstance(value, (tuple, list)):
                stack.extend(v for v in value if isinstance(v, cst.CSTNode))
