"""The code of modules, printed a statement at a time and kept.

A codemod edits a module in place of the nodes it targets and keeps every
other node (``cst_helpers.rewrite``), so the modules a port goes through
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
        found = (node, module.code_for_node(node))
    _keep(key, found)
    return found[1]


def _keep(key: tuple[int, str, str], entry: tuple[cst.CSTNode, str]) -> None:
    _CODES[key] = entry
    if len(_CODES) > _KEPT:
        del _CODES[next(iter(_CODES))]


def code_in_order(module: cst.Module, nodes: Collection[int]) -> tuple[str, list[cst.CSTNode]]:
    """The module's code, and the nodes whose ids are in ``nodes`` in the
    order the code holds them (the order a transformer meets them); the code
    of each top-level statement is kept."""
    if _CodegenState is None or not module.has_trailing_newline or not module.body:
        order: list[cst.CSTNode] = []

        class _Order(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                if id(node) in nodes:
                    order.append(node)
                return True

        module.visit(_Order())
        return module.code, order
    state = _OrderState(module, nodes)
    codes = []
    for node in [*module.header, *module.body, *module.footer]:
        start = len(state.tokens)
        node._codegen(state)
        code = "".join(state.tokens[start:])
        _keep((id(node), module.default_indent, module.default_newline), (node, code))
        codes.append(code)
    return "".join(codes), state.order


if _CodegenState is not None:

    class _OrderState(_CodegenState):
        """Code generation that notes the wanted nodes as it meets them."""

        __slots__ = ("wanted", "order")

        def __init__(self, module: cst.Module, wanted: Collection[int]) -> None:
            super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
            self.wanted = wanted
            self.order: list[cst.CSTNode] = []

        def before_codegen(self, node: cst.CSTNode) -> None:
            if id(node) in self.wanted:
                self.order.append(node)
