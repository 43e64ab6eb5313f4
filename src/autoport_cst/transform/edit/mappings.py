"""Edits of the checkpoint-key mapping of ``load_weights`` (its entries are
found by ``autoport_cst.transform.anatomy.mappings``): entries added after
and removed, and dotted key segments replaced in the strings of a key or a
value."""

from __future__ import annotations

import re

import libcst as cst

from autoport_cst.transform.anatomy.mappings import MappingEntry
from autoport_cst.transform.cst.vocabulary import (
    string_text,
)
from autoport_cst.transform.edit.tree import insert_after, remove_statements


def add_after(node: cst.CSTNode, entry: MappingEntry, new: list[cst.BaseStatement]) -> cst.CSTNode:
    return insert_after(node, entry.statement, new)


def remove_entries(node: cst.CSTNode, entries: list[MappingEntry]) -> cst.CSTNode:
    return remove_statements(node, [e.statement for e in entries])


# -- checkpoint keys ---------------------------------------------------------------


def _segment_pattern(old: str) -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z0-9_{])" + re.escape(old) + r"(?![A-Za-z0-9_}])")


def replace_segment(node: cst.BaseExpression, old: str, new: str) -> cst.BaseExpression | None:
    """A string literal (plain or f-string) with the dotted key segment(s)
    ``old`` replaced by ``new`` in its text parts; None when ``old`` does not
    occur as whole segments."""
    pattern = _segment_pattern(old)
    if isinstance(node, cst.SimpleString):
        text = string_text(node)
        if text is None or not pattern.search(text):
            return None
        body = node.value[len(node.prefix) + len(node.quote) : -len(node.quote)]
        return node.with_changes(value=f"{node.prefix}{node.quote}{pattern.sub(new, body)}{node.quote}")
    if isinstance(node, cst.FormattedString):
        changed = False
        parts = []
        for part in node.parts:
            if isinstance(part, cst.FormattedStringText) and pattern.search(part.value):
                part = part.with_changes(value=pattern.sub(new, part.value))
                changed = True
            parts.append(part)
        return node.with_changes(parts=parts) if changed else None
    if isinstance(node, cst.ConcatenatedString):
        left = replace_segment(node.left, old, new)
        right = replace_segment(node.right, old, new)
        if left is None and right is None:
            return None
        return node.with_changes(left=left or node.left, right=right or node.right)
    return None


def has_segment(text: str, old: str) -> bool:
    return bool(_segment_pattern(old).search(text))


def strings_of(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The string literals of a mapping value (a string, or a list/tuple of
    strings), possibly parenthesized."""
    if isinstance(value, (cst.List, cst.Tuple)):
        return [e.value for e in value.elements]
    return [value]


def map_value_strings(value: cst.BaseExpression, fn) -> cst.BaseExpression | None:
    """Apply ``fn`` (string node -> node or None for unchanged) to every string
    of a mapping value; None when nothing changed."""
    if isinstance(value, (cst.List, cst.Tuple)):
        changed = False
        elements = []
        for element in value.elements:
            new = fn(element.value)
            if new is not None:
                changed = True
                element = element.with_changes(value=new)
            elements.append(element)
        return value.with_changes(elements=elements) if changed else None
    return fn(value)


def mapping_entries_of_attr(module: cst.Module, attr: str):
    """Mapping entries whose key has the segment ``attr`` (a module attribute
    such as ``post_attention_layernorm``)."""
    from autoport_cst.transform.anatomy.mappings import mapping_entries

    return [e for e in mapping_entries(module) if has_segment(e.key, attr)]
