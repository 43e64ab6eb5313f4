"""Helpers over the interpreter's symbolic values (:mod:`..interp` nodes),
shared by every section of the code analysis: casts and scalars peeled off
a value, activations and squares recognised, the rotation function's style
read from its source. Nothing here knows about a model or a spec field."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any, TypeGuard

from autoport_cst.research.interp.interpreter import Interpreter
from autoport_cst.research.interp.values import FuncRef, Node, SliceSym
from autoport_cst.research.interp.walk import walk

_TORCH_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "relu": "relu"}
_CASTS = {"to", "float", "type_as", "contiguous", "half", "bfloat16", "type", "clone"}


def first_int(args: dict[str, Any]) -> int | None:
    for key, value in args.items():
        if key == "config":
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, (tuple, list)) and value and isinstance(value[-1], int):
            return value[-1]
    return None


def strip_casts(value: Any) -> Any:
    """Drop dtype casts and dropout (the identity at inference)."""
    while (
        isinstance(value, Node)
        and value.args
        and (
            (value.kind == "method" and value.name in _CASTS)
            or (value.kind == "call" and value.name.rsplit(".", 1)[-1] == "dropout")
        )
    ):
        value = value.args[0]
    return value


def is_square(value: Any) -> bool:
    if not isinstance(value, Node):
        return False
    if value.kind == "method" and value.name == "pow" and len(value.args) > 1 and value.args[1] == 2:
        return True
    if value.kind == "call" and value.name.endswith(".pow") and len(value.args) > 1 and value.args[1] == 2:
        return True
    if value.kind == "binop" and value.name == "pow" and value.args[1] == 2:
        return True
    if value.kind == "method" and value.name == "square":
        return True
    if value.kind == "binop" and value.name == "mul":
        a, b = (strip_casts(x) for x in value.args)
        return a is b
    return False


def is_one(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1


def param_inside(value: Any) -> bool:
    return any(n.kind == "param" for n in walk(value))


def torch_activation(node: Node) -> str | None:
    if node.kind != "call":
        return None
    short = node.name.rsplit(".", 1)[-1]
    if short in _TORCH_ACTIVATIONS and ("functional" in node.name or node.name.startswith("torch")):
        if short == "gelu" and node.kwarg("approximate") == "tanh":
            return "gelu_pytorch_tanh"
        return short
    return None


def number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def scalar_path(
    value: Any,
    stop: Callable[[Any], bool],
    max_steps: int = 64,
    transparent: Callable[[Node], bool] | None = None,
) -> tuple[float, list[str], bool]:
    """Follow ``value`` down through casts, dropout and scalar products/
    quotients until ``stop`` matches. Returns (product of the scalars, the
    operations seen, whether ``stop`` was reached)."""
    factor = 1.0
    ops: list[str] = []
    for _ in range(max_steps):
        if stop(value):
            return factor, ops, True
        if not isinstance(value, Node):
            return factor, ops, False
        if strip_casts(value) is not value:
            value = strip_casts(value)
            continue
        if value.kind == "binop" and value.name in ("mul", "div"):
            a, b = value.args
            if value.name == "mul" and number(b):
                factor *= b
                ops.append(f"* {b:g}")
                value = a
                continue
            if value.name == "mul" and number(a):
                factor *= a
                ops.append(f"* {a:g}")
                value = b
                continue
            if value.name == "div" and number(b) and b != 0:
                factor /= b
                ops.append(f"/ {b:g}")
                value = a
                continue
        if value.kind == "module" and value.ref is not None and value.args:
            if transparent is not None and transparent(value):
                value = value.args[0]
                continue
            return factor, ops, False
        if value.kind == "item" and value.args and isinstance(value.args[1], int):
            inner = value.args[0]
            if stop(inner):
                return factor, ops, True
            value = inner
            continue
        return factor, ops, False
    return factor, ops, False


def peel_scalars(value: Any) -> Any:
    for _ in range(16):
        value = strip_casts(value)
        if isinstance(value, Node) and value.kind == "binop" and value.name in ("mul", "div"):
            a, b = value.args
            if number(b):
                value = a
                continue
            if value.name == "mul" and number(a):
                value = b
                continue
        return value
    return value


def unique(items: list) -> list:
    out: list = []
    for item in items:
        if not any(item is o for o in out):
            out.append(item)
    return out


def ranges(values: list[int]) -> str:
    if not values:
        return "none"
    parts = []
    start = prev = values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


def has_step2(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, slice) and i.step == 2 for i in items) or any(
        isinstance(i, SliceSym) and i.step == 2 for i in items
    )


def rotation_style(func: FuncRef, interp: Interpreter, depth: int = 0) -> str | None:
    """rotate_half (pairs i, i + d/2) or interleaved (pairs 2i, 2i + 1), from
    the slicing a rotation function (and the functions it calls) applies."""
    if depth > 3:
        return None
    interleaved = halves = False
    negation = False
    callees: list[FuncRef] = []
    for node in ast.walk(func.node):
        if isinstance(node, ast.Subscript):
            for sl in _slices(node.slice):
                if isinstance(sl.step, ast.Constant) and sl.step.value == 2:
                    interleaved = True
                for bound in (sl.lower, sl.upper):
                    if (
                        isinstance(bound, ast.BinOp)
                        and isinstance(bound.op, ast.FloorDiv)
                        and isinstance(bound.right, ast.Constant)
                        and bound.right.value == 2
                    ):
                        halves = True
        elif isinstance(node, ast.Call):
            name = (
                node.func.attr
                if isinstance(node.func, ast.Attribute)
                else (node.func.id if isinstance(node.func, ast.Name) else "")
            )
            if name in ("repeat_interleave", "view_as_complex"):
                # view_as_complex reads the last dim as (real, imaginary) pairs: adjacent elements
                interleaved = True
            if name == "chunk" and any(isinstance(a, ast.Constant) and a.value == 2 for a in node.args):
                halves = True
            if isinstance(node.func, ast.Name):
                target = interp.global_value(func.module, node.func.id)
                if isinstance(target, FuncRef) and target.node is not func.node:
                    callees.append(target)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            negation = True
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            negation = True
    for callee in callees:
        style = rotation_style(callee, interp, depth + 1)
        if style == "interleaved":
            interleaved = True
        elif style == "rotate_half":
            halves = True
    if interleaved:
        return "interleaved"
    if halves and (negation or callees):
        return "rotate_half"
    return None


def _slices(node: ast.expr) -> list[ast.Slice]:
    if isinstance(node, ast.Slice):
        return [node]
    if isinstance(node, ast.Tuple):
        return [e for e in node.elts if isinstance(e, ast.Slice)]
    return []


def strip_shape(value: Any) -> Any:
    """Drop casts and shape-only methods (``squeeze``, ``view``...)."""
    value = strip_casts(value)
    while (
        isinstance(value, Node)
        and value.kind == "method"
        and value.args
        and value.name in ("squeeze", "unsqueeze", "view", "reshape", "flatten", "expand_as", "expand")
    ):
        value = strip_casts(value.args[0])
    return value


def vector_shape(shape: tuple) -> bool:
    """A shape ``[n]`` or ``[1, n]``."""
    return len(shape) == 1 or (len(shape) == 2 and shape[0] == 1)
