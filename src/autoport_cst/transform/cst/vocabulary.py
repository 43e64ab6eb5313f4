"""The CST vocabulary: reading LibCST nodes, shared by the codemods, the
anatomy locators and the lint rules.

Everything here reads plain nodes (no metadata, no edits) and is cheap:
``walk`` lists a subtree by reading the node dataclasses' fields directly,
and nothing here imports ``libcst.matchers`` (whose import alone costs
about half a second, more than a pre-commit run on one file). Edits live
in ``autoport_cst.transform.edit``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

import libcst as cst

from autoport_cst.transform.cst.roles import class_role


class IsInstance(dict):
    """type -> whether its instances are instances of ``classes``, decided
    once per type: LibCST's node classes derive from an abstract base class,
    whose ``isinstance`` costs several dict lookups when it fails. Ask
    ``IS_NAME[type(node)]`` in loops over many nodes."""

    def __init__(self, *classes: type) -> None:
        super().__init__()
        self.classes = classes

    def __missing__(self, kind: type) -> bool:
        found = self[kind] = issubclass(kind, self.classes)
        return found


IS_NAME = IsInstance(cst.Name)
IS_ATTRIBUTE = IsInstance(cst.Attribute)
IS_CALL = IsInstance(cst.Call)
IS_ARG = IsInstance(cst.Arg)


def dotted(node: cst.CSTNode | None) -> str | None:
    """``NF.attention_decode`` for an Attribute chain of Names, ``x`` for a Name."""
    if IS_NAME[type(node)]:
        return node.value  # type: ignore[union-attr]
    if IS_ATTRIBUTE[type(node)]:
        base = dotted(node.value)  # type: ignore[union-attr]
        return None if base is None else f"{base}.{node.attr.value}"  # type: ignore[union-attr]
    return None


def self_attr(node: cst.CSTNode | None) -> str | None:
    """``foo`` for ``self.foo``; None otherwise."""
    if IS_ATTRIBUTE[type(node)] and IS_NAME[type(node.value)] and node.value.value == "self":  # type: ignore[union-attr]
        return node.attr.value  # type: ignore[union-attr]
    return None


def call_name(node: cst.CSTNode) -> str | None:
    return dotted(node.func) if IS_CALL[type(node)] else None  # type: ignore[attr-defined]


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
    order matters.

    Nodes are immutable, so the walk of a recently walked node is served from a
    small cache (the anatomy census and the renamers walk the same module many
    times); the caller gets its own copy of the list."""
    return list(_walked(node)[0])


def _walked(node: cst.CSTNode) -> tuple[list[cst.CSTNode], list[int]]:
    """The walk of ``node`` and each node's depth below it, from the cache."""
    cached = _WALKS.get(id(node))
    if cached is not None and cached[0] is node:
        return cached[1], cached[2]
    out, depths = _walk(node)
    if len(_WALKS) >= _WALK_CACHE_SIZE:
        del _WALKS[next(iter(_WALKS))]
    _WALKS[id(node)] = (node, out, depths)
    return out, depths


# Walks are kept for the nodes asked for and for every statement met on the
# way (a module of a few thousand lines has a few thousand statements).
_WALK_CACHE_SIZE = 32768
_WALKS: dict[int, tuple[cst.CSTNode, list[cst.CSTNode], list[int]]] = {}

# Statements: an edit keeps the statements it does not change (``rewrite``),
# so the walk of a module or class after a step is mostly walks of statements
# walked before, spliced, not walked again.
# (Read off each class's MRO: LibCST's node classes derive from an abstract base class, and
# ``issubclass`` of each of them against it costs more than this module's whole import otherwise.)
_SPLICED: frozenset[type] = frozenset(
    kind for kind in vars(cst).values() if isinstance(kind, type) and cst.BaseStatement in kind.__mro__
)


def nodes_of(node: cst.CSTNode, *types: type) -> list[cst.CSTNode]:
    """The nodes under ``node`` (itself included) that are instances of
    ``types``: grouped by their type, each group in ``walk`` order. The nodes
    of a recently asked tree are served by type, not filtered again."""
    cached = _BY_TYPE.get(id(node))
    if cached is None or cached[0] is not node:
        by_type: dict[type, list[cst.CSTNode]] = {}
        for found in _walked(node)[0]:
            by_type.setdefault(type(found), []).append(found)
        if len(_BY_TYPE) >= _BY_TYPE_CACHE_SIZE:
            del _BY_TYPE[next(iter(_BY_TYPE))]
        cached = _BY_TYPE[id(node)] = (node, by_type)
    matches = _MATCHES.get(types)
    if matches is None:
        matches = _MATCHES[types] = IsInstance(*types)
    out: list[cst.CSTNode] = []
    for kind, group in cached[1].items():
        if matches[kind]:
            out += group
    return out


_BY_TYPE_CACHE_SIZE = 16
_BY_TYPE: dict[int, tuple[cst.CSTNode, dict[type, list[cst.CSTNode]]]] = {}
_MATCHES: dict[tuple[type, ...], IsInstance] = {}  # the types asked for -> which kinds are theirs


