"""RoPE taken out of a port's attention methods, backbone and module
(learned-positions, alibi-positions): the ``cos, sin = position_embeddings``
unpacking removed, what is computed from it bound to None, any other use of
the rotation refused; the backbone's ``self.rotary_emb`` call bound to None
and its construction removed; the rotary class and the rotation helpers
dropped when nothing else names them."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.base import locate
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import (
    assigns_call_of,
    deep_statements,
    dotted,
    simple_assign,
    statements,
    walk,
)
from autoport_cst.transform.edit.tree import with_comment


def unrotated(
    cls_name: str, func: cst.FunctionDef, module: cst.Module, ctx: FileContext, edits: dict
) -> None:
    """In one attention method: the ``cos, sin = position_embeddings``
    unpacking removed, the assignments computed from the rotation bound to
    None (a reassignment dropped); its None-bound names may still be passed
    as call arguments; an explicit ``q, k = apply_rotary_pos_emb(q, k, cos,
    sin)`` (a forward path rotating outside a kernel) dropped, q and k left
    unrotated; any other use of the rotation refuses, naming its statement."""
    roots: set[str] = set()
    derived: set[str] = set()
    params = {p.name.value for p in func.params.params}
    for stmt in deep_statements(func):
        if isinstance(stmt, cst.BaseCompoundStatement):
            if _header_names(stmt) & (roots | derived):
                raise _uses(cls_name, func, stmt, module, ctx)
            continue
        pair = simple_assign(stmt)
        if any(dotted(c.func) in ROTATION_HELPERS for c in _calls(stmt)):
            kept = _unrotated_call(pair, roots | derived, module)
            if kept is None:
                raise _rotations_kept(cls_name, func, stmt, module, ctx)
            edits[id(stmt)] = kept
            continue
        if pair is not None and dotted(pair[1]) == "position_embeddings" and isinstance(pair[0], cst.Tuple):
            roots |= {dotted(e.value) or "" for e in pair[0].elements}
            edits[id(stmt)] = lambda updated: cst.RemoveFromParent()
            continue
        used = [n for n in _read_names(stmt) if n.value in roots | derived]
        if not used:
            continue
        passed = {id(a.value) for c in _calls(stmt) for a in c.args if isinstance(a.value, cst.Name)}
        if all(id(n) in passed and n.value in derived for n in used):
            continue  # a None-bound name handed to a kernel: no rotation
        target = dotted(pair[0]) if pair is not None else None
        if target is None:
            raise _uses(cls_name, func, stmt, module, ctx)
        if target in derived or target in params:
            edits[id(stmt)] = lambda updated: cst.RemoveFromParent()
        else:
            edits[id(stmt)] = lambda updated, t=target: parse_statement(f"{t} = None", module).with_changes(
                leading_lines=updated.leading_lines
            )
            derived.add(target)
    _drop_orphans(func, edits)


def _unrotated_call(pair, rotation: set[str], module: cst.Module):
    """The edit of ``q, k = apply_rotary_pos_emb(q, k, cos, sin)`` (or
    ``x = _apply_rotary_emb(x, cos, sin)``) applied on a forward path: the
    rotation dropped, the targets bound to the tensors unrotated (the
    statement removed when they are the same names); None when the statement
    is not such a call of a helper on the unpacked ``(cos, sin)`` alone."""
    if pair is None or not isinstance(pair[1], cst.Call) or dotted(pair[1].func) not in ROTATION_HELPERS:
        return None
    targets = [e.value for e in pair[0].elements] if isinstance(pair[0], cst.Tuple) else [pair[0]]
    args = pair[1].args
    if any(a.star or (a.keyword is not None and not _rotation_or_literal(a.value, rotation)) for a in args):
        return None
    positional = [a.value for a in args if a.keyword is None]
    tensors = [v for v in positional if not (isinstance(v, cst.Name) and v.value in rotation)]
    if (
        len(tensors) == len(positional)
        or len(tensors) != len(targets)
        or not all(isinstance(v, cst.Name) for v in tensors + targets)
    ):
        return None
    names = [t.value for t in targets if isinstance(t, cst.Name)]
    values = [v.value for v in tensors if isinstance(v, cst.Name)]
    if names == values:
        return lambda updated: cst.RemoveFromParent()
    code = f"{', '.join(names)} = {', '.join(values)}  # <-- MODEL-SPECIFIC: no rotation"
    return lambda updated: parse_statement(code, module).with_changes(leading_lines=updated.leading_lines)


def _rotations_kept(cls_name, func, stmt, module, ctx):
    """The refusal of a rotation helper call the edit cannot drop, naming
    every such call of the file's methods (not the first alone)."""
    sites = []
    for other in walk(module):
        if not isinstance(other, cst.FunctionDef) or other.name.value in ROTATION_HELPERS:
            continue
        roots = {
            dotted(e.value) or ""
            for s in deep_statements(other)
            if (p := simple_assign(s)) is not None
            and dotted(p[1]) == "position_embeddings"
            and isinstance(p[0], cst.Tuple)
            for e in p[0].elements
        }
        for s in deep_statements(other):
            if isinstance(s, cst.BaseCompoundStatement) or not any(
                dotted(c.func) in ROTATION_HELPERS for c in _calls(s)
            ):
                continue
            if s is stmt or _unrotated_call(simple_assign(s), roots, module) is None:
                line = locate(module, s)[0]
                sites.append(f"{other.name.value} (line {line}): `{module.code_for_node(s).strip()}`")
    return ctx.refuse(
        f"{cls_name}.{func.name.value} rotates q/k outside a kernel where the rotation cannot be "
        f"dropped (only `a, b = apply_rotary_pos_emb(a, b, cos, sin)` and the like are); "
        f"{len(sites)} such call(s): " + "; ".join(sites),
        stmt,
        module,
    )


