"""What a codemod realizes, declared: the spec fields it can change and, for
each, which changes (``REALIZES`` of a codemod)::

    REALIZES = Realizes({"attention.qkv_bias": to(True), "attention.o_bias": to(True)})

A plain tuple of field paths still means "any change of these fields". The
composer asks ``Codemod.realizes(diff)``, which reads this declaration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autoport_cst.spec import FieldDiff


def _same(value: Any, wanted: Any) -> bool:
    """True, False and None by identity (``1`` is not ``True``), other values by equality."""
    if wanted is None or isinstance(wanted, bool):
        return value is wanted
    return bool(value == wanted)


def _among(value: Any, values: tuple[Any, ...]) -> bool:
    return any(_same(value, wanted) for wanted in values)


@dataclass(frozen=True)
class Change:
    """Changes of one field: to a value among ``to`` (any when empty) and not
    among ``not_to``, from a reference value among ``reference`` (any when
    empty); ``count``: the target is an integer of at least 1."""

    to: tuple[Any, ...] = ()
    not_to: tuple[Any, ...] = ()
    reference: tuple[Any, ...] = ()
    count: bool = False

    def accepts(self, diff: FieldDiff) -> bool:
        target = diff.target
        if self.to and not _among(target, self.to):
            return False
        if _among(target, self.not_to):
            return False
        if self.reference and not _among(diff.reference, self.reference):
            return False
        return not self.count or (isinstance(target, int) and target > 0)

    def __str__(self) -> str:
        parts = []
        if self.reference:
            parts.append("from " + " or ".join(map(_shown, self.reference)))
        if self.to:
            parts.append("to " + " or ".join(map(_shown, self.to)))
        if self.not_to:
            parts.append("to anything but " + " or ".join(map(_shown, self.not_to)))
        if self.count:
            parts.append("to a count of at least 1")
        return " ".join(parts) or "any change"


def _shown(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


ANY = Change()


def to(*values: Any) -> Change:
    """Changes to one of ``values``."""
    return Change(to=values)


def not_to(*values: Any) -> Change:
    """Changes to anything but ``values``."""
    return Change(not_to=values)


def from_to(reference: Any, target: Any) -> Change:
    """The change from ``reference`` to ``target``."""
    return Change(to=(target,), reference=(reference,))


class Realizes(tuple[str, ...]):
    """The spec fields a codemod realizes (a tuple of dotted paths, in
    declaration order) and the changes of each it makes: one ``Change`` or
    several (any of them)."""

    changes: dict[str, tuple[Change, ...]]

    def __new__(cls, changes: Mapping[str, Change | tuple[Change, ...]]) -> Realizes:
        self = super().__new__(cls, changes)
        self.changes = {path: (c,) if isinstance(c, Change) else tuple(c) for path, c in changes.items()}
        return self

    def __getnewargs__(self) -> tuple[Any, ...]:  # copy and pickle
        return (self.changes,)

    def accepts(self, diff: FieldDiff) -> bool:
        return any(change.accepts(diff) for change in self.changes.get(diff.path, ()))

    def described(self) -> dict[str, str]:
        """Field path -> the changes it realizes, in words."""
        return {path: "; ".join(map(str, changes)) for path, changes in self.changes.items()}


def realizes(declared: tuple[str, ...], diff: FieldDiff) -> bool:
    """Whether a ``REALIZES`` declaration accepts ``diff``."""
    if isinstance(declared, Realizes):
        return declared.accepts(diff)
    return diff.path in declared
