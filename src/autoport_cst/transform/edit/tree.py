"""Edits of a tree: rewriting it in one pass (``rewrite`` with edits keyed by
node id, composed with ``add_edit``), inserting and removing statements,
comments and strings.

Everything here works on plain nodes (no metadata), so codemods stay cheap:
a codemod that needs scopes or positions asks for them itself. Reading
nodes is the vocabulary's job (``autoport_cst.transform.cst.vocabulary``),
parsing snippets ``autoport_cst.transform.cst.snippets``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar, cast

import libcst as cst

from autoport_cst.transform.cst.vocabulary import (
    leading_lines,
    paths_to,
    string_text,
    walk,
)

# -- names and expressions ----------------------------------------------------


def replace_arg_value(call: cst.Call, arg: cst.Arg, value: cst.BaseExpression) -> cst.Call:
    return call.with_changes(args=[a.with_changes(value=value) if a is arg else a for a in call.args])


# -- comments -----------------------------------------------------------------------


def with_comment(stmt: cst.BaseStatement, comment: str, blank_before: bool = False) -> cst.BaseStatement:
    """``stmt`` preceded by a ``# comment`` line (inside a block: indented)."""
    lines = [cst.EmptyLine()] if blank_before else []
    lines.append(cst.EmptyLine(comment=cst.Comment(f"# {comment}")))
    return stmt.with_changes(leading_lines=lines)


# -- strings ------------------------------------------------------------------


def replace_string_suffix(node: cst.BaseExpression, old: str, new: str) -> cst.BaseExpression | None:
    """``f"{p}.q_proj.weight"`` -> ``f"{p}.q_proj.bias"`` (for ``old=".weight"``).
    None when the string does not end with ``old``."""
    if isinstance(node, cst.SimpleString):
        text = string_text(node)
        if text is None or not text.endswith(old):
            return None
        body = node.value[len(node.prefix) + len(node.quote) : -len(node.quote)]
        if not body.endswith(old):
            return None
        return node.with_changes(value=f"{node.prefix}{node.quote}{body[: -len(old)]}{new}{node.quote}")
    if isinstance(node, cst.FormattedString):
        if not node.parts or not isinstance(node.parts[-1], cst.FormattedStringText):
            return None
        last = node.parts[-1]
        if not last.value.endswith(old):
            return None
        parts = list(node.parts[:-1]) + [last.with_changes(value=last.value[: -len(old)] + new)]
        return node.with_changes(parts=parts)
    return None


def map_strings(
    node: cst.BaseExpression, fn: Callable[[cst.BaseExpression], cst.BaseExpression | None]
) -> cst.BaseExpression | None:
    """Apply ``fn`` to a string or to each string of a list/tuple literal.
    None when any element could not be mapped."""
    if isinstance(node, (cst.List, cst.Tuple)):
        elements = []
        for el in node.elements:
            mapped = fn(el.value)
            if mapped is None:
                return None
            elements.append(el.with_changes(value=mapped))
        return node.with_changes(elements=elements)
    return fn(node)


# -- classes, functions, statements ------------------------------------------


def replace_method(cls: cst.ClassDef, old: cst.FunctionDef, new: cst.FunctionDef) -> cst.ClassDef:
    body = [new if s is old else s for s in cls.body.body]
    return cls.with_changes(body=cls.body.with_changes(body=body))


def with_statements(func: cst.FunctionDef, stmts: Iterable[cst.BaseStatement]) -> cst.FunctionDef:
    return func.with_changes(body=func.body.with_changes(body=list(stmts)))


Edit = Callable[[cst.CSTNode], object]


_Node = TypeVar("_Node", bound=cst.CSTNode)


def replaced_by(new: cst.CSTNode) -> Edit:
    """The edit that puts ``new`` in the node's place."""
    return lambda updated: new


def followed_by(*new: cst.CSTNode) -> Edit:
    """The edit that keeps the statement and adds ``new`` after it."""
    return lambda updated: cst.FlattenSentinel([updated, *new])


def preceded_by(*new: cst.CSTNode) -> Edit:
    """The edit that keeps the statement and adds ``new`` before it."""
    return lambda updated: cst.FlattenSentinel([*new, updated])


