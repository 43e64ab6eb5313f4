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

from collections.abc import Collection

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
) -> tuple[str, list[cst.CSTNode]]:
    """The module's code, and the nodes whose ids are in ``nodes`` in the
    order the code holds them (the order a transformer meets them); the code
    of each top-level statement is kept.

    ``renamed``: a module made from ``module`` by giving leaves (names,
    strings, comments) new values, and those values by the old leaf's id. Its
    statements print as this module's, each renamed leaf's token replaced, and
    that code is kept too (not printed again)."""
    if _CodegenState is None or not module.has_trailing_newline or not module.body:
        order: list[cst.CSTNode] = []

        class _Order(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                if id(node) in nodes:
                    order.append(node)
                return True

        module.visit(_Order())
        return module.code, order
    parts = [*module.header, *module.body, *module.footer]
    new_parts, values = [], {}
    if renamed is not None and _same_layout(module, renamed[0]):
        new_parts, values = [*renamed[0].header, *renamed[0].body, *renamed[0].footer], renamed[1]
    state = _OrderState(module, nodes, values if len(new_parts) == len(parts) else {})
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
