"""Compose codemod steps from the architecture diff between a reference and a
plan's target spec.

Rules, in order:

1. Explicit steps in the plan are validated (known codemod, valid parameters)
   and realize the diff fields their codemod declares.
2. Every other differing field is realized by the config when it is a plain
   value (sizes, eps, theta), or when the reference reads that feature from
   the config and supports the target value (``config_driven`` in its
   manifest); otherwise by the codemod that declares it (when two do, the
   first by ID).
3. A field nothing realizes makes the whole composition fail, listing every
   such field: no partial port.
4. ``rename-classes`` runs when the class prefix changes; the fixes of lint
   rules marked ``REPAIR`` run when the reference's config breaks them
   (origin ``repair``).
5. Steps are ordered by their ``AFTER`` constraints; ties keep a fixed order
   (rename first, then codemod ID), so the same plan always gives the same
   steps.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from autoport_cst.apply.reference import ParsedTexts, Reference
from autoport_cst.errors import (
    AutoportError,
    InputError,
    MultiInputError,
    Position,
    UnrealizableDiffError,
    did_you_mean,
)
from autoport_cst.plan import Plan
from autoport_cst.spec import FieldDiff, diff_specs, to_json
from autoport_cst.transform import Codemod, PortContext
from autoport_cst.transform.library import codemod_ids, get_codemod, realizing

RENAME = "rename-classes"


@dataclass(frozen=True)
class Step:
    codemod: type[Codemod]
    params: Any
    origin: str  # "plan" (explicit), "diff" (derived from the diff), "identity" (prefix), "repair"
    realizes: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return self.codemod.ID

    def params_json(self) -> dict[str, Any]:
        return to_json(self.params)


@dataclass(frozen=True)
class Composition:
    steps: tuple[Step, ...]
    diffs: tuple[FieldDiff, ...]
    by_config: tuple[FieldDiff, ...]
    unrealizable: tuple[FieldDiff, ...] = field(default=())


def port_context(plan: Plan, reference: Reference) -> PortContext:
    return PortContext(
        model_name=plan.name,
        class_prefix=plan.prefix,
        architecture=plan.architecture,
        reference_prefix=reference.class_prefix,
        reference_name=reference.name,
    )


def compose(
    plan: Plan, reference: Reference, plan_source: str = "<plan>", parsed: ParsedTexts | None = None
) -> Composition:
    """The steps that port ``reference`` to ``plan`` (``parsed``: the texts the
    caller parses too, parsed once)."""
    port = port_context(plan, reference)
    diffs = diff_specs(reference.spec, plan.spec)

    explicit: list[Step] = []
    errors: list[AutoportError] = []
    for index, step in enumerate(plan.steps):
        path = f"$.steps[{index}]"
        if step.codemod not in codemod_ids():
            known = ", ".join(codemod_ids())
            errors.append(
                InputError(
                    f"unknown codemod {step.codemod!r}{did_you_mean(step.codemod, codemod_ids())}; "
                    f"known codemods: {known}",
                    Position(plan_source, json_path=f"{path}.codemod"),
                )
            )
            continue
        cls = get_codemod(step.codemod)
        try:
            params = cls.parse_params(step.params, f"{path}.params", plan_source)
        except MultiInputError as exc:
            errors += exc.errors
            continue
        realized = tuple(d.path for d in diffs if cls.realizes(d))
        explicit.append(Step(cls, params, "plan", realized))
    if errors:
        raise MultiInputError(f"{plan_source}: invalid steps", errors)

    covered = {path for step in explicit for path in step.realizes}
    by_config: list[FieldDiff] = []
    unrealizable: list[FieldDiff] = []
    derived: dict[str, list[FieldDiff]] = {}
    for diff in diffs:
        if diff.path in covered:
            continue
        if not diff.needs_code_change or reference.supports_by_config(diff.path, diff.target):
            by_config.append(diff)
            continue
        candidates = [cls for cls in realizing(diff.path) if cls.realizes(diff)]
        if not candidates:
            unrealizable.append(diff)
            continue
        derived.setdefault(candidates[0].ID, []).append(diff)

    if unrealizable:
        lines = [
            f"  {d.path}: reference {reference.name} has {_show(d.reference)}, target has {_show(d.target)}"
            for d in unrealizable
        ]
        raise UnrealizableDiffError(
            f"no codemod realizes {len(unrealizable)} field(s) of the architecture diff "
            f"between reference {reference.name!r} and plan {plan.name!r}:\n" + "\n".join(lines),
            [d.path for d in unrealizable],
        )

    steps = list(explicit)
    explicit_ids = {s.id for s in explicit}
    for codemod_id, field_diffs in derived.items():
        cls = get_codemod(codemod_id)
        params = cls.params_for(field_diffs, plan.spec, port)
        steps.append(Step(cls, params, "diff", tuple(d.path for d in field_diffs)))
    if plan.prefix != reference.class_prefix and RENAME not in explicit_ids:
        cls = get_codemod(RENAME)
        steps.append(Step(cls, cls.params_for([], plan.spec, port), "identity"))
    steps += [
        Step(get_codemod(c), get_codemod(c).Params(), "repair")
        for c in repairs(reference, parsed)
        if c not in explicit_ids
    ]

    return Composition(tuple(order_steps(steps)), tuple(diffs), tuple(by_config))


def repairs(reference: Reference, parsed: ParsedTexts | None = None) -> list[str]:
    """Codemods that repair latent bugs of the reference: the fixes of the
    lint rules marked ``REPAIR`` that its files break (a config field read
    where transformers 5 no longer writes it, a default that hides a
    derivation, a segmented kernel with no FP8 guard). Harmless for the reference's
    own model, they make ports to other models read their configs right and
    pass the hardware rules their reference breaks."""
    from autoport_cst.lint import lint_source
    from autoport_cst.lint.rules import registry

    fixes = {code: rule.FIX for code, rule in registry().items() if rule.REPAIR and rule.FIX}
    found: list[str] = []
    for rel, text in sorted(reference.files.items()):
        if not rel.endswith(".py"):
            continue
        module = None
        if parsed is not None:
            try:
                module = parsed.module(text)
            except Exception:
                continue  # linting it finds only that it does not parse, which nothing repairs
        for diagnostic in lint_source(text, rel, select=list(fixes), module=module):
            fix = fixes.get(diagnostic.code)
            if fix is not None and fix not in found:
                found.append(fix)
    return found


def order_steps(steps: list[Step]) -> list[Step]:
    """Topological order by AFTER constraints; ties: the repairs first (they
    mend the reference as it is, under its own class names, which the repair
    of a config alias looks up in transformers), then rename, then by
    codemod ID, then by position in the plan."""

    def priority(index: int) -> tuple:
        step = steps[index]
        rank = 0 if step.codemod.PURPOSE == "repair" else 1 if step.id == RENAME else 2
        return (rank, step.id, index)

    ids = {s.id for s in steps}
    indegree = [0] * len(steps)
    successors: dict[int, list[int]] = {i: [] for i in range(len(steps))}
    for i, step in enumerate(steps):
        for j, other in enumerate(steps):
            if i != j and other.id in step.codemod.AFTER and other.id in ids:
                successors[j].append(i)
                indegree[i] += 1
    ready = [priority(i) for i in range(len(steps)) if indegree[i] == 0]
    heapq.heapify(ready)
    ordered = []
    while ready:
        *_, index = heapq.heappop(ready)
        ordered.append(steps[index])
        for successor in successors[index]:
            indegree[successor] -= 1
            if indegree[successor] == 0:
                heapq.heappush(ready, priority(successor))
    if len(ordered) != len(steps):
        stuck = sorted({s.id for i, s in enumerate(steps) if indegree[i] > 0})
        raise InputError(f"codemod ordering constraints form a cycle among: {', '.join(stuck)}")
    return ordered


def _show(value: Any) -> str:
    if value is None:
        return "none"
    data = to_json(value)
    if isinstance(data, dict):
        return "{...}"
    return repr(data)
