"""Whether a step changed a file's code, told without printing the file.

A codemod edits a module in place of the nodes it targets and keeps every
other node (``transform.cst_helpers.rewrite``), so the module before and
after a step share most of their statements as the same objects. Shared
statements print the same, so two modules print the same code exactly when
the runs of statements between the shared ones print the same, compared in
the indentation they sit at: a class or function that the step rebuilt
around an edit is compared by the runs of its own body.

``changed_code`` returns None when that cannot be told so (another header,
footer or layout, or no statement in common): the caller compares the whole
modules' code then.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import libcst as cst

try:  # private API, pinned by libcst>=1.8,<2 in pyproject.toml (as in lint/positions.py)
    from libcst._nodes.internal import CodegenState as _CodegenState
except ImportError:  # pragma: no cover - exercised only with another LibCST
    _CodegenState = None  # type: ignore[assignment, misc]

Run = tuple[Sequence[cst.BaseStatement], Sequence[cst.BaseStatement], int, int]

_LAYOUT = ("encoding", "default_indent", "default_newline", "has_trailing_newline")


def changed_code(before: cst.Module, after: cst.Module) -> bool | None:
    """Whether ``after`` prints other code than ``before``; None when the
    shared statements cannot tell."""
    if (
        not after.has_trailing_newline
        or any(getattr(before, name) != getattr(after, name) for name in _LAYOUT)
        or not _same_nodes(before.header, after.header)
        or not _same_nodes(before.footer, after.footer)
    ):
        return None
    found = _Printer(before).compare(before.body, after.body, ())
    return None if found is None else found[0]


class _Printer:
    """Prints statements at an indentation, and compares lists of them."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module

    def code(self, statements: Sequence[cst.BaseStatement], indents: tuple[str, ...]) -> str:
        if not indents:
            return "".join(map(self.module.code_for_node, statements))
        assert _CodegenState is not None  # nested runs are compared only with it
        state = _CodegenState(
            default_indent=self.module.default_indent, default_newline=self.module.default_newline
        )
        state.indent_tokens.extend(indents)
        for statement in statements:
            statement._codegen(state)
        return "".join(state.tokens)

    def compare(
        self, old: Sequence[cst.BaseStatement], new: Sequence[cst.BaseStatement], indents: tuple[str, ...]
    ) -> tuple[bool, int] | None:
        """(whether ``old`` and ``new`` print differently, how much longer
        ``old`` prints) when printed at ``indents``; None when they share no
        statement."""
        runs = _replaced_runs(old, new)
        if runs is None:
            return None
        results = [self._run(run, indents) for run in runs]
        differing = [i for i, (differs, _) in enumerate(results) if differs]
        delta = sum(length for _, length in results)
        if len(differing) <= 1 or delta != 0:
            return bool(differing), delta
        # several runs differ and the lengths agree: compare the stretch they span
        first, last = runs[differing[0]], runs[differing[-1]]
        old_text = self.code(old[first[2] : last[2] + len(last[0])], indents)
        new_text = self.code(new[first[3] : last[3] + len(last[1])], indents)
        return old_text != new_text, len(old_text) - len(new_text)

    def _run(self, run: Run, indents: tuple[str, ...]) -> tuple[bool, int]:
        old, new = run[0], run[1]
        if len(old) == 1 and len(new) == 1 and _CodegenState is not None:
            block = _rebuilt_body(old[0], new[0])
            if block is not None:
                indent = self.module.default_indent if block.indent is None else block.indent
                inner = self.compare(block.body, new[0].body.body, (*indents, indent))  # type: ignore[attr-defined]
                if inner is not None:
                    return inner
        old_text, new_text = self.code(old, indents), self.code(new, indents)
        return old_text != new_text, len(old_text) - len(new_text)


def _rebuilt_body(old: cst.BaseStatement, new: cst.BaseStatement) -> cst.IndentedBlock | None:
    """``old``'s indented body when ``new`` is ``old`` with another body
    (every other field the same objects, both bodies indented and non-empty)."""
    if type(old) is not type(new) or not isinstance(old, (cst.ClassDef, cst.FunctionDef)):
        return None
    if not _same_fields(old, new, skip="body"):
        return None
    old_body, new_body = old.body, new.body  # type: ignore[attr-defined]
    if not (isinstance(old_body, cst.IndentedBlock) and isinstance(new_body, cst.IndentedBlock)):
        return None
    if not (old_body.body and new_body.body and _same_fields(old_body, new_body, skip="body")):
        return None
    return old_body


def _same_fields(old: cst.CSTNode, new: cst.CSTNode, skip: str) -> bool:
    for field in dataclasses.fields(old):
        if field.name == skip:
            continue
        a, b = getattr(old, field.name), getattr(new, field.name)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            if not _same_nodes(a, b):
                return False
        elif a is not b and (isinstance(a, cst.CSTNode) or a != b):
            return False
    return True


def _replaced_runs(old: Sequence[cst.BaseStatement], new: Sequence[cst.BaseStatement]) -> list[Run] | None:
    """The runs of statements between the statements ``old`` and ``new``
    share, in order: (old run, new run, where each starts); None when they
    share none."""
    where = {id(statement): i for i, statement in enumerate(old)}
    runs: list[Run] = []
    i = j = shared = 0
    for k, statement in enumerate(new):
        match = where.get(id(statement))
        if match is None or match < i:
            continue
        if match > i or k > j:
            runs.append((old[i:match], new[j:k], i, j))
        i, j, shared = match + 1, k + 1, shared + 1
    if len(old) > i or len(new) > j:
        runs.append((old[i:], new[j:], i, j))
    return runs if shared else None


def _same_nodes(first: Sequence[object], second: Sequence[object]) -> bool:
    return len(first) == len(second) and all(a is b for a, b in zip(first, second, strict=True))
