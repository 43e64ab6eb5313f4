"""Rename classes by scope analysis: definitions, package-relative imports and
every reference to those bindings, never a look-alike name in another scope or
a same-named import from another package."""

from __future__ import annotations

from typing import Iterator

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider

from autoport_cst.transform.cst_helpers import dotted


def rename_targets(wrapper: MetadataWrapper, table: dict[str, str]) -> set[int]:
    """ids of the Name nodes of ``wrapper.module`` to rename: definitions of
    classes in ``table``, package-relative imports of them, and every
    reference to those bindings."""
    scopes = wrapper.resolve(ScopeProvider)
    targets: set[int] = set()
    bindings: set[int] = set()
    for node in _definitions(wrapper.module):
        if isinstance(node, cst.ClassDef) and node.name.value in table:
            targets.add(id(node.name))
            bindings.add(id(node))
        elif (
            isinstance(node, cst.ImportFrom)
            and node.relative
            and not isinstance(node.names, cst.ImportStar)
        ):
            for alias in node.names:
                if dotted(alias.name) in table:
                    targets.add(id(alias.name))
                    if alias.asname is None:
                        bindings.add(id(node))
    for scope in {s for s in scopes.values() if s is not None}:
        for assignment in scope.assignments:
            if assignment.name in table and id(getattr(assignment, "node", None)) in bindings:
                for access in assignment.references:
                    if isinstance(access.node, cst.Name):
                        targets.add(id(access.node))
    return targets


def _definitions(module: cst.Module) -> Iterator[cst.CSTNode]:
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.ClassDef, cst.ImportFrom)):
            yield node
        if not isinstance(node, cst.BaseExpression):
            stack.extend(node.children)


class NameRenamer(cst.CSTTransformer):
    """Renames the Name nodes whose ids are in ``targets`` using ``table``."""

    def __init__(self, targets: set[int], table: dict[str, str]) -> None:
        self.targets = targets
        self.table = table

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        if id(original) in self.targets:
            return updated.with_changes(value=self.table[original.value])
        return updated


def rename_classes_in_module(module: cst.Module, table: dict[str, str]) -> cst.Module:
    """Identifiers only (no strings or comments)."""
    if not table:
        return module
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    targets = rename_targets(wrapper, table)
    if not targets:
        return module
    return wrapper.module.visit(NameRenamer(targets, table))
