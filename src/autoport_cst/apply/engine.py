"""The apply engine: run a composition of codemods over a reference package
and produce every file of the port, in memory. Nothing here writes to disk
(see ``writer.py``); the outcome is data (:class:`PortResult`).

Output layout, relative to the output directory::

    vllm_neuron/model/<name>/...              every file of the reference package, transformed
    vllm_neuron/model/<name>/reference.json   the port's manifest (spec, provenance)
    vllm_neuron/model/registry.py             registry with the port's entry
    <companion templates>                     example script
    test/vllm_neuron/model/<name>/test_<name>_logits.py   logit test (port_test.py)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from autoport_cst import __version__
from autoport_cst.apply.checkpoint_keys import check_checkpoint_keys
from autoport_cst.apply.composer import Composition, Step, compose, port_context
from autoport_cst.apply.exhaustive import StepCensus, reference_position
from autoport_cst.apply.port_test import PORT_TEST_ROOT, port_test_path, port_test_source
from autoport_cst.apply.reference import (
    MANIFEST,
    Manifest,
    ParsedTexts,
    Provenance,
    Reference,
)
from autoport_cst.apply.repair_check import findings_left
from autoport_cst.collector import collector_paused
from autoport_cst.errors import AutoportError, InputError, Position, PreconditionError
from autoport_cst.plan import Plan, plan_to_json
from autoport_cst.spec import to_json
from autoport_cst.transform import FileContext, Note, PortContext
from autoport_cst.transform.anatomy.census import SiteCache
from autoport_cst.transform.base import defined_classes
from autoport_cst.transform.cst.printed import module_code
from autoport_cst.transform.cst.roles import file_role
from autoport_cst.transform.library import get_codemod

MODEL_ROOT = "vllm_neuron/model"
REGISTRY = f"{MODEL_ROOT}/registry.py"
PORT_SECTION_BEGIN = "<!-- autoport-cst: port notes (generated) -->"
PORT_SECTION_END = "<!-- autoport-cst: end of port notes -->"


@dataclass(frozen=True)
class StepResult:
    """One step as run: which files it changed and what it noted."""

    codemod: str
    params: dict
    origin: str
    realizes: tuple[str, ...]
    changed: tuple[str, ...]
    notes: tuple[Note, ...] = ()
    # config_driven features the step narrowed: feature -> the values the port keeps
    narrowed: tuple[tuple[str, tuple], ...] = ()


@dataclass
class PortResult:
    """Everything ``apply`` would write, or why it cannot."""

    plan: Plan
    reference: Reference
    composition: Composition | None = None
    steps: list[StepResult] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # output-relative path -> content
    sources: dict[str, str] = field(default_factory=dict)  # output path -> reference text (for diffs)
    warnings: list = field(default_factory=list)  # lint warnings on the port (Diagnostic)
    failure: AutoportError | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def package_dir(self) -> str:
        return f"{MODEL_ROOT}/{self.plan.name}"


@dataclass
class _Unit:
    """One file being transformed."""

    out_path: str
    rel: str  # path inside the package (or companion name) for messages
    role: str
    text: str | None
    module: cst.Module | None = None
    original: str = ""
    label: str = ""  # how notes and errors name the file (reference-relative)
    parsed: cst.Module | None = None  # the module parsed from ``original`` (linted when the port errs)

    def __post_init__(self) -> None:
        self.original = self.text if self.text is not None else ""
        self.label = self.label or self.rel

    def current(self) -> str:
        """The file's current text (module code is generated once per change)."""
        if self.text is None:
            assert self.module is not None  # the text is dropped only for a changed module
            self.text = module_code(self.module)
        return self.text


def build_port(
    plan: Plan,
    reference: Reference,
    existing_registry: str | None = None,
    plan_source: str = "<plan>",
    replace_registry_entry: bool = False,
) -> PortResult:
    """Compose and run the codemods; return the files of the port. Never raises
    for bad input or failed preconditions: those become ``result.failure``."""
    with collector_paused():
        return _build_port(plan, reference, existing_registry, plan_source, replace_registry_entry)


def _build_port(
    plan: Plan,
    reference: Reference,
    existing_registry: str | None,
    plan_source: str,
    replace_registry_entry: bool,
) -> PortResult:
    result = PortResult(plan, reference)
    try:
        parsed = ParsedTexts()
        result.composition = compose(plan, reference, plan_source, parsed)
        port = port_context(plan, reference)
        units = _load_units(plan, reference, existing_registry, parsed)
        sites = SiteCache()
        for step in result.composition.steps:
            result.steps.append(_run_step(step, units, port, sites=sites))
        result.steps += _identity_steps(plan, reference, units, port, replace_registry_entry)
        _finish(plan, reference, result, units, plan_source)
        check_checkpoint_keys(plan.checkpoint_keys, result.files, plan.spec.embedding.tied)  # before writing
    except AutoportError as error:
        result.failure = error
        result.files = {}
    return result


