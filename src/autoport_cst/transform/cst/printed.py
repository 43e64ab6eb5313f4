"""The code of modules, printed a statement at a time and kept.

A codemod edits a module in place of the nodes it targets and keeps every
other node (``edit.tree.rewrite``), so the modules a port goes through
share most of their top-level statements as the same objects. A module's
code is its header lines, its statements and its footer lines printed one
after the other, and a statement prints the same in any module of the same
layout, so ``module_code`` prints each statement once and joins: a step
that edits one class prints that class, not the file.

The kept code is bounded (the least recently printed goes first) and holds
the nodes it printed, so their ids stay theirs.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

import libcst as cst

from autoport_cst.transform.cst.statement_code import node_code

try:  # private API, pinned by libcst>=1.8,<2 in pyproject.toml (as in lint/positions.py)
    from libcst._nodes.internal import CodegenState as _CodegenState
except ImportError:  # pragma: no cover - exercised only with another LibCST
    _CodegenState = None  # type: ignore[assignment, misc]

_KEPT = 4096
_CODES: dict[tuple[int, str, str], tuple[cst.CSTNode, str]] = {}


def module_code(module: cst.Module) -> str:
    """``module.code``, joined from the code of its top-level nodes."""
    if not module.has_trailing_newline or not module.body:
        return module.code  # the last newline dropped, or a file of comments: printed whole
    parts = [*module.header, *module.body, *module.footer]
    return "".join(top_level_code(module, node) for node in parts)


def top_level_code(module: cst.Module, node: cst.CSTNode) -> str:
    """The code of a top-level statement (or header or footer line) of ``module``."""
    key = (id(node), module.default_indent, module.default_newline)
    found = _CODES.pop(key, None)
    if found is None:
        found = (node, node_code(module, node))
    _keep(key, found)
    return found[1]


def _keep(key: tuple[int, str, str], entry: tuple[cst.CSTNode, str]) -> None:
    _CODES[key] = entry
    if len(_CODES) > _KEPT:
        del _CODES[next(iter(_CODES))]


def code_in_order(
    module: cst.Module,
    nodes: Collection[int],
    renamed: tuple[cst.Module, dict[int, str]] | None = None,
    leaves: Mapping[int, cst.CSTNode] | None = None,
) -> tuple[str, list[cst.CSTNode]]:
    """The module's code, and the nodes whose ids are in ``nodes`` in the
    order the code holds them (the order a transformer meets them); the code
    of each top-level statement is kept.

    ``renamed``: a module made from ``module`` by giving leaves (names,
    strings, comments) new values, and those values by the old leaf's id. Its
    statements print as this module's, each renamed leaf's token replaced, and
    that code is kept too (not printed again).

    ``leaves``: the nodes of ``nodes`` and of the renamed leaves by id, when
    all are leaves that print their value as one token (``Name``,
    ``SimpleString``, ``FormattedStringText``, ``Comment``): their tokens
    are then found among the printed ones by the identity of the value
    string (``leaves_in_code``), not by watching every node print."""
    if leaves is not None:
        found = leaves_in_code(module, [leaves[key] for key in {*nodes, *(renamed or ({}, {}))[1]}], renamed)
        if found is not None:
            return found[0], [placed.node for placed in found[1] if id(placed.node) in nodes]
    if _CodegenState is None or not module.has_trailing_newline or not module.body:
        order: list[cst.CSTNode] = []

        class _Order(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                if id(node) in nodes:
                    order.append(node)
                return True

        module.visit(_Order())
        return module.code, order
    parts, new_parts, values = _parts(module, renamed)
    state = _OrderState(module, nodes, values)
    layout = (module.default_indent, module.default_newline)
    codes = []
    for position, node in enumerate(parts):
        start = len(state.tokens)
        node._codegen(state)  # the code of its statements is kept (for the steps that edit some)
        tokens = state.tokens[start:]
        codes.append("".join(tokens))
        _keep((id(node), *layout), (node, codes[-1]))
        state.replaced, replaced = {}, state.replaced
        if replaced:
            for index, value in replaced.items():
                tokens[index - start] = value
            new = new_parts[position]
            _keep((id(new), *layout), (new, "".join(tokens)))
    return "".join(codes), state.order


def _parts(
    module: cst.Module, renamed: tuple[cst.Module, dict[int, str]] | None
) -> tuple[list[cst.CSTNode], list[cst.CSTNode], dict[int, str]]:
    """The top-level nodes of ``module``, those of the renamed module, and the
    renamed values (none when the renamed module is laid out otherwise)."""
    parts: list[cst.CSTNode] = [*module.header, *module.body, *module.footer]
    new_parts: list[cst.CSTNode] = []
    values: dict[int, str] = {}
    if renamed is not None and _same_layout(module, renamed[0]):
        new_parts, values = [*renamed[0].header, *renamed[0].body, *renamed[0].footer], renamed[1]
    return parts, new_parts, values if len(new_parts) == len(parts) else {}


class Placed(NamedTuple):
    """Where a node's text stands in a module's printed tokens and code."""

    node: cst.CSTNode
    first: int  # its first token (a leaf's value; an f-string's opening quote)
    stop: int  # after its last token
    line: int  # 1-based, of its first token
    column: int  # 1-based
    text: str  # its tokens' text (without parentheses around it)


def leaves_in_code(
    module: cst.Module,
    leaves: Collection[cst.CSTNode],
    renamed: tuple[cst.Module, dict[int, str]] | None = None,
) -> tuple[str, list[Placed]] | None:
    """The module's code, and each of ``leaves`` (names, strings, f-string
    texts, comments: a leaf prints ``state.add_token(self.value)``) and each
    f-string of the module, in the order the code holds them, placed; the
    code of each top-level statement, and of the ``renamed`` module's (as
    ``code_in_order``), is kept.

    Each leaf's token is found among the printed tokens by the identity of
    its value string. None when that identity does not tell them apart: two
    leaves share one string, or a string is printed by another node too (an
    interned short name), so a token cannot be told to be theirs."""
    if _CodegenState is None or not module.has_trailing_newline or not module.body:
        return None
    wanted: dict[int, cst.CSTNode] = {}
    for leaf in leaves:
        if type(leaf) not in _ONE_TOKEN_LEAVES or id(leaf.value) in wanted:  # type: ignore[attr-defined]
            return None
        wanted[id(leaf.value)] = leaf  # type: ignore[attr-defined]
    parts, new_parts, values = _parts(module, renamed)
    state = _PlainState(module.default_indent, module.default_newline)
    starts = []
    for node in parts:
        starts.append(len(state.tokens))
        node._codegen(state)  # the code of its statements is kept (for the steps that edit some)
    tokens = state.tokens
    hits = [index for index, token in enumerate(map(id, tokens)) if token in wanted]
    if len(hits) != len(wanted) or len({id(tokens[index]) for index in hits}) != len(hits):
        return None
    starts.append(len(tokens))
    codes = [_keep_part(parts[n], tokens[starts[n] : starts[n + 1]], module) for n in range(len(parts))]
    replaced: dict[int, dict[int, str]] = {}  # part -> token index -> new value
    for index in hits:
        leaf = wanted[id(tokens[index])]
        if id(leaf) in values:
            replaced.setdefault(bisect_right(starts, index) - 1, {})[index] = values[id(leaf)]
    for n, changes in replaced.items():
        part = tokens[starts[n] : starts[n + 1]]
        for index, value in changes.items():
            part[index - starts[n]] = value
        _keep_part(new_parts[n], part, module)
    spans = [(index, index + 1, wanted[id(tokens[index])]) for index in hits]
    spans += [_fstring_span(tokens, *found) for found in state.fstrings]
    return "".join(codes), _placed(tokens, sorted(spans, key=lambda span: span[0]))


def _keep_part(node: cst.CSTNode, tokens: list[str], module: cst.Module) -> str:
    code = "".join(tokens)
    _keep((id(node), module.default_indent, module.default_newline), (node, code))
    return code


def _fstring_span(tokens: list[str], node: cst.CSTNode, begin: int, end: int) -> tuple[int, int, cst.CSTNode]:
    """The tokens of an f-string printed from ``begin`` to ``end``, from its
    opening quote to its closing one (its parentheses and their whitespace
    are never a quote)."""
    first = tokens.index(node.start, begin)  # type: ignore[attr-defined]
    last = end - 1
    while tokens[last] != node.end:  # type: ignore[attr-defined]
        last -= 1
    return first, last + 1, node


def _placed(tokens: list[str], spans: list[tuple[int, int, cst.CSTNode]]) -> list[Placed]:
    """Each span placed: the line and column (1-based) where its first token starts."""
    found = []
    line, column, done = 1, 1, 0  # where token ``done`` starts
    for index, stop, node in spans:
        between = "".join(tokens[done:index])
        newlines = between.count("\n")
        line, column = (
            line + newlines,
            (column if not newlines else 1) + len(between) - (between.rfind("\n") + 1 if newlines else 0),
        )
        found.append(Placed(node, index, stop, line, column, "".join(tokens[index:stop])))
        done = index
    return found


_ONE_TOKEN_LEAVES = frozenset({cst.Name, cst.SimpleString, cst.FormattedStringText, cst.Comment})


def _same_layout(module: cst.Module, other: cst.Module) -> bool:
    return (module.default_indent, module.default_newline, module.has_trailing_newline) == (
        other.default_indent,
        other.default_newline,
        other.has_trailing_newline,
    )


if _CodegenState is not None:
    from autoport_cst.transform.cst.statement_code import SplicingState, register

    class _OrderState(SplicingState):
        """Code generation that notes the wanted nodes as it meets them, and
        where the token of each leaf to rename is."""

        SPLICES = False  # it must see every node
        __slots__ = ("wanted", "order", "values", "starts", "replaced")

        def __init__(self, module: cst.Module, wanted: Collection[int], values: dict[int, str]) -> None:
            super().__init__(module.default_indent, module.default_newline)
            self.wanted = wanted
            self.order: list[cst.CSTNode] = []
            self.values = values
            self.starts: dict[int, int] = {}
            self.replaced: dict[int, str] = {}  # token index -> new value

        def before_codegen(self, node: cst.CSTNode) -> None:
            if id(node) in self.wanted:
                self.order.append(node)
            if id(node) in self.values:
                self.starts[id(node)] = len(self.tokens)

        def after_codegen(self, node: cst.CSTNode) -> None:
            start = self.starts.pop(id(node), None)
            if start is None:
                return
            # a leaf prints its parentheses and whitespace (never its value's text) and its value
            index = self.tokens.index(node.value, start)  # type: ignore[attr-defined]
            self.replaced[index] = self.values[id(node)]

    register(_OrderState)

    class _PlainState(SplicingState):
        """Code generation that prints every statement (it splices none), so
        that each leaf's value is a token of its own, and notes the tokens
        each f-string prints."""

        SPLICES = False
        __slots__ = ("fstrings",)

        def __init__(self, default_indent: str, default_newline: str) -> None:
            super().__init__(default_indent, default_newline)
            self.fstrings: list[tuple[cst.CSTNode, int, int]] = []  # (f-string, first token, after its last)

    register(_PlainState)
    _NODE_CODEGEN = cst.CSTNode._codegen

    def _fstring_codegen(node: cst.CSTNode, state: Any, **kwargs: Any) -> None:
        if type(state) is not _PlainState:
            _NODE_CODEGEN(node, state, **kwargs)
            return
        begin = len(state.tokens)
        _NODE_CODEGEN(node, state, **kwargs)
        state.fstrings.append((node, begin, len(state.tokens)))

    setattr(cst.FormattedString, "_codegen", _fstring_codegen)  # noqa: B010
