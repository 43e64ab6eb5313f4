"""Python's operators on the interpreter's values: computed on numbers (and
on strings and sequences where Python adds them), a node on tensors, unknown
otherwise; comparisons and truth only where the answer is known."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

from autoport_cst.research.interp.values import (
    UNKNOWN,
    ActFn,
    BoundMethod,
    FuncRef,
    Instance,
    Node,
    Param,
    SourceClass,
    is_concrete,
    number_like,
    symbolic,
)

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.MatMult: None,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
}
_BINOP_NAMES = {
    ast.Add: "add",
    ast.Sub: "sub",
    ast.Mult: "mul",
    ast.Div: "div",
    ast.FloorDiv: "floordiv",
    ast.Mod: "mod",
    ast.Pow: "pow",
    ast.MatMult: "matmul",
    ast.BitAnd: "and",
    ast.BitOr: "or",
    ast.BitXor: "xor",
    ast.LShift: "lshift",
    ast.RShift: "rshift",
}
_CMPOPS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
}


def binop(op: ast.operator, left: Any, right: Any) -> Any:
    func = _BINOPS.get(type(op))
    if func is not None and number_like(left) and number_like(right):
        try:
            return func(left, right)
        except (ArithmeticError, TypeError, ValueError):
            return UNKNOWN
    if isinstance(left, (str, tuple, list)) and isinstance(right, type(left)) and isinstance(op, ast.Add):
        return operator.add(left, right)
    if left is UNKNOWN and right is UNKNOWN:
        return UNKNOWN
    return Node("binop", _BINOP_NAMES[type(op)], (symbolic(left), symbolic(right)))


def unary(op: ast.unaryop, value: Any) -> Any:
    if isinstance(op, ast.Not):
        known = truth(value)
        return (not known) if isinstance(known, bool) else UNKNOWN
    if number_like(value):
        return _UNARY[type(op)](value)
    if isinstance(value, (Node, Param)):
        return Node("unary", type(op).__name__.lower(), (symbolic(value),))
    return UNKNOWN


def compare(op: ast.cmpop, left: Any, right: Any) -> Any:
    if isinstance(op, (ast.Is, ast.IsNot)) and right is None:
        if isinstance(left, Node):
            if left.maybe_none:
                return UNKNOWN
            return isinstance(op, ast.IsNot)
        if isinstance(left, (Instance, Param, ActFn, BoundMethod, FuncRef)):
            return isinstance(op, ast.IsNot)
    if left is UNKNOWN or right is UNKNOWN or not is_concrete(left) or not is_concrete(right):
        return UNKNOWN
    try:
        return bool(_CMPOPS[type(op)](left, right))
    except TypeError:
        return UNKNOWN


def truth(value: Any) -> bool | None:
    """``bool(value)`` where it is known; None where it is not."""
    if value is UNKNOWN:
        return None
    if isinstance(value, Node):
        return None
    if isinstance(value, (Instance, Param, ActFn, FuncRef, BoundMethod, SourceClass)):
        return True
    if is_concrete(value):
        return bool(value)
    return None
