"""Which way a rotation of the halves turns, read by running the modeling
code's own rotation function.

transformers' ``rotate_half(x)`` is ``cat((-x2, x1))`` (x1, x2 the halves of
each head), so that ``x * cos + rotate_half(x) * sin`` turns each pair
``(x1[j], x2[j])`` by the position's angle. NanoChat's is ``cat((x2, -x1))``:
the same pairs turned the other way, which equals the usual rotation of the
head with its halves swapped, swapped back (``P R P``, ``P`` the swap of the
halves). Both read as "halves and a negation" in the code; the function
(``apply_rotary_pos_emb(q, k, cos, sin)``) is called with ``cos = 0`` and
``sin = 1`` on a head ``1 .. d``, where it returns ``rotate_half`` itself:
``[-(d/2 + 1) .. -d, 1 .. d/2]`` for the usual turn, ``[d/2 + 1 .. d, -1
.. -d/2]`` for the swapped one."""

from __future__ import annotations

import ast
import importlib
from typing import Literal

HEAD = 8  # the width of the probed head
Turn = Literal["rotate_half", "rotate_half_swapped"]


def halves_turn(module: str, function: str) -> Turn | None:
    """The turn of the rotation ``function`` of ``module`` (called as
    ``function(q, k, cos, sin)``); None when the call fails or returns
    neither."""
    try:
        import torch

        rotate = getattr(importlib.import_module(module), function)
        head = torch.arange(1.0, HEAD + 1.0).reshape(1, 1, 1, HEAD)
        cos, sin = torch.zeros(1, 1, HEAD), torch.ones(1, 1, HEAD)
        out = rotate(head, head.clone(), cos, sin)
    except Exception:  # noqa: BLE001 - a function of another signature: not read
        return None
    rotated = out[0] if isinstance(out, (tuple, list)) else out
    if not hasattr(rotated, "shape") or tuple(rotated.shape) != (1, 1, 1, HEAD):
        return None
    first, second = head[..., : HEAD // 2], head[..., HEAD // 2 :]
    if torch.equal(rotated, torch.cat((-second, first), dim=-1)):
        return "rotate_half"
    if torch.equal(rotated, torch.cat((second, -first), dim=-1)):
        return "rotate_half_swapped"
    return None


def reads_usual_turn(tree: ast.Module, function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the text alone shows the usual turn, so that the module need
    not be imported to run ``function``: it calls ``rotate_half`` by name,
    and the module's ``rotate_half`` returns ``torch.cat((-x2, x1), ...)``
    with ``x1`` a slice up to a bound and ``x2`` a slice from one (the first
    and the second half)."""
    if not any(isinstance(c, ast.Call) and _named(c.func, "rotate_half") for c in ast.walk(function)):
        return False
    helpers = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "rotate_half"]
    if len(helpers) != 1 or not isinstance(last := helpers[0].body[-1], ast.Return):
        return False
    call = last.value
    if not (isinstance(call, ast.Call) and _named(call.func, "cat") and call.args):
        return False
    parts = call.args[0]
    if not (isinstance(parts, (ast.Tuple, ast.List)) and len(parts.elts) == 2):
        return False
    negated, kept = parts.elts
    if not (isinstance(negated, ast.UnaryOp) and isinstance(negated.op, ast.USub)):
        return False
    halves = _slices(helpers[0])
    return (
        _name_of(negated.operand) in halves
        and _name_of(kept) in halves
        and (
            halves[_name_of(negated.operand)],
            halves[_name_of(kept)],
        )
        == ("second", "first")
    )


def _named(func: ast.expr, name: str) -> bool:
    return (isinstance(func, ast.Name) and func.id == name) or (
        isinstance(func, ast.Attribute) and func.attr == name
    )


def _name_of(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else ""


def _slices(helper: ast.FunctionDef) -> dict[str, str]:
    """``name -> "first" | "second"``: names assigned ``x[..., :n]`` (an
    upper bound only) or ``x[..., n:]`` (a lower bound only)."""
    out = {}
    for stmt in helper.body:
        if not (
            isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Subscript)
        ):
            continue
        index = stmt.value.slice
        last = index.elts[-1] if isinstance(index, ast.Tuple) and index.elts else index
        if isinstance(last, ast.Slice) and last.step is None:
            if last.lower is None and last.upper is not None:
                out[_name_of(stmt.targets[0])] = "first"
            elif last.lower is not None and last.upper is None:
                out[_name_of(stmt.targets[0])] = "second"
    return out
