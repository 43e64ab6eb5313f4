"""The engine's "exhaustive or refuse" check around one step.

Before a codemod runs, every site of the families it changes is recorded in
every Python file of the package (``StepCensus``); after it ran, each site
must have changed or been declared unaffected by the codemod. Otherwise the
port stops (a precondition error, exit 2) naming each site it left, with
its position in the reference file as the user has it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import libcst as cst

from autoport_cst.errors import Position, PreconditionError
from autoport_cst.transform.anatomy.census import FileCensus, SiteCache, take_census, unhandled_sites
from autoport_cst.transform.anatomy.sites import Site
from autoport_cst.transform.base import locate

CENSUS_ROLES = ("model", "module")


class CensusUnit(Protocol):
    """What the check needs of a file being transformed."""

    label: str
    role: str
    original: str
    module: cst.Module | None
    text: str | None  # the module's code, when it has been generated


@dataclass
class _Before:
    module: cst.Module
    known_text: str | None  # the module's code, if generated already (else on demand)
    census: FileCensus

    @property
    def text(self) -> str:
        """The file's text before the step (only a failure needs it)."""
        if self.known_text is None:
            self.known_text = self.module.code
        return self.known_text


def reference_position(
    label: str, original: str, text: str, line: int | None, column: int | None
) -> Position:
    """A position in ``text`` (the file after earlier steps) as a position
    in ``original`` (the reference file)."""
    from autoport_cst.transform.cst.positions import PositionMap  # positions are mapped for errors only

    if line is None:
        return Position(label)
    mapped = PositionMap(original, text).original_line(line)
    return Position(label, mapped.line, column if mapped.exact else None)


class StepCensus:
    """The sites of ``families`` in ``units`` before a step."""

    def __init__(self, units: list, families: tuple[str, ...], cache: SiteCache | None = None) -> None:
        self.families = families
        self.cache = cache or SiteCache()
        self.before: dict[int, tuple[CensusUnit, _Before]] = {}
        if not families:
            return
        for unit in units:
            if unit.module is None or unit.role not in CENSUS_ROLES:
                continue
            census = take_census(unit.module, unit.label, families, self.cache)
            if census.sites:
                self.before[id(unit)] = (unit, _Before(unit.module, unit.text, census))

    def unhandled(self, unaffected: dict[int, str]) -> list[tuple[Site, Position]]:
        left: list[tuple[Site, Position]] = []
        for unit, before in self.before.values():
            if unit.module is before.module:
                sites = [s for v in before.census.sites.values() for s in v if id(s.node) not in unaffected]
            else:
                assert unit.module is not None  # a unit with a census keeps a module
                after = take_census(unit.module, unit.label, self.families, self.cache)
                sites = unhandled_sites(before.census, after, set(unaffected))
            for site in sites:
                line, column = locate(before.module, site.node)
                left.append((site, reference_position(unit.label, unit.original, before.text, line, column)))
        return left

    def check(self, codemod: str, unaffected: dict[int, str]) -> None:
        """Raise a precondition error naming every site the step left."""
        left = self.unhandled(unaffected)
        if not left:
            return
        families = ", ".join(sorted({site.family for site, _ in left}))
        lines = [f"  {position}: {site.describe()}" for site, position in left]
        raise PreconditionError(
            f"{codemod} changes {families}, but left {len(left)} site(s) of it unchanged; "
            "every site must be edited (or declared unaffected by the codemod), else the port "
            "would compute different things on different paths:\n" + "\n".join(lines),
            left[0][1],
        )
