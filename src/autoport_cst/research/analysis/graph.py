"""Helpers over the interpreter's symbolic values (:mod:`..interp` nodes),
shared by every section of the code analysis: casts and scalars peeled off
a value, activations and squares recognised, the rotation function's style
read from its source. Nothing here knows about a model or a spec field."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any, TypeGuard

from autoport_cst.research.interp.interpreter import Interpreter
from autoport_cst.research.interp.values import FuncRef, Instance, Node, SliceSym, SourceClass
from autoport_cst.research.interp.walk import children_of, depends_on, walk

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


def sin_cos_table(value: Any) -> FuncRef | None:
    """A call in ``value`` of a source function computing sines and cosines
    (a table of fixed sinusoidal positions: CTRL's ``positional_encoding``),
    or None."""
    for node in walk(value):
        if node.kind == "func" and isinstance(node.ref, FuncRef):
            called = {
                c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", None)
                for c in ast.walk(node.ref.node)
                if isinstance(c, ast.Call)
            }
            if {"sin", "cos"} <= called:
                return node.ref
    return None


def computes_sin_cos(instance: Instance) -> bool:
    """The module's class calls ``sin`` and ``cos`` (a sinusoidal table:
    XGLM's positions)."""
    if not isinstance(instance.cls, SourceClass):
        return False
    called = {
        n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
        for n in ast.walk(instance.cls.node)
        if isinstance(n, ast.Call)
    }
    return {"sin", "cos"} <= called


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


# -- the attention kernel's arguments ------------------------------------------


def kernel_calls(attn: Instance, nodes: list[Node]) -> list[Node]:
    """Calls of the attention kernel: the calls that receive the attention
    module itself (``attention_interface(self, q, k, v, ...)``)."""
    return [
        n
        for n in nodes
        if n.kind == "call"
        and any(isinstance(x, Node) and x.kind == "instance" and x.ref is attn for x in n.args)
    ]


def kernel_instance(kernel: Node) -> Instance:
    """The attention module a kernel call receives."""
    return next(x.ref for x in kernel.args if isinstance(x, Node) and x.kind == "instance")


def _qkv_arguments(call: Node) -> tuple:
    """The kernel's query, key and value: the three arguments after the module."""
    at = next(i for i, x in enumerate(call.args) if isinstance(x, Node) and x.kind == "instance")
    return call.args[at + 1 : at + 4]


def qkv_roles(outputs: list[Any], kernel: Node, in_insts: list[Instance]) -> dict[str, Instance]:
    """The projection behind the kernel's query, key and value arguments,
    on the first forward path (of ``outputs``) where each reads one
    projection (a path updating a cache returns keys and values that read
    both); two found name the third. Empty when no path tells them apart."""
    attn = kernel_instance(kernel)
    for value in outputs:
        for call in kernel_calls(attn, list(walk(value))):
            found: dict[str, Instance] = {}
            for role, arg in zip(("q_proj", "k_proj", "v_proj"), _qkv_arguments(call), strict=False):
                read = unique(
                    [n.ref for n in walk(arg) if n.kind == "module" and any(n.ref is i for i in in_insts)]
                )
                if len(read) == 1:
                    found[role] = read[0]
            rest = [i for i in in_insts if not any(i is f for f in found.values())]
            if len(found) == 2 and len(rest) == 1 and len({id(f) for f in found.values()}) == 2:
                found[next(r for r in ("q_proj", "k_proj", "v_proj") if r not in found)] = rest[0]
            if len({id(f) for f in found.values()}) == 3:
                return found
    return {}


def fused_qkv_layout(
    outputs: list[Any], attn: Instance, nodes: list[Node], proj: Node, width: int, hd: int
) -> tuple[str, tuple[int, str] | None]:
    """How a fused projection's output is split: viewed, then chunked
    (``per_head_interleaved``), in groups other than one head's [q k v]
    (``grouped``, with the groups and their order), or split as it is
    (``concatenated``)."""
    for n in nodes:
        if n.kind == "method" and n.name in ("view", "reshape") and n.args and n.args[0] is proj:
            if tuple(n.args[-2:]) == (3, hd):  # [..., heads, 3, head_dim]: each head's [q k v] (BLOOM)
                return "per_head_interleaved", None
            for m in nodes:
                if (
                    m.kind == "method"
                    and m.name in ("chunk", "split")
                    and m.args
                    and depends_on(m.args[0], n)
                ):
                    grouped = qkv_groups(outputs, attn, nodes, proj, width, hd)
                    return ("grouped" if grouped else "per_head_interleaved"), grouped
    return "concatenated", None


def qkv_groups(
    outputs: list[Any], attn: Instance, nodes: list[Node], proj: Node, width: int, hd: int
) -> tuple[int, str] | None:
    """A fused projection's output (``proj``, ``width`` rows) viewed in groups
    of three equal parts and split (``view(..., -1, 3 * local).split(local)``),
    when a group is not one head's [q k v] (CodeGen: four groups, one per
    model-parallel shard it was trained with, each [q v k]): the number of
    groups and the order of the parts, read from the split part each kernel
    argument reads."""
    views = [
        n
        for n in nodes
        if n.kind == "method" and n.name in ("view", "reshape") and n.args and n.args[0] is proj
    ]
    group = views[0].args[-1] if views and isinstance(views[0].args[-1], int) else None
    if not group or group % 3 or width % group:
        return None
    splits = [
        n
        for n in nodes
        if n.kind == "method"
        and n.name == "split"
        and n.args
        and (n.args[0] is views[0] or depends_on(n.args[0], views[0]))
    ]
    if len(splits) != 1 or splits[0].args[1:2] != (group // 3,):
        return None
    order = _split_order(outputs, attn, splits[0])
    if order is None or (group == 3 * hd and order == "qkv"):
        return None
    return width // group, order


def _split_order(outputs: list[Any], attn: Instance, split: Node) -> str | None:
    """``qkv``, ``qvk``...: the role of each split part, on the first forward
    path where the kernel's query, key and value each read one part."""
    for value in outputs:
        for call in kernel_calls(attn, list(walk(value))):
            parts: dict[int, str] = {}
            for role, arg in zip("qkv", _qkv_arguments(call), strict=False):
                read = {
                    n.args[1]
                    for n in values_walk(arg)
                    if n.kind == "item"
                    and len(n.args) == 2
                    and n.args[0] is split
                    and isinstance(n.args[1], int)
                }
                if len(read) == 1:
                    parts[read.pop()] = role
            if sorted(parts) == [0, 1, 2] and len(set(parts.values())) == 3:
                return "".join(parts[i] for i in range(3))
    return None


def values_walk(value: Any) -> list[Node]:
    """The nodes ``value`` is computed from, not through the dtype, device or
    shape of another tensor (CodeGen's ``query.to(value.dtype)``)."""
    found: dict[int, Node] = {}
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, Node):
            if id(current) in found or (
                current.kind == "attr" and current.name in ("dtype", "device", "shape")
            ):
                continue
            found[id(current)] = current
        if isinstance(current, (Node, tuple, list, dict)):
            stack.extend(children_of(current))
    return list(found.values())


def heads_per_group(nodes: list[Node], proj: Node, width: int, hd: int) -> int | None:
    """Heads per group of a fused projection's output viewed as groups of
    heads, each its query heads, a key and a value head (Falcon's new
    decoder architecture: ``view(b, s, -1, heads // kv_heads + 2, head_dim)``,
    then indexed); None for one run of heads (q, k, v in turn) or [q k v]
    per head."""
    for n in nodes:
        if n.kind == "method" and n.name in ("view", "reshape") and n.args and n.args[0] is proj:
            dims = n.args[1:]
            if len(dims) >= 2 and dims[-1] == hd and isinstance(dims[-2], int):
                per_group = dims[-2]
                return per_group if per_group not in (width // hd, 3) and per_group > 2 else None
    return None


def query_factor(kernel: Node, projections: list[Node]) -> float:
    """The constant the queries are multiplied by between their projection
    and the kernel (OPT's ``q_proj(x) * head_dim ** -0.5`` with the kernel's
    ``scaling=1.0``): it scales the scores as the kernel's scaling does."""
    at = next(i for i, x in enumerate(kernel.args) if isinstance(x, Node) and x.kind == "instance")
    query = kernel.args[at + 1] if len(kernel.args) > at + 1 else None
    factor = 1.0
    for node in walk(query) if isinstance(query, Node) else ():
        if node.kind == "binop" and node.name == "mul" and len(node.args) == 2:
            a, b = node.args
            if number(b) and any(a is p for p in projections):
                factor *= b
            elif number(a) and any(b is p for p in projections):
                factor *= a
    return factor


def call_given(
    value: Any,
    number: int,
    kinds: tuple[str, ...] = ("func", "method", "call"),
    skip: frozenset[str] = frozenset(),
) -> Node | None:
    """The first call of one of ``kinds`` in the computation of ``value``
    that is given ``number`` as an argument (a bias builder given the head
    count); methods named in ``skip`` are passed over."""
    for node in walk(value) if isinstance(value, Node) else ():
        if node.kind == "method" and node.name.rsplit(".", 1)[-1] in skip:
            continue
        if node.kind in kinds and any(
            a == number and not isinstance(a, bool) for a in [*node.args, *(v for _, v in node.kwargs)]
        ):
            return node
    return None