def _load_units(
    plan: Plan, reference: Reference, existing_registry: str | None, parsed: ParsedTexts
) -> list[_Unit]:
    units = []
    package = f"{MODEL_ROOT}/{plan.name}"
    for rel, text in reference.files.items():
        units.append(_Unit(f"{package}/{rel}", rel, file_role(rel), text, label=f"{reference.name}/{rel}"))
    for name, text in reference.companions.items():
        out = reference.manifest.companions[name].format(name=plan.name)
        if out.startswith(PORT_TEST_ROOT + "/"):
            continue  # the port's logit test is port_test's (checks what the port was validated on)
        units.append(
            _Unit(out, f"companions/{name}", "companion", text, label=f"{reference.name}/companions/{name}")
        )
    if existing_registry is None:
        from autoport_cst.reference_models import ROOT

        existing_registry = (ROOT / "registry_base.py").read_text(encoding="utf-8")
    units.append(_Unit(REGISTRY, "registry.py", "registry", existing_registry))
    for unit in units:
        if unit.out_path.endswith(".py"):
            try:
                unit.module = unit.parsed = parsed.module(unit.current())
            except cst.ParserSyntaxError as exc:
                where = reference.directory / unit.rel if unit.role != "registry" else Path(REGISTRY)
                raise InputError(
                    f"cannot parse: {exc.message}", Position(str(where), exc.raw_line, exc.raw_column + 1)
                ) from None
    return units


def _package_classes(units: list[_Unit]) -> frozenset[str]:
    names: set[str] = set()
    for unit in units:
        if unit.module is not None and unit.role not in ("registry", "companion"):
            names.update(defined_classes(unit.module))
    return frozenset(names)


def _run_step(
    step: Step,
    units: list[_Unit],
    port: PortContext,
    label: str | None = None,
    sites: SiteCache | None = None,
) -> StepResult:
    codemod = step.codemod(step.params)
    port.package_classes = _package_classes(units)
    changed = []
    notes: list[Note] = []
    targets = [u for u in units if codemod.applies_to(u.role)]
    if not targets:
        raise InputError(f"{step.id}: the reference has no file of role {'/'.join(codemod.FILES)}")
    census = StepCensus(units, codemod.touches(), sites)
    unaffected: dict[int, str] = {}
    narrowed: dict[str, tuple] = {}
    for unit in targets:
        ctx = FileContext(path=unit.label, role=unit.role, port=port, codemod=step.id)
        if unit.module is not None:
            before = unit.module
            try:
                after = codemod.transform_module(before, ctx)
            except PreconditionError as error:
                # which step, which spec fields it was to realize, and where in the reference
                error.step, error.realizes = step.id, tuple(step.realizes)
                _to_reference_position(error, unit)
                raise
            unaffected.update(ctx.unaffected_sites)
            for feature, values in ctx.narrowed.items():  # files narrowing one feature: what all keep
                narrowed[feature] = tuple(v for v in values if v in narrowed.get(feature, values))
            if after is not before:
                if _code_changed(unit, after):
                    changed.append(unit.out_path)
        else:
            new_text = codemod.transform_text(unit.text, ctx)
            if new_text != unit.text:
                unit.text = new_text
                changed.append(unit.out_path)
        notes += ctx.notes
    try:
        census.check(step.id, unaffected)
    except PreconditionError as error:
        error.step, error.realizes = step.id, tuple(step.realizes)
        raise
    if step.origin == "repair":
        _check_repaired(step, targets)
    return StepResult(
        label or step.id,
        step.params_json(),
        step.origin,
        step.realizes,
        tuple(changed),
        tuple(notes),
        tuple(sorted(narrowed.items())),
    )


def _check_repaired(step: Step, targets: list[_Unit]) -> None:
    """A repair step's error when a finding it was chosen for is left (``repair_check``)."""
    files = [(u.label, u.current(), u.module) for u in targets if u.module is not None]
    error = findings_left(step.id, files)
    if error is None:
        return
    error.step = step.id
    owner = next(u for u in targets if u.label == error.position.path)  # type: ignore[union-attr]
    _to_reference_position(error, owner)
    raise error


def _code_changed(unit: _Unit, after: cst.Module) -> bool:
    """Make ``after`` the unit's module; whether its code differs from the
    module it replaces. The code is joined from the code of the top-level
    statements, each printed once (a step keeps what it does not edit)."""
    previous = unit.current()
    unit.module, unit.text = after, module_code(after)
    return unit.text != previous