def _walk(node: cst.CSTNode) -> tuple[list[cst.CSTNode], list[int]]:
    # The children of each node are pushed last first, so the first comes off the
    # stack next; a value's kind (node, sequence, other) is looked up by its type
    # (an isinstance check against LibCST's abstract node class costs several times more).
    # A statement below ``node`` is walked as a whole (``_walked``: kept, or
    # served from what was kept) and spliced in, its depths shifted.
    out: list[cst.CSTNode] = []
    depths: list[int] = []
    stack, below = [node], [0]
    fields, kinds, spliced = _REVERSED_FIELDS, _KINDS, _SPLICED
    while stack:
        current = stack.pop()
        depth = below.pop()
        node_type = type(current)
        if depth and node_type in spliced:
            nodes, levels = _walked(current)
            out += nodes
            depths += map(depth.__add__, levels)
            continue
        out.append(current)
        depths.append(depth)
        depth += 1
        for name in fields.get(node_type) or _reversed_fields(node_type):
            value = getattr(current, name)
            kind = kinds.get(type(value)) or value_kind(value)
            if kind is NODE:
                stack.append(value)
                below.append(depth)
            elif kind is SEQUENCE:
                for item in reversed(value):
                    if (kinds.get(type(item)) or value_kind(item)) is NODE:
                        stack.append(item)
                        below.append(depth)
    return out, depths


NODE, SEQUENCE, OTHER = "node", "sequence", "other"
_KINDS: dict[type, str] = {}
_REVERSED_FIELDS: dict[type, tuple[str, ...]] = {}


def value_kind(value: object) -> str:
    """``NODE`` for a LibCST node, ``SEQUENCE`` for a list or tuple, else
    ``OTHER``: ``isinstance`` semantics, decided once per type."""
    kind = _KINDS.get(type(value))
    if kind is None:
        kind = _KINDS[type(value)] = (
            NODE
            if isinstance(value, cst.CSTNode)
            else SEQUENCE
            if isinstance(value, (list, tuple))
            else OTHER
        )
    return kind


def _fields(node_type: type) -> tuple[str, ...]:
    names = _FIELDS.get(node_type)
    if names is None:
        names = _FIELDS[node_type] = tuple(f.name for f in dataclasses.fields(node_type))
    return names


def _reversed_fields(node_type: type) -> tuple[str, ...]:
    _REVERSED_FIELDS[node_type] = _fields(node_type)[::-1]
    return _REVERSED_FIELDS[node_type]


def walk_pruned(node: cst.CSTNode, visit: Callable[[cst.CSTNode], bool]) -> None:
    """Call ``visit`` on every node under ``node`` in ``walk`` order, except
    below the nodes it returns False for. Read off the walk of ``node`` (kept
    or spliced from kept walks of its statements, see ``_walk``): a node lies
    below the last pruned one while it is deeper."""
    pruned = -1  # the depth of the node whose subtree is being skipped (-1: none)
    for current, depth in zip(*_walked(node), strict=True):
        if pruned >= 0:
            if depth > pruned:
                continue
            pruned = -1
        if not visit(current):
            pruned = depth


def paths_to(root: cst.CSTNode, targets: set[int]) -> set[int]:
    """ids of the nodes under ``root`` whose ids are in ``targets``, and of
    every node on the path from ``root`` to them (read off the walk of
    ``root``, which the caller has usually just made)."""
    nodes, depths = _walked(root)
    last = len(depths) - 1
    reverse = depths[::-1]  # searched for each parent in C: the nearest earlier node one level up
    keep: set[int] = set()
    for index in [index for index, node in enumerate(nodes) if id(node) in targets]:
        depth = depths[index]
        keep.add(id(nodes[index]))
        while depth:
            # in the walk, a node's parent is the nearest earlier node one level less deep
            index = last - reverse.index(depth - 1, last - index + 1)
            if id(nodes[index]) in keep:
                break  # it holds every ancestor of what it holds
            keep.add(id(nodes[index]))
            depth -= 1
    return keep


def find_all(node: cst.CSTNode, predicate: Callable[[cst.CSTNode], bool]) -> list[cst.CSTNode]:
    return [n for n in walk(node) if predicate(n)]


def free_names(node: cst.CSTNode) -> set[str]:
    """Variable names used under ``node``: every Name except attribute names
    (``self.x`` uses ``self``, not ``x``) and keyword-argument names."""
    not_variables: set[int] = set()
    names: set[str] = set()
    for n in walk(node):
        kind = type(n)
        if IS_ATTRIBUTE[kind]:
            not_variables.add(id(n.attr))  # type: ignore[attr-defined]
        elif IS_ARG[kind] and n.keyword is not None:  # type: ignore[attr-defined]
            not_variables.add(id(n.keyword))  # type: ignore[attr-defined]
        elif IS_NAME[kind] and id(n) not in not_variables:
            names.add(n.value)  # type: ignore[attr-defined]
    return names


