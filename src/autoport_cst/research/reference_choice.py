"""Choosing the reference model: the one whose architecture diff to the
target is smallest among those the codemod library can realize.

Each candidate is measured with the composer (the same one ``apply`` runs):
the fields that need a codemod, the fields the reference's code reads from
the config, and the fields nothing realizes. A candidate is realizable when
that last list is empty. The choice is the realizable candidate with the
fewest fields needing a codemod (then the fewest differing fields, then the
name); when none is realizable, the closest one (fewest blocking fields) is
reported with what blocks every candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoport_cst.errors import AutoportError, UnrealizableDiffError
from autoport_cst.spec import ArchSpec, FieldDiff, diff_specs


@dataclass(frozen=True)
class FieldPlan:
    """How one differing field would be realized from this reference."""

    path: str
    reference: object
    target: object
    how: str  # "config" | "codemod <id>" | "blocked"


@dataclass(frozen=True)
class Candidate:
    name: str
    realizable: bool
    fields: tuple[FieldPlan, ...]
    steps: tuple[str, ...]
    blocking: tuple[str, ...]
    error: str | None = None

    @property
    def code_changes(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.fields if f.how.startswith("codemod"))

    @property
    def by_config(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.fields if f.how == "config")


@dataclass(frozen=True)
class ReferenceChoice:
    chosen: str | None
    realizable: bool
    candidates: tuple[Candidate, ...]
    reason: str

    def realizable_in_order(self) -> list[Candidate]:
        """The realizable candidates, closest first (the chosen one first)."""
        return _closest_first(c for c in self.candidates if c.error is None and c.realizable)

    def candidate(self, name: str) -> Candidate | None:
        for c in self.candidates:
            if c.name == name:
                return c
        return None


def _closest_first(candidates) -> list[Candidate]:
    """Fewest fields needing a codemod, then the smallest diff, then by name."""
    return sorted(candidates, key=lambda c: (len(c.code_changes), len(c.fields), c.name))


def evaluate_reference(ref_name: str, spec: ArchSpec, name: str, architecture: str) -> Candidate:
    """Compose the port of ``spec`` from reference ``ref_name``."""
    from autoport_cst.apply.composer import compose
    from autoport_cst.apply.reference import load_reference
    from autoport_cst.plan import PLAN_VERSION, Plan
    from autoport_cst.transform.library import library

    try:
        reference = load_reference(ref_name)
    except AutoportError as exc:
        return Candidate(ref_name, False, (), (), (), error=str(exc).splitlines()[0])
    mismatch = vision_mismatch(reference.spec, spec)
    if mismatch is not None:
        return Candidate(reference.name, False, (), (), ("vision",), error=mismatch)
    plan = Plan(
        version=PLAN_VERSION, name=name, architecture=architecture, reference=reference.name, spec=spec
    )
    diffs = diff_specs(reference.spec, spec)
    codemods = library()

    def how(diff: FieldDiff, blocked: set[str]) -> str:
        if diff.path in blocked:
            return "blocked"
        if not diff.needs_code_change or reference.supports_by_config(diff.path, diff.target):
            return "config"
        for cls in codemods.values():
            if cls.realizes(diff):
                return f"codemod {cls.ID}"
        return "blocked"

    try:
        composition = compose(plan, reference)
    except UnrealizableDiffError as exc:
        blocked = set(exc.fields)
        fields = tuple(FieldPlan(d.path, d.reference, d.target, how(d, blocked)) for d in diffs)
        return Candidate(reference.name, False, fields, (), tuple(exc.fields))
    except AutoportError as exc:
        return Candidate(reference.name, False, (), (), (), error=str(exc).splitlines()[0])
    by_step = {path: step.id for step in composition.steps for path in step.realizes}
    fields = tuple(
        FieldPlan(
            d.path, d.reference, d.target, f"codemod {by_step[d.path]}" if d.path in by_step else "config"
        )
        for d in composition.diffs
    )
    return Candidate(reference.name, True, fields, tuple(s.id for s in composition.steps), ())


def vision_mismatch(reference: ArchSpec, target: ArchSpec) -> str | None:
    """A vision-language reference never ports a text-only model, nor a text
    reference a vision-language one: the reason, or None when both agree."""
    if (reference.vision is None) == (target.vision is None):
        return None
    if target.vision is None:
        return "a vision-language reference (a vision tower and M-RoPE) for a text-only model"
    return "a text-only reference: the model has a vision tower no text reference realizes"


def choose_reference(
    spec: ArchSpec, name: str, architecture: str, refs: list[str] | None = None, found: Any = None
) -> ReferenceChoice:
    """Evaluate ``refs`` (default: every built-in reference) and pick one;
    ``found`` (the ``Research`` of ``spec``) gives a refusal its evidence."""
    if refs is None:
        from autoport_cst.apply.reference import builtin_names

        refs = builtin_names()
    candidates = tuple(evaluate_reference(ref, spec, name, architecture) for ref in sorted(refs))
    usable = [c for c in candidates if c.error is None]
    realizable = [c for c in usable if c.realizable]
    if realizable:
        best = _closest_first(realizable)[0]
        changes = ", ".join(best.code_changes) or "none"
        others = [c.name for c in realizable if c is not best]
        reason = (
            f"{best.name}: realizable with {len(best.code_changes)} field(s) needing a codemod ({changes}) "
            f"and {len(best.by_config)} read from the config"
            + (f"; also realizable: {', '.join(others)}" if others else "")
        )
        return ReferenceChoice(best.name, True, candidates, reason)
    if usable:
        from autoport_cst.research.refusal import refusal_text

        best = min(usable, key=lambda c: (len(c.blocking), len(c.fields), c.name))
        unrealized, _ = refusal_text(spec, ReferenceChoice(best.name, False, candidates, ""), found)
        reason = (
            f"{unrealized}; closest: {best.name} (blocked by {', '.join(best.blocking)}). "
            "apply will refuse this plan until codemods for these features exist "
            "or the plan gives explicit steps"
        )
        return ReferenceChoice(best.name, False, candidates, reason)
    errors = "; ".join(f"{c.name}: {c.error}" for c in candidates) or "no reference available"
    return ReferenceChoice(None, False, candidates, f"no usable reference ({errors})")