def _to_reference_position(error: PreconditionError, unit: _Unit) -> None:
    """A codemod positions its errors in the text it was given; the user has
    the reference file."""
    position = error.position
    if position is None or position.path != unit.label or position.line is None:
        return
    error.position = reference_position(
        unit.label, unit.original, unit.current(), position.line, position.column
    )


def _identity_steps(plan, reference, units, port, replace: bool) -> list[StepResult]:
    """Steps every port gets: its package name in absolute imports of its own
    modules, model identity in the companions, and the registry entry."""
    results = []
    own_package = f"vllm_neuron.model.{reference.name}"
    if reference.name != plan.name and any(own_package in u.original for u in units if u.module is not None):
        cls = get_codemod("package-imports")
        params = cls.parse_params({"old_package": reference.name, "new_package": plan.name})
        results.append(_run_step(Step(cls, params, "identity"), units, port))
    if reference.companions:
        cls = get_codemod("set-constants")
        params = cls.parse_params({"values": {"MODEL_NAME": plan.name, "HF_ARCHITECTURE": plan.architecture}})
        results.append(_run_step(Step(cls, params, "identity"), units, port))
    cls = get_codemod("register-model")
    params = cls.parse_params(
        {
            "package": plan.name,
            "class_name": plan.prefix + _registry_suffix(reference),
            "architecture": plan.architecture,
            "replace": replace,
        }
    )
    results.append(_run_step(Step(cls, params, "identity"), units, port))
    return results


def _registry_suffix(reference: Reference) -> str:
    """The registry class's name after the class prefix: ForCausalLM, or the
    reference's own (qwen3_vl: ForConditionalGeneration)."""
    architecture, prefix = reference.manifest.architecture, reference.class_prefix
    return architecture[len(prefix) :] if architecture.startswith(prefix) else "ForCausalLM"


