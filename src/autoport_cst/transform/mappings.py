"""The checkpoint-key mapping of ``load_weights``: ``mappings[<key>] = <value>``
statements, where a key is a parameter name (often an f-string such as
``f"{prefix}.self_attn.qkv_proj_weight"``) and a value is a checkpoint key or a
list of keys. Codemods find entries by the text of their key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import libcst as cst

from autoport_cst.transform.cst_helpers import (
    insert_after,
    remove_statements,
    simple_assign,
    string_text,
    walk,
)

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
    for stmt in walk(node) if isinstance(node, cst.CSTNode) else node:
        if not isinstance(stmt, cst.SimpleStatementLine):
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
                entries.append(MappingEntry(stmt, key_node, key, value))  # type: ignore[arg-type]
    return entries


def find_entry(node: cst.CSTNode, predicate: Callable[[str], bool]) -> MappingEntry | None:
    for entry in mapping_entries(node):
        if predicate(entry.key):
            return entry
    return None


def entry_statement(entry: MappingEntry, key: cst.BaseExpression, value: cst.BaseExpression) -> cst.SimpleStatementLine:
    """A new mapping statement shaped like ``entry`` with another key and value."""
    small = entry.statement.body[0]
    target = small.targets[0].target if isinstance(small, cst.Assign) else small.target  # type: ignore[union-attr]
    new_target = target.with_changes(
        slice=[target.slice[0].with_changes(slice=cst.Index(value=key))]  # type: ignore[union-attr]
    )
    if isinstance(small, cst.Assign):
        new_small = small.with_changes(targets=[small.targets[0].with_changes(target=new_target)], value=value)
    else:
        new_small = small.with_changes(target=new_target, value=value)
    return entry.statement.with_changes(body=[new_small], leading_lines=[])


def add_after(node: cst.CSTNode, entry: MappingEntry, new: list[cst.BaseStatement]) -> cst.CSTNode:
    return insert_after(node, entry.statement, new)


def remove_entries(node: cst.CSTNode, entries: list[MappingEntry]) -> cst.CSTNode:
    return remove_statements(node, [e.statement for e in entries])
