"""The checkpoint-key mapping of ``load_weights``: its ``mappings[<key>] =
<value>`` entries, found by the text of their key, and the parameter names a
module's classes define."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform.cst.vocabulary import dotted, nodes_of, simple_assign, string_text, walk

MAPPING_NAME = "mappings"


@dataclass(frozen=True)
class MappingEntry:
    statement: cst.SimpleStatementLine
    key_node: cst.BaseExpression
    key: str  # text of the key, f-string fields as {expr}
    value: cst.BaseExpression


def mapping_entries(node: cst.CSTNode | list[cst.CSTNode]) -> list[MappingEntry]:
    """Every ``mappings[key] = value`` statement under ``node`` (or among
    already walked ``nodes``)."""
    entries = []
    # ``type(...) is``: an isinstance check against a LibCST node class goes through its abstract base
    for stmt in node if isinstance(node, (list, tuple)) else nodes_of(node, cst.SimpleStatementLine):
        if type(stmt) is not cst.SimpleStatementLine:
            continue
        pair = simple_assign(stmt)
        if pair is None:
            continue
        target, value = pair
        if (
            isinstance(target, cst.Subscript)
            and isinstance(target.value, cst.Name)
            and target.value.value == MAPPING_NAME
            and len(target.slice) == 1
            and isinstance(target.slice[0].slice, cst.Index)
        ):
            key_node = target.slice[0].slice.value
            key = string_text(key_node)
            if key is not None:
                entries.append(MappingEntry(stmt, key_node, key, value))
    return entries


def find_entry(node: cst.CSTNode, predicate: Callable[[str], bool]) -> MappingEntry | None:
    for entry in mapping_entries(node):
        if predicate(entry.key):
            return entry
    return None


def entry_statement(
    entry: MappingEntry, key: cst.BaseExpression, value: cst.BaseExpression
) -> cst.SimpleStatementLine:
    """A new mapping statement shaped like ``entry`` with another key and value."""
    small = entry.statement.body[0]
    assert isinstance(small, (cst.Assign, cst.AnnAssign))  # as mapping_entries found it
    target = small.targets[0].target if isinstance(small, cst.Assign) else small.target
    assert isinstance(target, cst.Subscript)
    new_target = target.with_changes(slice=[target.slice[0].with_changes(slice=cst.Index(value=key))])
    new_small: cst.BaseSmallStatement
    if isinstance(small, cst.Assign):
        new_small = small.with_changes(
            targets=[small.targets[0].with_changes(target=new_target)], value=value
        )
    else:
        new_small = small.with_changes(target=new_target, value=value)
    return entry.statement.with_changes(body=[new_small], leading_lines=[])


# -- the parameters a file shows --------------------------------------------------------------

MODULE_LIST = ("nn.ModuleList", "torch.nn.ModuleList", "ModuleList")


def parameter_names(module: cst.Module, root: cst.ClassDef) -> list[str]:
    """Dotted names of the parameters under class ``root`` that the file
    shows: ``self.<p> = nn.Parameter(...)``, and ``set_weight_loader(self.<m>.<p>,
    ...)`` (a parameter of a library module), through the attributes built
    from the file's own classes (``{i}`` for the items of an ``nn.ModuleList``).
    Modules built otherwise (a class chosen at run time) are not followed."""
    from autoport_cst.transform.anatomy.classes import is_parameter, self_assignments
    from autoport_cst.transform.anatomy.loaders import find_loaders

    by_name = {c.name.value: c for c in module.body if isinstance(c, cst.ClassDef)}
    names: list[str] = []

    def built_class(value: cst.BaseExpression) -> cst.ClassDef | None:
        name = dotted(value.func) if isinstance(value, cst.Call) else None
        return by_name.get(name.rsplit(".", 1)[-1]) if name else None

    def visit(cls: cst.ClassDef, prefix: str, depth: int) -> None:
        if depth > 8:
            return
        init = next(
            (s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None
        )
        assigned = self_assignments(init) if init is not None else {}
        for attr, (_, value) in assigned.items():
            if is_parameter(value):
                names.append(prefix + attr)
            elif (child := built_class(value)) is not None:
                visit(child, f"{prefix}{attr}.", depth + 1)
            elif isinstance(value, cst.Call) and dotted(value.func) in MODULE_LIST:
                items = [
                    c for n in walk(value) if isinstance(n, cst.Call) and (c := built_class(n)) is not None
                ]
                if items:
                    visit(items[0], f"{prefix}{attr}.{{i}}.", depth + 1)
        for key in find_loaders(cls):
            if "." in key and prefix + key not in names:
                names.append(prefix + key)

    visit(root, "", 0)
    return names
