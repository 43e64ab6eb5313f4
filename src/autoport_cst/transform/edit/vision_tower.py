"""Edits of a vision tower's parameters: dropping one (its ``nn.Parameter``
statement, its weight loader, the ``+ self.<attr>`` that applies it), and
its entry in the checkpoint mappings of the model file (a dict literal entry
keyed ``"<tower attribute>.<attr>"``)."""

from __future__ import annotations

from functools import partial

import libcst as cst

from autoport_cst.transform.base import FileContext
from autoport_cst.transform.cst.vocabulary import (
    classes,
    method,
    nodes_of,
    self_assignment,
    self_attr,
    statements,
    string_value,
    walk,
)
from autoport_cst.transform.edit.tree import Edit, rewrite


def class_assigning(module: cst.Module, attr: str) -> cst.ClassDef | None:
    """The class whose ``__init__`` assigns ``self.<attr>``."""
    for cls in classes(module):
        init = method(cls, "__init__")
        if init is not None and any((self_assignment(s) or ("",))[0] == attr for s in statements(init)):
            return cls
    return None


def _is_loader_of(stmt: cst.CSTNode, attr: str) -> bool:
    calls = [c for c in nodes_of(stmt, cst.Call) if isinstance(c, cst.Call)]
    return any(
        isinstance(c.func, cst.Name)
        and c.func.value == "set_weight_loader"
        and self_attr(c.args[0].value) == attr
        for c in calls
        if c.args
    )


def drop_added_parameter(module: cst.Module, ctx: FileContext, cls: cst.ClassDef, attr: str) -> cst.Module:
    """Remove ``self.<attr>`` from ``cls``: its assignment and loader
    statements, and each ``<x> + self.<attr>`` (becomes ``<x>``); any other
    read is refused at its position."""
    edits: dict[int, Edit] = {}
    for stmt in _all_statements(cls):
        assigned = self_assignment(stmt)
        if (assigned and assigned[0] == attr) or _is_loader_of(stmt, attr):
            edits[id(stmt)] = lambda node: cst.RemoveFromParent()
    added = set()
    for node in walk(cls):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
            if self_attr(node.right) == attr:
                edits[id(node)] = _left_operand
                added.add(id(node.right))
    for node in walk(cls):
        if self_attr(node) == attr and id(node) not in added and not _inside_removed(node, cls, edits):
            raise ctx.refuse(f"self.{attr} is read here: only '<x> + self.{attr}' can drop it", node, module)
    return rewrite(module, edits)


def _left_operand(node: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(node, cst.BinaryOperation)
    return node.left


def _all_statements(cls: cst.ClassDef) -> list[cst.SimpleStatementLine]:
    return [n for n in walk(cls) if isinstance(n, cst.SimpleStatementLine)]


def _inside_removed(node: cst.CSTNode, cls: cst.ClassDef, edits: dict) -> bool:
    return any(id(node) in {id(n) for n in walk(s)} for s in _all_statements(cls) if id(s) in edits)


def mapping_entries_keyed(module: cst.Module, suffix: str) -> list[tuple[cst.Dict, cst.BaseDictElement]]:
    """Dict literal entries whose string key ends with ``.<suffix>``."""
    found = []
    for node in walk(module):
        if isinstance(node, cst.Dict):
            for element in node.elements:
                key = string_value(element.key) if isinstance(element, cst.DictElement) else None
                if key is not None and key.endswith(f".{suffix}"):
                    found.append((node, element))
    return found


def drop_mapping_entries(
    module: cst.Module, entries: list[tuple[cst.Dict, cst.BaseDictElement]]
) -> cst.Module:
    doomed = {id(element) for _, element in entries}

    def kept(node: cst.CSTNode, original: cst.Dict) -> cst.CSTNode:
        assert isinstance(node, cst.Dict)
        elements: list = []
        for element, before in zip(node.elements, original.elements, strict=True):
            if id(before) not in doomed:
                elements.append(element)
            elif elements:  # the one before takes the removed one's comma (and its line break)
                elements[-1] = elements[-1].with_changes(comma=element.comma)
        return node.with_changes(elements=elements)

    edits: dict[int, Edit] = {}
    for d, _ in entries:
        edits[id(d)] = partial(kept, original=d)
    return rewrite(module, edits)


def _reads(node: cst.CSTNode) -> set[str]:
    return {n.value for n in walk(node) if isinstance(n, cst.Name)}


def _targets(stmt: cst.CSTNode) -> set[str]:
    names: set[str] = set()
    for assign in nodes_of(stmt, cst.Assign):
        for target in assign.targets:  # type: ignore[attr-defined]
            names |= {n.value for n in walk(target.target) if isinstance(n, cst.Name)}
    return names


def forward_slice(func: cst.FunctionDef, seeds: set[int]) -> tuple[list[cst.CSTNode], set[str]]:
    """The top-level statements of ``func`` to remove with the statements
    ``seeds`` (ids): those reading a name they define, transitively. A
    statement that reassigns a name defined before (``h = h + p``) is removed
    with them; the names they defined are returned too."""
    doomed: list[cst.CSTNode] = []
    dead: set[str] = set()
    live = {p.name.value for p in func.params.params}
    for stmt in statements(func):
        if id(stmt) in seeds or (_reads(stmt) & dead):
            doomed.append(stmt)
            dead |= _targets(stmt) - live
        else:
            live |= _targets(stmt)
    return doomed, dead


def unused_parameters(func: cst.FunctionDef, kept: list[cst.CSTNode]) -> list[str]:
    """Parameters of ``func`` no statement of ``kept`` reads."""
    read: set[str] = set()
    for stmt in kept:
        read |= _reads(stmt)
    return [p.name.value for p in func.params.params if p.name.value not in read and p.name.value != "self"]


def without_parameters(func: cst.FunctionDef, names: list[str]) -> cst.FunctionDef:
    params = [p for p in func.params.params if p.name.value not in names]
    if params and params[-1] is not func.params.params[-1]:
        params[-1] = params[-1].with_changes(comma=func.params.params[-1].comma)
    return func.with_changes(params=func.params.with_changes(params=params))


def drop_unused_import(module: cst.Module, name: str) -> cst.Module:
    """Remove ``name`` from a ``from ... import`` when nothing else reads it."""
    uses = [n for n in walk(module) if isinstance(n, cst.Name) and n.value == name]
    imports = [
        n for n in walk(module) if isinstance(n, cst.ImportFrom) and not isinstance(n.names, cst.ImportStar)
    ]
    holders = [i for i in imports if any(a.evaluated_name == name for a in i.names)]  # type: ignore[union-attr]
    if len(holders) != 1 or len(uses) != 1:
        return module
    holder = holders[0]
    aliases = list(holder.names)  # type: ignore[arg-type]
    kept = [a for a in aliases if a.evaluated_name != name]
    if aliases[-1].evaluated_name == name and kept:
        kept[-1] = kept[-1].with_changes(comma=aliases[-1].comma)
    return rewrite(module, {id(holder): lambda node: node.with_changes(names=kept)})
