"""Small, shared LibCST helpers for codemods.

Everything here works on plain nodes (no metadata), so codemods stay cheap:
a codemod that needs scopes or positions asks for them itself.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Iterator, Sequence

import libcst as cst

from autoport_cst.transform.roles import class_role

# -- names and expressions ----------------------------------------------------


def dotted(node: cst.CSTNode | None) -> str | None:
    """``NF.attention_decode`` for an Attribute chain of Names, ``x`` for a Name."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def self_attr(node: cst.CSTNode | None) -> str | None:
    """``foo`` for ``self.foo``; None otherwise."""
    if (
        isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and node.value.value == "self"
    ):
        return node.attr.value
    return None


def call_name(node: cst.CSTNode) -> str | None:
    return dotted(node.func) if isinstance(node, cst.Call) else None


def is_call(node: cst.CSTNode, *names: str) -> bool:
    """Whether ``node`` is a call to one of ``names`` (dotted). A name given as
    ``NF.attention_decode`` also matches a bare ``attention_decode(...)``."""
    name = call_name(node)
    if name is None:
        return False
    for wanted in names:
        if name == wanted or wanted.rsplit(".", 1)[-1] == name:
            return True
    return False


def keyword_arg(call: cst.Call, name: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def positional_args(call: cst.Call) -> list[cst.Arg]:
    return [a for a in call.args if a.keyword is None and not a.star]


def replace_arg_value(call: cst.Call, arg: cst.Arg, value: cst.BaseExpression) -> cst.Call:
    return call.with_changes(
        args=[a.with_changes(value=value) if a is arg else a for a in call.args]
    )


def is_none(node: cst.CSTNode | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


_FIELDS: dict[type, tuple[str, ...]] = {}


def walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    """Every node under ``node`` (including it), parents before children.

    Reads the node dataclasses' fields directly: about 3x cheaper than a
    visitor pass, and far cheaper than recursing through ``.children`` (which
    LibCST computes by visiting). Statements of one block come in source
    order; the order of sibling fields follows the dataclass, not always the
    source (a class's body before its bases), so use a visitor when source
    order matters."""
    out: list[cst.CSTNode] = []
    stack = [node]
    while stack:
        current = stack.pop()
        out.append(current)
        names = _FIELDS.get(type(current))
        if names is None:
            names = _FIELDS[type(current)] = tuple(f.name for f in dataclasses.fields(current))
        children: list[cst.CSTNode] = []
        for name in names:
            value = getattr(current, name)
            if isinstance(value, cst.CSTNode):
                children.append(value)
            elif isinstance(value, (list, tuple)):
                children.extend(v for v in value if isinstance(v, cst.CSTNode))
        stack.extend(reversed(children))
    return out


def find_all(node: cst.CSTNode, predicate: Callable[[cst.CSTNode], bool]) -> list[cst.CSTNode]:
    return [n for n in walk(node) if predicate(n)]


def free_names(node: cst.CSTNode) -> set[str]:
    """Variable names used under ``node``: every Name except attribute names
    (``self.x`` uses ``self``, not ``x``) and keyword-argument names."""
    not_variables: set[int] = set()
    names: set[str] = set()
    for n in walk(node):
        if isinstance(n, cst.Attribute):
            not_variables.add(id(n.attr))
        elif isinstance(n, cst.Arg) and n.keyword is not None:
            not_variables.add(id(n.keyword))
        elif isinstance(n, cst.Name) and id(n) not in not_variables:
            names.add(n.value)
    return names


# -- comments -----------------------------------------------------------------------


def with_comment(stmt: cst.BaseStatement, comment: str, blank_before: bool = False) -> cst.BaseStatement:
    """``stmt`` preceded by a ``# comment`` line (inside a block: indented)."""
    lines = [cst.EmptyLine()] if blank_before else []
    lines.append(cst.EmptyLine(comment=cst.Comment(f"# {comment}")))
    return stmt.with_changes(leading_lines=lines)


def has_comment(node: cst.CSTNode, text: str) -> bool:
    return any(isinstance(n, cst.Comment) and text in n.value for n in walk(node))


# -- strings ------------------------------------------------------------------


def string_text(node: cst.CSTNode | None) -> str | None:
    """The text of a string literal; f-string expressions appear as ``{expr}``.
    None for anything that is not a string."""
    if isinstance(node, cst.SimpleString):
        return node.evaluated_value if isinstance(node.evaluated_value, str) else None
    if isinstance(node, cst.FormattedString):
        parts = []
        for part in node.parts:
            if isinstance(part, cst.FormattedStringText):
                parts.append(part.value)
            else:
                parts.append("{" + cst.Module([]).code_for_node(part.expression) + "}")
        return "".join(parts)
    if isinstance(node, cst.ConcatenatedString):
        left, right = string_text(node.left), string_text(node.right)
        return None if left is None or right is None else left + right
    return None


def replace_string_suffix(node: cst.BaseExpression, old: str, new: str) -> cst.BaseExpression | None:
    """``f"{p}.q_proj.weight"`` -> ``f"{p}.q_proj.bias"`` (for ``old=".weight"``).
    None when the string does not end with ``old``."""
    if isinstance(node, cst.SimpleString):
        text = string_text(node)
        if text is None or not text.endswith(old):
            return None
        body = node.value[len(node.prefix) + len(node.quote): -len(node.quote)]
        if not body.endswith(old):
            return None
        return node.with_changes(
            value=f"{node.prefix}{node.quote}{body[: -len(old)]}{new}{node.quote}"
        )
    if isinstance(node, cst.FormattedString):
        if not node.parts or not isinstance(node.parts[-1], cst.FormattedStringText):
            return None
        last = node.parts[-1]
        if not last.value.endswith(old):
            return None
        parts = list(node.parts[:-1]) + [last.with_changes(value=last.value[: -len(old)] + new)]
        return node.with_changes(parts=parts)
    return None


def map_strings(node: cst.BaseExpression, fn: Callable[[cst.BaseExpression], cst.BaseExpression | None]) -> cst.BaseExpression | None:
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


def classes(module: cst.Module) -> list[cst.ClassDef]:
    return [s for s in module.body if isinstance(s, cst.ClassDef)]


def classes_with_role(module: cst.Module, role: str) -> list[cst.ClassDef]:
    return [c for c in classes(module) if class_role(c.name.value) == role]


def method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    for stmt in cls.body.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            return stmt
    return None


def replace_method(cls: cst.ClassDef, old: cst.FunctionDef, new: cst.FunctionDef) -> cst.ClassDef:
    body = [new if s is old else s for s in cls.body.body]
    return cls.with_changes(body=cls.body.with_changes(body=body))


def statements(func: cst.FunctionDef) -> Sequence[cst.BaseStatement]:
    return func.body.body if isinstance(func.body, cst.IndentedBlock) else []


def with_statements(func: cst.FunctionDef, stmts: Iterable[cst.BaseStatement]) -> cst.FunctionDef:
    return func.with_changes(body=func.body.with_changes(body=list(stmts)))


def simple_assign(stmt: cst.CSTNode) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """(target, value) of a one-target ``x = v`` statement line."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        return small.targets[0].target, small.value
    if isinstance(small, cst.AnnAssign) and small.value is not None:
        return small.target, small.value
    return None


def self_assignment(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """(attr, value) for a ``self.attr = value`` statement line."""
    pair = simple_assign(stmt)
    if pair is None:
        return None
    attr = self_attr(pair[0])
    return None if attr is None else (attr, pair[1])


def find_self_assignment(func: cst.FunctionDef, attr: str) -> cst.SimpleStatementLine | None:
    for stmt in deep_statements(func):
        found = self_assignment(stmt)
        if found is not None and found[0] == attr:
            return stmt  # type: ignore[return-value]
    return None


def deep_statements(node: cst.CSTNode) -> Iterator[cst.BaseStatement]:
    """Every statement under ``node`` (a function, class, module or suite),
    including inside if/for/while/with/try blocks, excluding the bodies of
    nested functions and classes."""
    for suite in _suites_of(node):
        for stmt in suite.body if isinstance(suite, cst.IndentedBlock) else []:
            yield stmt
            if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                yield from deep_statements(stmt)


def _suites_of(node: cst.CSTNode) -> Iterator[cst.BaseSuite]:
    if isinstance(node, cst.BaseSuite):
        yield node
        return
    for child in node.children:
        if isinstance(child, cst.BaseSuite):
            yield child
        elif isinstance(child, (cst.If, cst.Else, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally)):
            yield from _suites_of(child)


Edit = Callable[[cst.CSTNode], object]


def rewrite(root: cst.CSTNode, edits: dict[int, Edit]) -> cst.CSTNode:
    """Apply ``edits`` (``id(original node)`` -> function of the updated node,
    returning a node, ``cst.FlattenSentinel`` or ``cst.RemoveFromParent()``)
    in one pass that only descends into the targets and their ancestors.

    Codemods find their targets with :func:`walk`, then edit them here: far
    cheaper than a full transformer pass over a large module."""
    if not edits:
        return root
    keep = _paths_to(root, set(edits))

    class _Rewrite(cst.CSTTransformer):
        def on_visit(self, node: cst.CSTNode) -> bool:
            return id(node) in keep

        def on_leave(self, original, updated):  # type: ignore[override]
            edit = edits.get(id(original))
            return edit(updated) if edit is not None else updated

    return root.visit(_Rewrite())


def _paths_to(root: cst.CSTNode, targets: set[int]) -> set[int]:
    """ids of the targets and of every node on the path from root to them."""
    parent: dict[int, cst.CSTNode | None] = {id(root): None}
    found: list[cst.CSTNode] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in targets:
            found.append(node)
        names = _FIELDS.get(type(node))
        if names is None:
            names = _FIELDS[type(node)] = tuple(f.name for f in dataclasses.fields(node))
        for name in names:
            value = getattr(node, name)
            if isinstance(value, cst.CSTNode):
                parent[id(value)] = node
                stack.append(value)
            elif isinstance(value, (list, tuple)):
                for child in value:
                    if isinstance(child, cst.CSTNode):
                        parent[id(child)] = node
                        stack.append(child)
    keep: set[int] = set()
    for node in found:
        current: cst.CSTNode | None = node
        while current is not None and id(current) not in keep:
            keep.add(id(current))
            current = parent.get(id(current))
    return keep


def insert_after(node: cst.CSTNode, anchor: cst.BaseStatement,
                 new: Sequence[cst.BaseStatement]) -> cst.CSTNode:
    """Insert ``new`` after ``anchor`` wherever it sits under ``node`` (in the
    block that contains it)."""
    return insert_many_after(node, {id(anchor): list(new)})


def insert_many_after(node: cst.CSTNode, additions: dict[int, list[cst.BaseStatement]]) -> cst.CSTNode:
    """Several insertions in one pass: ``additions`` maps ``id(anchor)`` to the
    statements to insert after it. (Node identities do not survive a
    transformer pass, so insertions must be gathered and done together.)"""
    return rewrite(
        node,
        {key: (lambda updated, new=new: cst.FlattenSentinel([updated, *new])) for key, new in additions.items() if new},
    )


def remove_statements(node: cst.CSTNode, doomed: Sequence[cst.CSTNode]) -> cst.CSTNode:
    return rewrite(node, {id(d): (lambda updated: cst.RemoveFromParent()) for d in doomed})


def replace_nodes(node: cst.CSTNode, mapping: dict[int, cst.CSTNode]) -> cst.CSTNode:
    """Replace nodes (keyed by ``id(original)``) anywhere under ``node``."""
    return rewrite(node, {key: (lambda updated, new=new: new) for key, new in mapping.items()})


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


def code_of(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


# -- imports ------------------------------------------------------------------


def ensure_import_from(module: cst.Module, source: str, name: str) -> cst.Module:
    """Make ``from source import name`` available at module level: extend an
    existing ``from source import ...`` or add one after the last top-level
    import. No change when the name is already imported from there."""
    body = list(module.body)
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
                body[index] = stmt.with_changes(
                    body=[new_small if s is small else s for s in stmt.body]
                )
                return module.with_changes(body=body)
    new_stmt = parse_statement(f"from {source} import {name}", module)
    body.insert(last_import + 1, new_stmt)
    return module.with_changes(body=body)


def _reflow_aliases(names: list[cst.ImportAlias], original: cst.ImportFrom) -> list[cst.ImportAlias]:
    """Keep the comma style of the original import (one per line when it was
    parenthesized over lines)."""
    multiline = original.lpar is not None and any(
        isinstance(a.comma, cst.Comma)
        and isinstance(a.comma.whitespace_after, cst.ParenthesizedWhitespace)
        for a in original.names
    )
    if not multiline:
        out = []
        for i, alias in enumerate(names):
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if i < len(names) - 1 else cst.MaybeSentinel.DEFAULT
            out.append(alias.with_changes(comma=comma))
        return out
    sample = next(
        a.comma for a in original.names
        if isinstance(a.comma, cst.Comma) and isinstance(a.comma.whitespace_after, cst.ParenthesizedWhitespace)
    )
    last_comma = original.names[-1].comma
    out = []
    for i, alias in enumerate(names):
        out.append(alias.with_changes(comma=sample if i < len(names) - 1 else last_comma))
    return out


def imported_names(module: cst.Module) -> dict[str, str]:
    """Local name -> dotted source for top-level ``from x import y [as z]``."""
    found: dict[str, str] = {}
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                base = "." * len(small.relative) + (dotted(small.module) or "")
                for alias in small.names:
                    local = alias.asname.name.value if alias.asname else dotted(alias.name)
                    if isinstance(local, str):
                        found[local] = f"{base}.{dotted(alias.name)}"
    return found


def class_of_role(module: cst.Module, role: str) -> cst.ClassDef | None:
    found = classes_with_role(module, role)
    return found[0] if found else None


def role_of(cls: cst.ClassDef) -> str | None:
    return class_role(cls.name.value)