def _rotation_or_literal(value: cst.BaseExpression, rotation: set[str]) -> bool:
    """A helper's keyword argument that leaves the tensors alone: the
    rotation itself or a constant (``unsqueeze_dim=1``)."""
    if isinstance(value, cst.Name):
        return value.value in rotation or value.value in ("None", "True", "False")
    return isinstance(value, (cst.Integer, cst.Float, cst.SimpleString))


def _drop_orphans(func: cst.FunctionDef, edits: dict) -> None:
    """Assignments of a plain name, computed without a call, that only the
    removed rotation read (decode's ``half``): dropped too."""
    body = list(deep_statements(func))
    freed = {n.value for s in body if id(s) in edits for n in _read_names(s)}
    reads: dict[str, int] = {}
    for stmt in body:
        if id(stmt) in edits:
            continue
        names = _header_names(stmt) if isinstance(stmt, cst.BaseCompoundStatement) else _read_names(stmt)
        for name in names:
            value = name if isinstance(name, str) else name.value
            reads[value] = reads.get(value, 0) + 1
    for stmt in body:
        pair = simple_assign(stmt) if id(stmt) not in edits else None
        if pair is None or not isinstance(pair[0], cst.Name) or _calls(pair[1]):
            continue
        name = pair[0].value
        if name in freed and reads.get(name) == 1:  # its own binding only
            edits[id(stmt)] = lambda updated: cst.RemoveFromParent()


def _read_names(node: cst.CSTNode) -> list[cst.Name]:
    """The names ``node`` reads or binds: not keyword labels, not attribute names."""
    labels = {id(a.keyword) for c in _calls(node) for a in c.args if a.keyword is not None}
    labels |= {id(n.attr) for n in walk(node) if isinstance(n, cst.Attribute)}
    return [n for n in walk(node) if isinstance(n, cst.Name) and id(n) not in labels]


def _header_names(stmt: cst.BaseCompoundStatement) -> set[str]:
    """Names a compound statement reads outside its blocks (an ``if``'s test)."""
    inner = {id(n) for s in deep_statements(stmt) if s is not stmt for n in walk(s)}
    return {n.value for n in _read_names(stmt) if id(n) not in inner}


def _calls(stmt: cst.CSTNode) -> list[cst.Call]:
    return [n for n in walk(stmt) if isinstance(n, cst.Call)]


def _uses(cls_name, func, stmt, module, ctx):
    return ctx.refuse(
        f"{cls_name}.{func.name.value} uses the rotation in `{module.code_for_node(stmt).strip()}`; "
        "only assignments computed from (cos, sin) and `a, b = apply_rotary_pos_emb(a, b, cos, sin)` are removed",
        stmt,
        module,
    )


def unrotated_backbone(
    name: str,
    init: cst.FunctionDef,
    forward: cst.FunctionDef,
    module: cst.Module,
    ctx: FileContext,
    edits: dict,
    why: str,
    required: bool,
) -> None:
    """In the backbone ``name``: ``position_embeddings = None`` (its comment
    says ``why`` the kernels rotate nothing) in place of ``forward``'s
    ``position_embeddings = self.rotary_emb(...)``, and every ``__init__``
    statement naming ``self.rotary_emb`` removed. A forward without that call
    is refused when ``required`` (the codemod edits beside it), else left as
    it is (already without RoPE); one with two such calls is refused."""
    rotary = [s for s in statements(forward) if assigns_call_of(s, "self.rotary_emb")]
    if len(rotary) > 1 or (required and not rotary):
        count = "two or more" if rotary else "no"
        raise ctx.refuse(
            f"{name}.forward has {count} `position_embeddings = self.rotary_emb(...)`", forward, module
        )
    if not rotary:
        return
    none = with_comment(parse_statement("position_embeddings = None", module), f"<-- MODEL-SPECIFIC: {why}")
    edits[id(rotary[0])] = lambda updated: none
    for stmt in statements(init):
        if "self.rotary_emb" in module.code_for_node(stmt):
            edits[id(stmt)] = lambda updated: cst.RemoveFromParent()


# the reference's helpers that rotate outside the kernels
ROTATION_HELPERS = ("apply_rotary_pos_emb", "_apply_rotary_emb")


def without_rotary_class(module: cst.Module) -> cst.Module:
    """The rotary class, then the rotation helpers, removed when nothing
    else in the file names them."""
    rotary: list[cst.ClassDef | cst.FunctionDef] = [
        s for s in module.body if isinstance(s, cst.ClassDef) and class_role(s.name.value) == "rotary"
    ]
    rotary += [
        s
        for h in ROTATION_HELPERS
        for s in module.body
        if isinstance(s, cst.FunctionDef) and s.name.value == h
    ]
    kept = list(module.body)
    for cls in rotary:
        others = [s for s in kept if s is not cls]
        if any(isinstance(n, cst.Name) and n.value == cls.name.value for s in others for n in walk(s)):
            continue
        index = kept.index(cls)
        following = kept[index + 1] if index + 1 < len(kept) else None
        if following is not None and cls.leading_lines and not following.leading_lines:
            kept[index + 1] = following.with_changes(leading_lines=cls.leading_lines)
        kept.remove(cls)
    if len(kept) == len(module.body):
        return module
    return module.with_changes(body=kept)