def has_comment(node: cst.CSTNode, text: str) -> bool:
    return any(isinstance(n, cst.Comment) and text in n.value for n in walk(node))


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
            elif isinstance(part, cst.FormattedStringExpression):
                parts.append("{" + cst.Module([]).code_for_node(part.expression) + "}")
        return "".join(parts)
    if isinstance(node, cst.ConcatenatedString):
        left, right = string_text(node.left), string_text(node.right)
        return None if left is None or right is None else left + right
    return None


def classes(module: cst.Module) -> list[cst.ClassDef]:
    return [s for s in module.body if isinstance(s, cst.ClassDef)]


def classes_with_role(module: cst.Module, role: str) -> list[cst.ClassDef]:
    return [c for c in classes(module) if class_role(c.name.value) == role]


def method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    for stmt in cls.body.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            return stmt
    return None


def statements(func: cst.FunctionDef | cst.ClassDef) -> Sequence[cst.BaseStatement]:
    """The statements of a function's or a class's indented body (none for a
    one-line body)."""
    return func.body.body if isinstance(func.body, cst.IndentedBlock) else []


def simple_assign(stmt: cst.CSTNode) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """(target, value) of a one-target ``x = v`` statement line."""
    if type(stmt) is not cst.SimpleStatementLine or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if type(small) is cst.Assign and len(small.targets) == 1:
        return small.targets[0].target, small.value
    if type(small) is cst.AnnAssign and small.value is not None:
        return small.target, small.value
    return None


def assigns_call_of(stmt: cst.CSTNode, callee: str) -> bool:
    """``stmt`` is a one-target ``x = callee(...)`` statement line."""
    pair = simple_assign(stmt)
    return pair is not None and isinstance(pair[1], cst.Call) and dotted(pair[1].func) == callee


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
        if found is not None and found[0] == attr and isinstance(stmt, cst.SimpleStatementLine):
            return stmt
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


def leading_lines(stmt: cst.CSTNode) -> Sequence[cst.EmptyLine]:
    """The blank and comment lines above a statement (none for other nodes)."""
    return (
        stmt.leading_lines if isinstance(stmt, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) else ()
    )


def code_of(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


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
                    local = dotted(alias.asname.name) if alias.asname else dotted(alias.name)
                    if isinstance(local, str):
                        found[local] = f"{base}.{dotted(alias.name)}"
    return found


def class_of_role(module: cst.Module, role: str) -> cst.ClassDef | None:
    found = classes_with_role(module, role)
    return found[0] if found else None


def role_of(cls: cst.ClassDef) -> str | None:
    return class_role(cls.name.value)


def is_docstring(stmt: cst.CSTNode) -> bool:
    """Whether a statement is a bare string (a docstring at the top of a body)."""
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


# -- read by the lint rules --------------------------------------------------------------


def method_name(call: cst.Call) -> str | None:
    """``to`` for ``<anything>.to(...)``; None for calls of plain names."""
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def receiver(call: cst.Call) -> cst.BaseExpression | None:
    """``x`` for ``x.m(...)``."""
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.value
    return None


def has_star_args(call: cst.Call) -> bool:
    return any(a.star for a in call.args)


def string_value(node: cst.CSTNode | None) -> str | None:
    """The text of a plain (non-f, non-bytes) string literal, else None."""
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    if isinstance(node, cst.ConcatenatedString):
        joined = node.evaluated_value
        return joined if isinstance(joined, str) else None
    return None


def int_value(node: cst.CSTNode | None) -> int | None:
    """The value of an integer literal, including a negated one."""
    if isinstance(node, cst.Integer):
        try:
            return int(node.value, 0)
        except ValueError:
            return None
    if (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
    ):
        value = int_value(node.expression)
        return None if value is None else -value
    return None


def strip_optional(annotation: cst.BaseExpression | None) -> list[cst.BaseExpression]:
    """The alternatives of an annotation: ``Optional[X]``, ``X | None`` and
    ``Union[X, Y]`` are unpacked; a string annotation is left as is."""
    if annotation is None:
        return []
    if isinstance(annotation, cst.BinaryOperation) and isinstance(annotation.operator, cst.BitOr):
        return strip_optional(annotation.left) + strip_optional(annotation.right)
    if isinstance(annotation, cst.Subscript):
        base = dotted(annotation.value)
        if base in ("Optional", "typing.Optional", "Union", "typing.Union"):
            out: list[cst.BaseExpression] = []
            for element in annotation.slice:
                if isinstance(element.slice, cst.Index):
                    out += strip_optional(element.slice.value)
            return out
    return [annotation]


_NODE_FIELDS: dict[type, tuple[str, ...]] = {}


def iter_nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and every node under it (whitespace fields skipped)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        t = type(current)
        fields = _NODE_FIELDS.get(t)
        if fields is None:
            fields = _NODE_FIELDS[t] = tuple(
                f.name for f in dataclasses.fields(t) if not f.name.startswith("whitespace")
            )
        for name in fields:
            value = getattr(current, name)
            if isinstance(value, cst.CSTNode):
                stack.append(value)
            elif isinstance(value, (tuple, list)):
                stack.extend(v for v in value if isinstance(v, cst.CSTNode))
