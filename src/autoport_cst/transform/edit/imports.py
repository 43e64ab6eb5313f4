"""Imports added to a module, in its own layout."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import (
    dotted,
)


def ensure_import(module: cst.Module, name: str) -> cst.Module:
    """Make ``import name`` available at module level: add it before the first
    top-level import (at the very top when there is none). No change when a
    top-level ``import`` statement already imports it."""
    body: list[cst.BaseStatement] = list(module.body)
    if any(
        isinstance(s, cst.SimpleStatementLine)
        and any(isinstance(i, cst.Import) and any(dotted(a.name) == name for a in i.names) for i in s.body)
        for s in body
    ):
        return module
    index = next(
        (
            i
            for i, stmt in enumerate(body)
            if isinstance(stmt, cst.SimpleStatementLine)
            and any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)
        ),
        0,
    )
    body.insert(index, parse_statement(f"import {name}", module))
    return module.with_changes(body=body)


def ensure_import_from(module: cst.Module, source: str, name: str) -> cst.Module:
    """Make ``from source import name`` available at module level: extend an
    existing ``from source import ...`` or add one after the last top-level
    import. No change when the name is already imported from there."""
    body: list[cst.BaseStatement] = list(module.body)
    last_import = -1
    for index, stmt in enumerate(body):
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, (cst.Import, cst.ImportFrom)):
                last_import = index
            if (
                isinstance(small, cst.ImportFrom)
                and small.relative == ()
                and small.module is not None
                and dotted(small.module) == source
                and not isinstance(small.names, cst.ImportStar)
            ):
                names = list(small.names)
                if any(dotted(a.name) == name for a in names):
                    return module
                new_alias = cst.ImportAlias(name=cst.Name(name))
                names = sorted([*names, new_alias], key=lambda a: dotted(a.name) or "")
                names = _reflow_aliases(names, small)
                new_small = small.with_changes(names=names)
                body[index] = stmt.with_changes(body=[new_small if s is small else s for s in stmt.body])
                return module.with_changes(body=body)
    new_stmt = parse_statement(f"from {source} import {name}", module)
    body.insert(last_import + 1, new_stmt)
    return module.with_changes(body=body)


def _reflow_aliases(names: list[cst.ImportAlias], original: cst.ImportFrom) -> list[cst.ImportAlias]:
    """Keep the comma style of the original import (one per line when it was
    parenthesized over lines)."""
    old = original.names
    if isinstance(old, cst.ImportStar):  # pragma: no cover - callers pass a named import
        return names
    multiline = original.lpar is not None and any(
        isinstance(a.comma, cst.Comma) and isinstance(a.comma.whitespace_after, cst.ParenthesizedWhitespace)
        for a in old
    )
    if not multiline:
        out = []
        for i, alias in enumerate(names):
            comma = (
                cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                if i < len(names) - 1
                else cst.MaybeSentinel.DEFAULT
            )
            out.append(alias.with_changes(comma=comma))
        return out
    sample = next(
        a.comma
        for a in old
        if isinstance(a.comma, cst.Comma)
        and isinstance(a.comma.whitespace_after, cst.ParenthesizedWhitespace)
    )
    last_comma = old[-1].comma
    out = []
    for i, alias in enumerate(names):
        out.append(alias.with_changes(comma=sample if i < len(names) - 1 else last_comma))
    return out
