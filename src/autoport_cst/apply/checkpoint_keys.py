"""The apply-time check of a port's checkpoint keys: every key the written
``load_weights`` loads must be one the checkpoint the plan was researched on
stores (``plan.checkpoint_keys``, its header's key patterns), so that a port
that cannot load that checkpoint is refused before anything is written
(exit 2, at the mapping entry, naming the tensor and the keys present),
not at load.

Keys are read statically: string and f-string values of ``mappings[...] =
...`` (lists, list comprehensions and their sums too), with the layer
prefix variables expanded and every other name in an f-string a wildcard
(one segment). A value computed at load time (a lookup among names, an
f-string field other than a name: ``f"{moe.router}.weight"``) is not
checked; of ``if``/``else`` branches that map the same parameter one must
fit; an entry under an ``if`` without ``else`` is optional.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from autoport_cst.errors import InputError, Position

_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


@dataclass(frozen=True)
class LoadedKey:
    parameter: str
    keys: tuple[str, ...]
    line: int


def check_checkpoint_keys(stored: tuple[str, ...] | None, files: dict[str, str], tied: bool | None) -> None:
    """Raise InputError for the first key a port's ``load_weights`` loads
    that ``stored`` (key patterns) does not have; nothing when the plan
    records no checkpoint. ``tied`` (the plan's ``embedding.tied``) decides
    the branches on ``config.tie_word_embeddings``."""
    if not stored:
        return
    patterns = [p.split(".") for p in stored]
    for path, text in sorted(files.items()):
        if not path.endswith(".py") or "def load_weights" not in text:
            continue
        for groups in _load_weights_entries(text, tied):
            failures = [(entry, _missing(entry, patterns)) for entry in groups]
            if all(missing for _, missing in failures):
                entry, missing = failures[0]
                raise InputError(_message(entry, missing[0], stored), Position(path, entry.line))


def _missing(entry: LoadedKey, patterns: list[list[str]]) -> list[str]:
    return [key for key in entry.keys if not any(_fits(key.split("."), p) for p in patterns)]


def _fits(key: list[str], stored: list[str]) -> bool:
    return len(key) == len(stored) and all(
        a == b or a == "*" or b == "*" for a, b in zip(key, stored, strict=True)
    )


def _message(entry: LoadedKey, key: str, stored: tuple[str, ...]) -> str:
    head = key.split(".")
    near = sorted(p for p in stored if p.split(".")[: max(1, len(head) - 2)] == head[: max(1, len(head) - 2)])
    shown = near or sorted(stored)
    listed = ", ".join(shown[:12]) + (f", ... {len(shown) - 12} more" if len(shown) > 12 else "")
    return (
        f"the port loads {key} for parameter {entry.parameter}, which the checkpoint the plan was made on "
        f"does not store (plan checkpoint_keys); keys present: {listed}"
    )


def _load_weights_entries(text: str, tied: bool | None) -> list[list[LoadedKey]]:
    """Each mapped parameter's alternatives (one list per parameter)."""
    tree = ast.parse(text)
    out: list[list[LoadedKey]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "load_weights":
            variables: dict[str, str] = {}
            out += _statements(node.body, variables, tied)
    return out


def _statements(body: list[ast.stmt], variables: dict[str, str], tied: bool | None) -> list[list[LoadedKey]]:
    out: list[list[LoadedKey]] = []
    for stmt in body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            _assignment(stmt, variables, out)
        elif isinstance(stmt, ast.If) and tied is not None and _reads_tying(stmt.test):
            out += _statements(stmt.body if tied else stmt.orelse, variables, tied)
        elif isinstance(stmt, ast.If):
            branches = [_statements(stmt.body, dict(variables), tied)]
            if stmt.orelse:
                branches.append(_statements(stmt.orelse, dict(variables), tied))
                out += _alternatives(branches)
        elif isinstance(stmt, (ast.For, ast.While, ast.With, ast.Try)):
            out += _statements(stmt.body, variables, tied)
    return out


def _reads_tying(test: ast.expr) -> bool:
    """``if <...>.tie_word_embeddings:``"""
    return isinstance(test, ast.Attribute) and test.attr == "tie_word_embeddings"


def _assignment(stmt: ast.Assign, variables: dict[str, str], out: list[list[LoadedKey]]) -> None:
    target = stmt.targets[0]
    if isinstance(target, ast.Name):
        text = _string(stmt.value, variables)
        if text is not None:
            variables[target.id] = text
        else:
            variables.pop(target.id, None)
        return
    if (
        isinstance(target, ast.Subscript)
        and isinstance(target.value, ast.Name)
        and target.value.id == "mappings"
    ):
        parameter = _string(target.slice, variables)
        keys = _keys(stmt.value, variables)
        if parameter is not None and keys:
            out.append([LoadedKey(parameter, tuple(_INDEX.sub("*", k) for k in keys), stmt.lineno)])


def _alternatives(branches: list[list[list[LoadedKey]]]) -> list[list[LoadedKey]]:
    """Parameters every branch maps: one of the branches' keys must fit."""
    by_branch = [{group[0].parameter: group for group in branch} for branch in branches]
    shared = set(by_branch[0]).intersection(*by_branch[1:])
    return [[entry for b in by_branch for entry in b[parameter]] for parameter in sorted(shared)]


def _keys(node: ast.expr, variables: dict[str, str]) -> list[str] | None:
    text = _string(node, variables)
    if text is not None:
        return [text]
    if isinstance(node, (ast.List, ast.Tuple)):
        parts = [_keys(e, variables) for e in node.elts]
        return None if any(p is None for p in parts) else [k for p in parts if p is not None for k in p]
    if isinstance(node, ast.ListComp):
        return _keys(node.elt, variables)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _keys(node.left, variables), _keys(node.right, variables)
        return None if left is None or right is None else left + right
    return None


def _string(node: ast.expr, variables: dict[str, str]) -> str | None:
    """A string or f-string as a key pattern: known variables expanded,
    other fields ``*``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.JoinedStr):
        return None
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
            parts.append(variables.get(value.value.id, "*"))
        else:
            # a value looked up at load time (f"{moe.router}.weight"), of any number of segments
            return None
    return "".join(parts)
