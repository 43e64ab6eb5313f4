"""A removed group attribute no instance of its class reads: ``unread_group`` (benchmarks/mutation.py).

``unread_group(code, line, elsewhere, getters)``: the statement removed at
``line`` is ``self.A = get_x_group()`` at the top of the ``__init__`` of a
module-level class ``C``, where ``get_x_group`` is one of ``getters``: the
API's parallel-state getters (the stand-in's functions of no parameter
returning a ``GroupCoordinator``), imported by the module and bound nowhere
else in it. Removing it leaves instances of ``C`` without ``A``, which
changes nothing when nothing reads ``A`` from an instance of ``C``:

- every other attribute ``.A`` of the module is ``self.A`` directly in a
  method of a class ``D`` that no chain of bases connects to ``C`` (by the
  names of the module's classes), so its ``self`` is never an instance of
  ``C``;
- no string of the module is ``"A"`` (``getattr``, ``setattr``, ``hasattr``
  by name), the module reads no ``__dict__`` and calls no ``vars``, and the
  package's other files and the stand-in (``elsewhere``) never name ``A``.

The premises, of the API: a getter of the parallel state is a lookup, whose
only effect is to fail when the parallel state does not exist, and vLLM
creates it before any model is built (the module's other ``__init__`` methods
call such getters unconditionally too); a ``GroupCoordinator`` is no
``nn.Module``, ``nn.Parameter`` or tensor, so storing it registers nothing
in the module (no submodule, parameter or state-dict entry). Anything else is
not proved.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable


def unread_group(code: str, line: int, elsewhere: Iterable[str], getters: Iterable[str]) -> str | None:
    """Why removing the statement at ``line`` of ``code`` is equivalent, or None."""
    tree = ast.parse(code)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    found = _store(tree, classes, line, set(getters))
    if found is None:
        return None
    owner, attribute, getter = found
    related = _related(owner, classes)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == attribute:
            return None
        if isinstance(node, ast.Attribute) and node.attr == "__dict__":
            return None
        if isinstance(node, ast.Name) and node.id == "vars":
            return None
    for name, cls in classes.items():
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and node.attr == attribute:
                if node.lineno == line or (name not in related and _own(node, cls)):
                    continue
                return None
    outside = sum(isinstance(n, ast.Attribute) and n.attr == attribute for n in ast.walk(tree))
    inside = sum(
        isinstance(n, ast.Attribute) and n.attr == attribute for c in classes.values() for n in ast.walk(c)
    )
    if outside != inside:  # a read by a module-level function
        return None
    pattern = re.compile(rf"\b{re.escape(attribute)}\b")
    if any(pattern.search(text) for text in elsewhere):
        return None
    return (
        f"self.{attribute} = {getter}(): no instance of {owner} reads {attribute} "
        "(a parallel-state lookup, registered nowhere)"
    )


def _store(tree: ast.Module, classes: dict, line: int, getters: set[str]) -> tuple[str, str, str] | None:
    """(class, attribute, getter) of the store at ``line``, when it has the proof's form."""
    for name, cls in classes.items():
        init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        if init is None or not init.args.args:
            continue
        this = init.args.args[0].arg
        for statement in init.body:
            if statement.lineno != line or not isinstance(statement, ast.Assign):
                continue
            if len(statement.targets) != 1 or not isinstance(statement.targets[0], ast.Attribute):
                return None
            target, value = statement.targets[0], statement.value
            if not (isinstance(target.value, ast.Name) and target.value.id == this):
                return None
            if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
                return None
            if value.args or value.keywords or value.func.id not in getters:
                return None
            if not _imported_only(tree, value.func.id):
                return None
            return name, target.attr, value.func.id
    return None


def _imported_only(tree: ast.Module, name: str) -> bool:
    """``name`` is bound by a ``from ... import`` of the module and by nothing else."""
    imported = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            imported = imported or any(a.name == name and a.asname is None for a in node.names)
        elif isinstance(node, ast.Import) and any((a.asname or a.name) == name for a in node.names):
            return False
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return False
        elif isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return False
        elif isinstance(node, ast.arg) and node.arg == name:
            return False
    return imported


def _related(owner: str, classes: dict) -> set[str]:
    """The module's classes connected to ``owner`` by inheritance (its bases,
    the classes derived from it, and theirs: more than the classes whose
    ``self`` can be an instance of ``owner``, never fewer)."""
    edges = {
        (name, b.id)
        for name, cls in classes.items()
        for b in cls.bases
        if isinstance(b, ast.Name) and b.id in classes
    }
    related, changed = {owner}, True
    while changed:
        grown = related | {a for a, b in edges if b in related} | {b for a, b in edges if a in related}
        changed, related = grown != related, grown
    return related


def _own(node: ast.Attribute, cls: ast.ClassDef) -> bool:
    """``node`` is ``self.A`` directly in a method of ``cls`` (not a nested function)."""
    for method in cls.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not method.args.args:
            continue
        this = method.args.args[0].arg
        nested = [
            n for n in ast.walk(method) if n is not method and isinstance(n, (ast.FunctionDef, ast.Lambda))
        ]
        if any(node is n for n in ast.walk(method)):
            if any(node is m for scope in nested for m in ast.walk(scope)):
                return False
            return isinstance(node.value, ast.Name) and node.value.id == this and not _rebinds(method, this)
    return False


def _rebinds(method: ast.AST, name: str) -> bool:
    return any(
        isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load) for n in ast.walk(method)
    )