def plan_digest(plan: Plan) -> str:
    canonical = json.dumps(plan_to_json(plan), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _finish(plan: Plan, reference: Reference, result: PortResult, units: list[_Unit], source: str) -> None:
    package = f"{MODEL_ROOT}/{plan.name}"
    step_ids = tuple(s.codemod for s in result.steps)
    modules: dict[str, tuple[cst.Module | None, cst.Module | None]] = {}
    for unit in units:
        text = unit.current()
        if unit.role == "docs":
            text = _port_notes(text, plan, reference, result)
        elif unit.out_path.endswith(".py") and unit.out_path.startswith(package + "/"):
            if unit.module is not None:
                line = _banner_line(reference.name, plan.name)
                modules[unit.out_path] = (_bannered_module(unit.module, text, line), unit.parsed)
            text = _banner(text, reference.name, plan.name)
        result.files[unit.out_path] = text
        result.sources[unit.out_path] = unit.original
    manifest = Manifest(
        format=reference.manifest.format,
        name=plan.name,
        class_prefix=plan.prefix,
        architecture=plan.architecture,
        spec=plan.spec,
        summary=plan.description or f"Ported from the {reference.name} reference by autoport-cst.",
        config_driven=_narrowed(reference.manifest.config_driven, result.steps),
        companions={},
        provenance=Provenance(
            reference=reference.name,
            reference_sha256=reference.sha256,
            plan_sha256=plan_digest(plan),
            steps=step_ids,
            tool_version=__version__,
        ),
    )
    result.files[f"{package}/{MANIFEST}"] = json.dumps(to_json(manifest), indent=2) + "\n"
    result.files[port_test_path(plan.name)] = port_test_source(plan.name, plan.architecture)
    for path, text in result.files.items():
        if path.endswith(".py"):
            try:
                compile(text, path, "exec")
            except SyntaxError as exc:
                raise InputError(
                    f"internal error: the port does not compile: {exc.msg}",
                    Position(path, exc.lineno, exc.offset),
                ) from None
    _check_hardware_rules(result, package, modules)


def _narrowed(config_driven: dict, steps: list[StepResult]) -> dict:
    """The reference's ``config_driven`` with the values the steps narrowed
    each feature to (``FileContext.narrow``)."""
    out = dict(config_driven)
    for step in steps:
        for feature, values in step.narrowed:
            declared = out.get(feature)
            if isinstance(declared, list):
                out[feature] = [v for v in declared if v in values]
    return out


def _check_hardware_rules(
    result: PortResult,
    package: str,
    modules: dict[str, tuple[cst.Module | None, cst.Module | None]] | None = None,
) -> None:
    """The port's package must pass the hardware lint rules: errors the port
    introduces stop it (nothing is written); errors it inherits from the
    reference (no more of a rule in a file than the reference file has) and
    warnings are kept for the summary. The tool must not make a reference
    worse; what the reference already does is its owner's call.

    ``modules`` maps a file of the port to its module as the engine left it
    and the module parsed from its reference file, so nothing is parsed
    again; the reference file is linted only when the port's file has errors."""
    errors = []
    for path, text in sorted(result.files.items()):
        if not (path.startswith(package + "/") and path.endswith(".py")):
            continue
        port_module, reference_module = (modules or {}).get(path, (None, None))
        found = _lint(text, path, port_module)
        counts = _error_counts(found)
        inherited = (
            _error_counts(_lint(result.sources.get(path) or "", path, reference_module)) if counts else {}
        )
        for diagnostic in found:
            if diagnostic.severity != "error":
                result.warnings.append(diagnostic)
            elif counts[diagnostic.code] <= inherited.get(diagnostic.code, 0):
                result.warnings.append(
                    dataclasses.replace(diagnostic, note="inherited from the reference, not made by the port")
                )
            else:
                errors.append(diagnostic)
    if errors:
        lines = "\n".join(f"  {d.path}:{d.line}:{d.column}: {d.code} {d.message}" for d in errors)
        raise InputError(
            f"the port breaks {len(errors)} hardware rule(s); add the codemod that fixes "
            f"them to the plan's steps, or fix the reference:\n{lines}",
            Position(errors[0].path, errors[0].line, errors[0].column),
        )


def _lint(text: str, path: str, module: cst.Module | None) -> list:
    """The diagnostics of one file: of its module when the caller has it (its
    code is ``text``), else of ``text`` parsed."""
    from autoport_cst.lint import lint_source

    return lint_source(text, path, module=module)


def _error_counts(diagnostics) -> Counter:
    return Counter(d.code for d in diagnostics if d.severity == "error")


SPDX = "# SPDX-License-Identifier"


def _banner_line(reference: str, name: str) -> str:
    return (
        f"# Ported to {name} by autoport-cst from the {reference} reference; "
        f"steps and provenance are in reference.json.\n"
    )


def _banner(text: str, reference: str, name: str) -> str:
    line = _banner_line(reference, name)
    if text.startswith(line):
        return text
    if text.startswith(SPDX):
        first, _, rest = text.partition("\n")
        return f"{first}\n{line}{rest}"
    return line + text


def _bannered_module(module: cst.Module, text: str, line: str) -> cst.Module | None:
    """``module`` (whose code is ``text``) with the banner ``line`` where
    ``_banner`` writes it, laid out as LibCST's parser lays out a comment line
    at the top of a file: a line of the module's header. None when the module
    is not laid out so that this holds (its first line not a header line)."""
    if text.startswith(line):
        return module
    if not module.body or module.body[0].leading_lines:
        return None  # the parser would put the lines above the first statement in the header
    if not module.has_trailing_newline or module.default_newline != "\n":
        return None
    banner = cst.EmptyLine(comment=cst.Comment(line.rstrip("\n")))
    if not text.startswith(SPDX):
        return module.with_changes(header=[banner, *module.header])
    first = text.partition("\n")[0]
    if not module.header or module.code_for_node(module.header[0]) != first + "\n":
        return None
    return module.with_changes(header=[module.header[0], banner, *module.header[1:]])


def _port_notes(text: str, plan: Plan, reference: Reference, result: PortResult) -> str:
    """Replace (or append) the generated port-notes section of a README."""
    lines = [
        PORT_SECTION_BEGIN,
        "## Port notes",
        "",
        f"Ported from the `{reference.name}` reference by autoport-cst, plan `{plan.name}` "
        f"(architecture `{plan.architecture}`).",
        "",
        "| step | codemod | realizes | origin |",
        "|---|---|---|---|",
    ]
    for number, step in enumerate(result.steps, 1):
        realizes = ", ".join(f"`{r}`" for r in step.realizes) or "-"
        lines.append(f"| {number} | `{step.codemod}` | {realizes} | {step.origin} |")
    if result.composition and result.composition.by_config:
        lines += ["", "Read from the model config at run time (no code change):", ""]
        lines += [f"- `{d.path}`: {json.dumps(to_json(d.target))}" for d in result.composition.by_config]
    lines.append(PORT_SECTION_END)
    section = "\n".join(lines) + "\n"
    if PORT_SECTION_BEGIN in text and PORT_SECTION_END in text:
        before, _, rest = text.partition(PORT_SECTION_BEGIN)
        _, _, after = rest.partition(PORT_SECTION_END)
        return before + section + after.lstrip("\n")
    return text.rstrip("\n") + "\n\n" + section
