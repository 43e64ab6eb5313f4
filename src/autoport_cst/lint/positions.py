"""Line and column of a few nodes, computed only when a file has findings.

LibCST's ``PositionProvider`` records a range for every node of the module
(about twice the cost of parsing). Lint needs positions only for the nodes it
reports, so this module runs the module's code generation once with a
codegen state that computes a position only when it meets one of the target
nodes; the semantics are those of ``PositionProvider`` (syntactic start and
end, 1-based lines, 0-based columns). If LibCST's internals change, it falls
back to ``PositionProvider``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from contextlib import nullcontext

import libcst as cst

NEWLINE = re.compile(r"\r\n?|\n")
_NULL = nullcontext()

Range = tuple[int, int, int, int]  # start line, start column, end line, end column (0-based columns)

try:  # private API, pinned by libcst>=1.8,<2 in pyproject.toml
    from libcst._nodes.internal import CodegenState as _CodegenState
except ImportError:  # pragma: no cover - exercised only with another LibCST
    _CodegenState = None  # type: ignore[assignment, misc]  # an optional class import, tested below


if _CodegenState is not None:

    class _TargetedState(_CodegenState):
        __slots__ = ("targets", "found", "_line", "_column", "_seen")

        def __init__(self, module: cst.Module, targets: set[int]) -> None:
            super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
            self.targets = targets
            self.found: dict[int, list[int]] = {}
            self._line = 1
            self._column = 0
            self._seen = 0

        def _here(self) -> tuple[int, int]:
            tokens = self.tokens
            line, column = self._line, self._column
            for index in range(self._seen, len(tokens)):
                token = tokens[index]
                if "\n" in token or "\r" in token:
                    parts = NEWLINE.split(token)
                    line += len(parts) - 1
                    column = len(parts[-1])
                else:
                    column += len(token)
            self._seen = len(tokens)
            self._line, self._column = line, column
            return line, column

        def before_codegen(self, node: cst.CSTNode) -> None:
            if id(node) in self.targets:
                line, column = self._here()
                self.found.setdefault(id(node), [line, column, line, column, 0])

        def after_codegen(self, node: cst.CSTNode) -> None:
            key = id(node)
            if key in self.targets:
                entry = self.found[key]
                if not entry[4]:  # keep a syntactic range recorded inside
                    entry[2], entry[3] = self._here()

        def record_syntactic_position(self, node, *, start_node=None, end_node=None):
            if id(node) in self.targets:
                # a range hoisted from children needs their positions too
                if start_node is not None:
                    self.targets.add(id(start_node))
                if end_node is not None:
                    self.targets.add(id(end_node))
                return _Recorder(self, node, start_node, end_node)
            return _NULL

    class _Recorder:
        __slots__ = ("state", "key", "start_key", "end_key")

        def __init__(
            self,
            state: _TargetedState,
            node: cst.CSTNode,
            start_node: cst.CSTNode | None,
            end_node: cst.CSTNode | None,
        ) -> None:
            self.state = state
            self.key = id(node)
            self.start_key = None if start_node is None else id(start_node)
            self.end_key = None if end_node is None else id(end_node)

        def __enter__(self) -> None:
            line, column = self.state._here()
            entry = self.state.found.setdefault(self.key, [line, column, line, column, 0])
            entry[0], entry[1] = line, column

        def __exit__(self, *exc) -> None:
            found = self.state.found
            line, column = self.state._here()
            entry = found[self.key]
            entry[2], entry[3], entry[4] = line, column, 1
            if self.start_key is not None and self.start_key in found:
                entry[0], entry[1] = found[self.start_key][0], found[self.start_key][1]
            if self.end_key is not None and self.end_key in found:
                entry[2], entry[3] = found[self.end_key][2], found[self.end_key][3]


def positions(
    module: cst.Module,
    nodes: Iterable[cst.CSTNode],
    tops: Iterable[cst.CSTNode] | None = None,
    source: str | None = None,
) -> dict[int, Range]:
    """``id(node)`` -> (start line, start column, end line, end column) for
    each of ``nodes`` found in ``module``.

    With ``tops`` (the top-level statements that contain the nodes) and the
    module's ``source``, only those statements are generated: each one's
    text is found in the source (it must occur exactly once after the
    previous one) to get its first line. Otherwise the whole module is
    generated."""
    targets = {id(n) for n in nodes}
    if not targets:
        return {}
    if _CodegenState is not None and tops is not None and source is not None:
        found = _positions_by_statement(module, targets, tops, source)
        if found is not None:
            return found
    if _CodegenState is not None:
        try:
            state = _TargetedState(module, targets)
            module._codegen(state)
            return {k: (v[0], v[1], v[2], v[3]) for k, v in state.found.items()}
        except (AttributeError, TypeError):  # pragma: no cover - LibCST internals changed
            pass
    return _positions_slow(module, targets)  # pragma: no cover


def _positions_by_statement(
    module: cst.Module, targets: set[int], tops: Iterable[cst.CSTNode], source: str
) -> dict[int, Range] | None:
    if "\r" in source:
        return None
    wanted = {id(t) for t in tops}
    out: dict[int, Range] = {}
    cursor = 0
    for stmt in module.body:
        if id(stmt) not in wanted:
            continue
        state = _TargetedState(module, targets)
        stmt._codegen(state)
        state._here()
        text = "".join(state.tokens)
        index = source.find(text, cursor)
        if index < 0 or source.find(text, index + 1) >= 0 or (index and source[index - 1] != "\n"):
            return None
        shift = source.count("\n", 0, index)
        for key, (l1, c1, l2, c2, _) in state.found.items():
            out[key] = (l1 + shift, c1, l2 + shift, c2)
        cursor = index + len(text)
    if len(out) < len(targets) and not targets <= out.keys():
        return None
    return out


def _positions_slow(module: cst.Module, targets: set[int]) -> dict[int, Range]:
    from libcst.metadata import MetadataWrapper, PositionProvider

    resolved = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    out: dict[int, Range] = {}
    for node, rng in resolved.items():
        if id(node) in targets:
            out[id(node)] = (rng.start.line, rng.start.column, rng.end.line, rng.end.column)
    return out
