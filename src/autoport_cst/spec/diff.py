"""The diff of two architecture specs: exactly the leaf fields that differ."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from autoport_cst.spec.model import FEATURE, OPTIONAL, VALUE, ArchSpec
from autoport_cst.spec.typed_json import hints_of


@dataclass(frozen=True)
class FieldDiff:
    """One differing field. ``path`` is dotted (``attention.qkv_bias``)."""

    path: str
    role: str
    reference: Any
    target: Any

    @property
    def is_presence_change(self) -> bool:
        """For optional fields: one side has a value and the other has none."""
        return (self.reference is None) != (self.target is None)

    @property
    def needs_code_change(self) -> bool:
        """Whether code must change unless the reference reads this field from
        the config: features always, optional fields when presence changes,
        values never."""
        if self.role == FEATURE:
            return True
        if self.role == OPTIONAL:
            return self.is_presence_change
        return False


def leaf_fields(spec_type: type = ArchSpec, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """(dotted path, role, doc) of every leaf field, in declaration order."""
    for f in dataclasses.fields(spec_type):
        path = f"{prefix}{f.name}"
        role = f.metadata.get("role")
        if role is None:  # a section
            yield from leaf_fields(_section_type(f), f"{path}.")
            continue
        yield path, role, f.metadata.get("doc", "")
        inner = _optional_section(hints_of(spec_type)[f.name])
        if inner is not None:  # an optional section (moe): its fields too
            yield from leaf_fields(inner, f"{path}.")


def _section_type(f: dataclasses.Field) -> type:
    """The dataclass of a section field (its default factory)."""
    section = f.default_factory
    assert isinstance(section, type)
    return section


def _optional_section(annotation: Any) -> type | None:
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg
    return None


def get_field(spec: Any, path: str) -> Any:
    value = spec
    for part in path.split("."):
        if value is None:
            return None
        value = getattr(value, part)
    return value


def diff_specs(reference: ArchSpec, target: ArchSpec) -> list[FieldDiff]:
    """Fields whose values differ, in declaration order. A reference value of
    ``None`` for a ``value`` field means "whatever the config says" and never
    differs."""
    return list(_diff(reference, target, type(reference), ""))


def _diff(ref: Any, tgt: Any, cls: type, prefix: str) -> Iterator[FieldDiff]:
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        role = f.metadata.get("role")
        a, b = getattr(ref, f.name), getattr(tgt, f.name)
        if role is None:
            yield from _diff(a, b, _section_type(f), f"{path}.")
        elif dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
            # an optional section present on both sides (moe): compare inside
            yield from _diff(a, b, type(a), f"{path}.")
        elif role == VALUE and (a is None or b is None):
            continue
        elif a != b:
            yield FieldDiff(path, role, a, b)
