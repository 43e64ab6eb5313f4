"""The code of nodes, with the code of each statement printed once.

A step keeps the statements it does not edit (``edit.tree.rewrite``), so
the class a step edited in one method holds, for the rest, statements whose
code was printed before: by the census (a method, a statement of a
method's flattened body) or by an earlier step (the class as it was).
``node_code`` prints a node as ``Module.code_for_node`` does, and splices
in the kept code of every statement below it printed before.

A statement prints the same wherever it stands, up to the indentation of
the block that holds it: LibCST writes that indentation (the tokens of the
enclosing blocks) at the start of each of the statement's lines. So the
code is kept without it, cut at those points, and joined with the
indentation of the place where it is spliced. A statement printed with
keyword arguments (an ``elif``) is printed, not spliced.

LibCST's code generation is entered through its private ``CodegenState``
(as in ``printed.py``), and its statements print through ``_codegen``,
which is LibCST's own for any other state; without ``CodegenState`` every
node is printed by LibCST.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import libcst as cst

try:  # private API, pinned by libcst>=1.8,<2 in pyproject.toml (as in printed.py)
    from libcst._nodes.internal import CodegenState as _CodegenState
except ImportError:  # pragma: no cover - exercised only with another LibCST
    _CodegenState = None  # type: ignore[assignment, misc]

_KEPT = 65536
# (id, default indent, default newline) -> (statement, its code cut where the enclosing indentation goes)
_CODES: dict[tuple[int, str, str], tuple[cst.CSTNode, list[str]]] = {}
_ORIGINAL = cst.CSTNode._codegen
_NO_POSITION = nullcontext()


def node_code(module: cst.Module, node: cst.CSTNode) -> str:
    """``module.code_for_node(node)``."""
    if _CodegenState is None:
        return module.code_for_node(node)
    state = SplicingState(default_indent=module.default_indent, default_newline=module.default_newline)
    node._codegen(state)
    return "".join(state.tokens)


def _codegen(node: cst.CSTNode, state: Any, **kwargs: Any) -> None:
    """The code generation of statements: kept code spliced, or printed and kept
    (for ``SplicingState``; LibCST's own otherwise)."""
    if kwargs or type(state) not in _STATES:
        _ORIGINAL(node, state, **kwargs)
        return
    key = (id(node), state.default_indent, state.default_newline)
    kept = _CODES.get(key)
    if kept is not None and kept[0] is node and state.SPLICES:
        state.splice(kept[1])
        return
    start, marks = len(state.tokens), len(state.marks)
    _ORIGINAL(node, state)
    _CODES[key] = (node, state.cut(start, marks))
    if len(_CODES) > _KEPT:
        del _CODES[next(iter(_CODES))]


if _CodegenState is not None:

    class SplicingState(_CodegenState):
        """Code generation that notes where it writes the enclosing blocks'
        indentation, so a statement's code can be kept without it. A
        subclass that must see every node printed (``SPLICES = False``)
        keeps the code of statements and splices none; it is registered in
        ``_STATES``."""

        SPLICES = True
        __slots__ = ("marks",)

        def __init__(self, default_indent: str, default_newline: str) -> None:
            super().__init__(default_indent=default_indent, default_newline=default_newline)
            self.marks: list[int] = []  # the token index of each indentation written

        def add_indent_tokens(self) -> None:
            self.marks.append(len(self.tokens))
            self.tokens.extend(self.indent_tokens)

        def cut(self, start: int, first_mark: int) -> list[str]:
            """The code written from token ``start`` on, cut at each
            indentation written since mark ``first_mark``, without the
            indentation the statement was printed at."""
            tokens, depth = self.tokens, len(self.indent_tokens)
            parts, begin = [], start
            for mark in self.marks[first_mark:]:
                parts.append("".join(tokens[begin:mark]))
                begin = mark + depth
            parts.append("".join(tokens[begin:]))
            return parts

        def record_syntactic_position(
            self, node: Any, *, start_node: Any = None, end_node: Any = None
        ) -> Any:
            """Nothing (as LibCST's, which records no position either, but
            as a generator context made for each node printed)."""
            return _NO_POSITION

        def splice(self, parts: list[str]) -> None:
            """Write kept code at the current indentation (noting where it goes)."""
            tokens = self.tokens
            tokens.append(parts[0])
            for part in parts[1:]:
                self.marks.append(len(tokens))
                tokens.extend(self.indent_tokens)
                tokens.append(part)

    _STATES: set[type] = {SplicingState}
    # every statement is printed through ``_codegen`` (no LibCST statement class has its own)
    setattr(cst.BaseStatement, "_codegen", _codegen)  # noqa: B010

    from libcst._nodes.expression import _BaseParenthesizedNode

    _PARENTHESIZE = _BaseParenthesizedNode._parenthesize

    class _Parenthesized:
        """The parentheses of ``node`` written around its code, as LibCST's
        ``_parenthesize`` writes them, without its generator context."""

        __slots__ = ("node", "state")

        def __init__(self, node: Any, state: Any) -> None:
            self.node, self.state = node, state

        def __enter__(self) -> None:
            for lpar in self.node.lpar:
                lpar._codegen(self.state)

        def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
            if kind is None:  # as LibCST's: nothing more written when the code generation raised
                for rpar in self.node.rpar:
                    rpar._codegen(self.state)

    def _parenthesize(node: Any, state: Any) -> Any:
        """LibCST's for its own states; for a ``SplicingState`` (which records
        no positions) a plain context, none at all for an expression without
        parentheses (most of them)."""
        if type(state) not in _STATES:
            return _PARENTHESIZE(node, state)
        if not node.lpar and not node.rpar:
            return _NO_POSITION
        return _Parenthesized(node, state)

    setattr(_BaseParenthesizedNode, "_parenthesize", _parenthesize)  # noqa: B010


def register(state_type: type) -> None:
    """Make the states of ``state_type`` (a ``SplicingState``) keep statements' code."""
    _STATES.add(state_type)
