"""Per-layer settings of attention classes and the functions they stop
using.

A new ``self.<setting> = ...`` goes in ``__init__`` right after the
attributes it reads, after any setting just above it whose name sorts
before its own, so that codemods adding settings commute
(:func:`place_setting`)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.cst.vocabulary import (
    self_assignment,
    walk,
)


def init_anchor(init: cst.FunctionDef, attrs: tuple[str, ...] = ("scaling", "head_dim", "layer_idx")):
    """The top-level ``self.<attr> = ...`` statement of ``__init__`` to insert
    per-layer settings after: the first of ``attrs`` found."""
    body = init.body.body if isinstance(init.body, cst.IndentedBlock) else []
    for attr in attrs:
        for stmt in body:
            pair = self_assignment(stmt)
            if pair is not None and pair[0] == attr:
                return stmt
    return None


def place_setting(init: cst.FunctionDef, attr: str, stmt: cst.BaseStatement, edits: dict) -> bool:
    """Record in ``edits`` the insertion of ``stmt`` (``self.<attr> = ...``
    with a comment) among the per-layer settings that follow ``init_anchor``:
    after the anchor and after the settings other codemods placed there whose
    names sort before ``attr`` (statements led by a MODEL-SPECIFIC comment),
    so that the order does not depend on which codemod ran first. Returns
    False when ``__init__`` has no anchor."""
    body = list(init.body.body) if isinstance(init.body, cst.IndentedBlock) else []
    anchor = init_anchor(init)
    if anchor is None:
        return False
    index = body.index(anchor)
    while index + 1 < len(body):
        following = body[index + 1]
        pair = self_assignment(following)
        marked = any(
            line.comment is not None and line.comment.value.startswith("# <-- MODEL-SPECIFIC")
            for line in getattr(following, "leading_lines", ())
        )
        if pair is None or not marked or pair[0] >= attr:
            break
        index += 1
    target = body[index]
    previous = edits.get(id(target))

    def place(updated, previous=previous, stmt=stmt):
        base = previous(updated) if previous else updated
        nodes = list(base.nodes) if isinstance(base, cst.FlattenSentinel) else [base]
        return cst.FlattenSentinel([*nodes, stmt])

    edits[id(target)] = place
    return True


def drop_unused_function(module: cst.Module, name: str) -> cst.Module:
    """Remove the module-level function ``name`` when no other top-level
    statement names it."""
    function = next((s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == name), None)
    if function is None:
        return module
    for stmt in module.body:
        if stmt is not function and any(isinstance(n, cst.Name) and n.value == name for n in walk(stmt)):
            return module
    return module.with_changes(body=[s for s in module.body if s is not function])