def preceded_under_its_comments(*new: cst.BaseStatement) -> Edit:
    """The edit that adds ``new`` before the statement, below the
    statement's own leading comments (they head the section both now form)."""

    def edit(updated: cst.CSTNode) -> object:
        head = new[0] if new else None
        if not isinstance(updated, cst.SimpleStatementLine | cst.BaseCompoundStatement) or not isinstance(
            head, cst.SimpleStatementLine | cst.BaseCompoundStatement
        ):
            return cst.FlattenSentinel([*new, updated])
        first = head.with_changes(leading_lines=[*updated.leading_lines, *head.leading_lines])
        return cst.FlattenSentinel([first, *new[1:], updated.with_changes(leading_lines=[])])

    return edit


def rewrite(root: _Node, edits: dict[int, Edit]) -> _Node:
    """Apply ``edits`` (``id(original node)`` -> function of the updated node,
    returning a node, ``cst.FlattenSentinel`` or ``cst.RemoveFromParent()``)
    in one pass that only descends into the targets and their ancestors.

    Codemods find their targets with :func:`walk`, then edit them here: far
    cheaper than a full transformer pass over a large module."""
    if not edits:
        return root
    keep = paths_to(root, set(edits))

    class _Rewrite(cst.CSTTransformer):
        def on_visit(self, node: cst.CSTNode) -> bool:
            return id(node) in keep

        def on_leave(self, original, updated):
            edit = edits.get(id(original))
            return edit(updated) if edit is not None else updated

    # The edits keep the root's kind (they edit statements and expressions below it).
    return cast(_Node, root.visit(_Rewrite()))


def insert_after(node: _Node, anchor: cst.BaseStatement, new: Sequence[cst.BaseStatement]) -> _Node:
    """Insert ``new`` after ``anchor`` wherever it sits under ``node`` (in the
    block that contains it)."""
    return insert_many_after(node, {id(anchor): list(new)})


def insert_many_after(node: _Node, additions: dict[int, list[cst.BaseStatement]]) -> _Node:
    """Several insertions in one pass: ``additions`` maps ``id(anchor)`` to the
    statements to insert after it. (Node identities do not survive a
    transformer pass, so insertions must be gathered and done together.)"""
    return rewrite(
        node,
        {key: followed_by(*new) for key, new in additions.items() if new},
    )


def remove_statements(node: _Node, doomed: Sequence[cst.CSTNode]) -> _Node:
    return rewrite(node, {id(d): (lambda updated: cst.RemoveFromParent()) for d in doomed})


def replace_nodes(node: _Node, mapping: dict[int, cst.CSTNode]) -> _Node:
    """Replace nodes (keyed by ``id(original)``) anywhere under ``node``."""
    return rewrite(node, {key: replaced_by(new) for key, new in mapping.items()})


def append_statements_edit(func: cst.FunctionDef, new: list[cst.BaseStatement]) -> tuple[int, object]:
    """An edit (``(id, fn)`` for ``rewrite``) that appends ``new`` at the end
    of ``func``'s body (after its last statement)."""
    last = func.body.body[-1]
    return id(last), (lambda updated: cst.FlattenSentinel([updated, *new]))


def add_edit(edits: dict, key: int, fn) -> None:
    """Register ``fn`` for node ``key``, after an edit already registered
    there (when that one keeps the node)."""
    previous = edits.get(key)
    if previous is None:
        edits[key] = fn
        return

    def both(updated, first=previous, second=fn):
        result = first(updated)
        if isinstance(result, (cst.FlattenSentinel, cst.RemovalSentinel)):
            return result
        return second(result)

    edits[key] = both


def removal_edits(root: cst.CSTNode, doomed: Sequence[cst.CSTNode]) -> dict:
    """Edits removing ``doomed`` statements; the leading lines of a removed
    statement that carry comments (section markers) move to the next kept
    statement of its block."""
    doomed_ids = {id(s) for s in doomed}
    edits: dict = {}
    for node in walk(root):
        if not isinstance(node, (cst.IndentedBlock, cst.Module)):
            continue
        carried: list[cst.EmptyLine] = []
        for stmt in node.body:
            if id(stmt) in doomed_ids:
                edits[id(stmt)] = lambda updated: cst.RemoveFromParent()
                if any(line.comment is not None for line in leading_lines(stmt)):
                    carried += list(leading_lines(stmt))
                continue
            if carried:
                edits[id(stmt)] = lambda updated, lines=carried: updated.with_changes(
                    leading_lines=[*lines, *updated.leading_lines]
                )
                carried = []
    return edits
