"""A module of fixed sinusoidal positions read from its code (XGLM's
``XGLMSinusoidalPositionalEmbedding``): the table of tensor2tensor's
layout, whose row ``p`` is ``[sin(p * f_0) .. sin(p * f_{h-1}), cos(p *
f_0) .. cos(p * f_{h-1})]`` for ``h`` = half the width and ``f_i = exp(-i *
log(base) / (h - 1))`` (a zero column when the width is odd), with the row
of a padding index set to zero; the forward's rows are the positions plus
a constant offset. What a port needs to compute the same rows: the base,
the offset, and the config field of the padding index. A table computed
otherwise is not read: the reason says which part."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.interp.values import Instance, Node, SourceClass
from autoport_cst.research.interp.walk import walk


@dataclass(frozen=True)
class SinusoidalTable:
    base: float
    offset: int
    padding_key: str | None
    evidence: str


def read(st: AnalyzerState, module: Instance) -> SinusoidalTable | str:
    """The table ``module`` computes, or what of it was not read."""
    if not isinstance(module.cls, SourceClass):
        return "its class is not in the source"
    builder = _builder(module.cls)
    if builder is None:
        return "no one function of its class computes both the sines and the cosines"
    where = f"{module.class_name}.{builder.name}"
    base = _base(builder)
    if base is None:
        return f"{where}: no frequencies exp(-i * log(base) / (half - 1)) of a base written in the code"
    if not _sines_then_cosines(builder):
        return f"{where}: not torch.cat([sin(x), cos(x)]) (the sines of the first half, the cosines of the second)"
    offset = _offset(st, module)
    if offset is None:
        return f"{module.class_name}.forward: the rows looked up are not the positions plus a constant"
    padding, problem = _padding_key(module, builder)
    if problem is not None:
        return f"{where}: {problem}"
    evidence = (
        f"{where}: rows [sin, cos] of the positions times exp(-i * log({base:g}) / (half - 1)), "
        f"row position + {offset}" + (f", the row config.{padding} zero" if padding is not None else "")
    )
    return SinusoidalTable(base, offset, padding, evidence)


def _builder(cls: SourceClass) -> ast.FunctionDef | None:
    found = [
        f
        for f in cls.node.body
        if isinstance(f, ast.FunctionDef) and {"sin", "cos"} <= {_called(c) for c in ast.walk(f)}
    ]
    return found[0] if len(found) == 1 else None


def _called(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)


def _halves(fn: ast.FunctionDef) -> set[str]:
    """Names assigned ``<parameter> // 2`` (half the width)."""
    params = {a.arg for a in fn.args.args}
    return {
        t.id
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.BinOp)
        and isinstance(n.value.op, ast.FloorDiv)
        and isinstance(n.value.left, ast.Name)
        and n.value.left.id in params
        and isinstance(n.value.right, ast.Constant)
        and n.value.right.value == 2
        for t in n.targets
        if isinstance(t, ast.Name)
    }


def _base(fn: ast.FunctionDef) -> float | None:
    """``log(<base>) / (<half> - 1)``, exponentiated negated (``exp(arange(half)
    * -step)``): the base."""
    halves = _halves(fn)
    for n in ast.walk(fn):
        if not (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and _called(n.left) == "log"):
            continue
        log = n.left
        assert isinstance(log, ast.Call)
        arg = log.args[0] if len(log.args) == 1 else None
        right = n.right
        if (
            isinstance(arg, ast.Constant)
            and isinstance(arg.value, (int, float))
            and not isinstance(arg.value, bool)
            and arg.value > 1
            and isinstance(right, ast.BinOp)
            and isinstance(right.op, ast.Sub)
            and isinstance(right.left, ast.Name)
            and right.left.id in halves
            and isinstance(right.right, ast.Constant)
            and right.right.value == 1
            and _negated_exponent(fn)
        ):
            return float(arg.value)
    return None


def _negated_exponent(fn: ast.FunctionDef) -> bool:
    """``exp(<...> * -<step>)``: frequencies falling with the index."""
    return any(
        _called(n) == "exp"
        and n.args
        and any(isinstance(u, ast.UnaryOp) and isinstance(u.op, ast.USub) for u in ast.walk(n.args[0]))
        for n in ast.walk(fn)
        if isinstance(n, ast.Call)
    )


def _sines_then_cosines(fn: ast.FunctionDef) -> bool:
    """``cat([sin(x), cos(x)], dim=1)`` (or -1) of one name."""
    for n in ast.walk(fn):
        if _called(n) != "cat" or not isinstance(n, ast.Call) or not n.args:
            continue
        parts = n.args[0]
        if not (isinstance(parts, (ast.List, ast.Tuple)) and len(parts.elts) == 2):
            continue
        calls = [e for e in parts.elts if isinstance(e, ast.Call) and len(e.args) == 1]
        if len(calls) != 2:
            continue
        names = {ast.dump(c.args[0]) for c in calls}
        dims = [k.value for k in n.keywords if k.arg == "dim"] + n.args[1:2]
        last = len(dims) == 1 and isinstance(dims[0], (ast.Constant, ast.UnaryOp))
        if [_called(c) for c in calls] == ["sin", "cos"] and len(names) == 1 and last:
            return ast.literal_eval(dims[0]) in (1, -1)
    return False


def _offset(st: AnalyzerState, module: Instance) -> int | None:
    """The integer the forward adds to its first input (the position ids)
    on every path: the rows before position 0."""
    found = set()
    for value in st.outputs(module):
        adds = [
            n
            for n in walk(value)
            if n.kind == "binop"
            and n.name == "add"
            and len(n.args) == 2
            and any(isinstance(a, Node) and a.kind == "input" for a in n.args)
        ]
        ints = [a for n in adds for a in n.args if isinstance(a, int) and not isinstance(a, bool)]
        if len(ints) != 1:
            return None
        found.add(ints[0])
    return found.pop() if len(found) == 1 else None


def _padding_key(module: Instance, fn: ast.FunctionDef) -> tuple[str | None, str | None]:
    """The config field of the row the builder sets to zero (``emb[padding_idx,
    :] = 0``, the parameter given the module's constructor argument of that
    name; None when it zeroes none or the argument is None), and what could
    not be told."""
    zeroed = [
        t.slice.elts[0].id
        if isinstance(t.slice, ast.Tuple) and isinstance(t.slice.elts[0], ast.Name)
        else None
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and n.value.value == 0
        for t in n.targets
        if isinstance(t, ast.Subscript)
    ]
    if not zeroed:
        return None, None
    name = zeroed[0]
    if len(zeroed) != 1 or name is None or name not in module.args:
        return None, "a row set to zero that is not a constructor argument's"
    if module.args[name] is None:
        return None, None
    keys = sorted(module.reads.get(name, ()))
    if len(keys) != 1:
        return None, f"the padding row {name} read from {len(keys)} config fields"
    return keys[0], None
