"""Edit primitives shared by the codemods: rewriting a tree in one pass,
inserting and removing statements, parsing snippets, imports.

Everything here works on plain nodes (no metadata), so codemods stay cheap:
a codemod that needs scopes or positions asks for them itself. Reading
nodes is the vocabulary's job (``autoport_cst.transform.vocabulary``,
re-exported here for the codemods that import it from this module).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar, cast

import libcst as cst

from autoport_cst.transform.vocabulary import (  # noqa: F401 - the vocabulary, re-exported
    call_name,
    class_of_role,
    classes,
    classes_with_role,
    code_of,
    deep_statements,
    dotted,
    find_all,
    find_self_assignment,
    free_names,
    has_comment,
    imported_names,
    is_call,
    is_docstring,
    is_none,
    keyword_arg,
    method,
    paths_to,
    positional_args,
    role_of,
    self_assignment,
    self_attr,
    simple_assign,
    statements,
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


# -- parsing snippets ---------------------------------------------------------


def parse_statements(code: str, module: cst.Module | None = None) -> list[cst.BaseStatement]:
    """Parse statements with the module's indentation and newline style."""
    config = module.config_for_parsing if module is not None else cst.PartialParserConfig()
    parsed = cst.parse_module(code if code.endswith("\n") else code + "\n", config)
    return list(parsed.body)


def parse_statement(code: str, module: cst.Module | None = None) -> cst.BaseStatement:
    stmts = parse_statements(code, module)
    assert len(stmts) == 1, code
    return stmts[0]


def parse_expr(code: str, module: cst.Module | None = None) -> cst.BaseExpression:
    config = module.config_for_parsing if module is not None else cst.PartialParserConfig()
    return cst.parse_expression(code, config)


# -- imports ------------------------------------------------------------------


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
