"""plan.json: what to port (model identity), from which reference, to which
architecture spec, and optionally which codemod steps with which parameters.

The JSON Schema printed by ``autoport-cst schema plan`` is generated from the
same dataclasses the loader uses. Loading reports every error with its JSON
path; malformed JSON is reported with its line and column.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autoport_cst.errors import InputError, MultiInputError, Position
from autoport_cst.plan.naming import (
    ARCHITECTURE_RE,
    CLASS_PREFIX_RE,
    MODEL_NAME_RE,
    derive_class_prefix,
    model_name_problem,
)
from autoport_cst.spec import SPEC_VERSION, ArchSpec, JsonProblem, from_json, schema_of, to_json

PLAN_VERSION = 1


@dataclass(frozen=True)
class PlanStep:
    """One explicit codemod step. Explicit steps take precedence over the
    steps the composer derives from the architecture diff."""

    codemod: str = field(metadata={"doc": "Codemod ID, as listed by `autoport-cst codemods`."})
    params: dict[str, Any] = field(
        default_factory=dict, metadata={"doc": "Codemod parameters (see `codemods show ID`)."}
    )


@dataclass(frozen=True)
class Plan:
    """A port plan (plan.json)."""

    version: int = field(metadata={"doc": f"Plan format version; this tool writes {PLAN_VERSION}."})
    name: str = field(metadata={"doc": "Model name in snake_case: the package directory name."})
    architecture: str = field(
        metadata={"doc": "Exact Hugging Face architecture string (config.json architectures[0])."}
    )
    reference: str | None = field(
        default=None,
        metadata={"doc": "Reference model to start from (built-in name); `apply --ref` overrides."},
    )
    class_prefix: str | None = field(
        default=None,
        metadata={"doc": "PascalCase class prefix; derived from `name` when absent (gpt_neox -> GptNeox)."},
    )
    spec_version: int = field(
        default=SPEC_VERSION, metadata={"doc": "Version of the architecture spec format."}
    )
    spec: ArchSpec = field(
        default_factory=ArchSpec,
        metadata={"doc": "Target architecture; fields left out take Llama-like defaults."},
    )
    steps: tuple[PlanStep, ...] = field(default=(), metadata={"doc": "Explicit codemod steps (optional)."})
    checkpoint_keys: tuple[str, ...] | None = field(
        default=None,
        metadata={
            "doc": "Tensor key patterns (layer indices as *) of the checkpoint the plan was researched on, "
            "read from its safetensors header; apply refuses a port that loads a key not among them. "
            "null: not checked."
        },
    )
    description: str | None = field(default=None, metadata={"doc": "Free text."})

    @property
    def prefix(self) -> str:
        return self.class_prefix or derive_class_prefix(self.name)


def plan_schema() -> dict[str, Any]:
    definitions: dict[str, Any] = {}
    root = schema_of(Plan, definitions)
    plan_def = definitions["Plan"]
    plan_def["properties"] = {
        "$schema": {"type": "string", "description": "Optional schema reference for editors."},
        **plan_def["properties"],
    }
    plan_def["properties"]["version"]["const"] = PLAN_VERSION
    plan_def["properties"]["spec_version"]["const"] = SPEC_VERSION
    plan_def["properties"]["name"]["pattern"] = MODEL_NAME_RE.pattern
    plan_def["properties"]["architecture"]["pattern"] = ARCHITECTURE_RE.pattern
    plan_def["properties"]["class_prefix"] = {
        "anyOf": [{"type": "string", "pattern": CLASS_PREFIX_RE.pattern}, {"type": "null"}],
        "description": plan_def["properties"]["class_prefix"]["description"],
        "default": None,
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://autoport-cst.dev/schemas/plan-v1.json",
        "title": "autoport-cst plan",
        **root,
        "$defs": definitions,
    }


def parse_plan(data: Any, source: str = "<plan>") -> Plan:
    """Validate plan data; raises MultiInputError listing every problem."""
    problems: list[JsonProblem] = []
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k != "$schema"}
    plan, problems = from_json(Plan, data)
    if plan is not None:
        problems += _semantic_problems(plan)
    if problems:
        errors = [InputError(p.message, Position(source, json_path=p.json_path)) for p in problems]
        noun = "error" if len(errors) == 1 else "errors"
        raise MultiInputError(f"{source}: invalid plan ({len(errors)} {noun})", errors)
    return plan


def _semantic_problems(plan: Plan) -> list[JsonProblem]:
    problems = []
    if plan.version != PLAN_VERSION:
        problems.append(
            JsonProblem("$.version", f"unsupported plan version {plan.version}; expected {PLAN_VERSION}")
        )
    if plan.spec_version != SPEC_VERSION:
        problems.append(
            JsonProblem(
                "$.spec_version",
                f"unsupported spec version {plan.spec_version}; expected {SPEC_VERSION}",
            )
        )
    name_problem = model_name_problem(plan.name)
    if name_problem is not None:
        problems.append(JsonProblem("$.name", name_problem))
    if not ARCHITECTURE_RE.match(plan.architecture):
        problems.append(JsonProblem("$.architecture", f"{plan.architecture!r} is not a Python class name"))
    if plan.class_prefix is not None and not CLASS_PREFIX_RE.match(plan.class_prefix):
        problems.append(
            JsonProblem(
                "$.class_prefix", f"{plan.class_prefix!r} is not PascalCase ({CLASS_PREFIX_RE.pattern})"
            )
        )
    return problems


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"plan file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read plan file {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"malformed JSON: {exc.msg}", Position(str(path), exc.lineno, exc.colno)) from None
    return parse_plan(data, str(path))


def plan_to_json(plan: Plan) -> dict[str, Any]:
    return to_json(plan)


class Researched(Protocol):
    """What a plan needs of a research result."""

    @property
    def architecture(self) -> str: ...

    @property
    def spec(self) -> ArchSpec: ...


def from_research(
    found: Researched, name: str, reference: str | None, description: str, source: str = "<generated plan>"
) -> Plan:
    """The plan of a researched model, validated as a plan read from disk is
    (the plan ``plan`` writes and the one ``port`` applies are built here)."""
    guards = assumptions_of(found, reference).step()
    steps = [PlanStep(guards["codemod"], guards["params"])] if guards else []
    steps.extend(key_format_steps(found.architecture))
    steps.extend(code_fixed_plan_steps(found, reference))
    plan = Plan(
        version=PLAN_VERSION,
        name=name,
        architecture=found.architecture,
        reference=reference,
        class_prefix=derive_class_prefix(name),
        spec=found.spec,
        steps=tuple(steps),
        description=description,
        checkpoint_keys=tuple(getattr(found, "checkpoint_keys", ()) or ()) or None,
    )
    return parse_plan(plan_to_json(plan), source)


def key_format_steps(architecture: str) -> list[PlanStep]:
    """The key-formats step when transformers names some of the
    architecture's tensors differently in its two key formats (module tree,
    save_pretrained): the port loads either (``research.key_formats``)."""
    from autoport_cst.research.key_formats import key_format_renames

    renames = key_format_renames(architecture)
    return [PlanStep("key-formats", {"renames": dict(renames)})] if renames else []


def code_fixed_plan_steps(found: Researched, reference: str | None) -> list[PlanStep]:
    """Steps that fix in code a feature the reference reads from a config key
    the model's config lacks, or holds but does not follow
    (:mod:`autoport_cst.plan.code_fixed`)."""
    from autoport_cst.apply.reference import load_reference
    from autoport_cst.errors import InputError
    from autoport_cst.plan.code_fixed import code_fixed_steps

    if reference is None:
        return []
    try:
        manifest = load_reference(reference).manifest
    except InputError:
        return []  # a reference directory named by its manifest's name: nothing read from the config
    return [PlanStep(c, p) for c, p in code_fixed_steps(found, manifest.spec, manifest.config_driven)]


def assumptions_of(found: Researched, reference: str | None):
    """What a port of ``found`` from ``reference`` assumes about the configs
    it is used with (:mod:`autoport_cst.plan.assumptions`): the guards it
    writes, the fields it reads at run time."""
    from autoport_cst.errors import InputError
    from autoport_cst.plan.assumptions import config_assumptions

    config_driven: dict[str, Any] = {}
    if reference is not None:
        from autoport_cst.apply.reference import load_reference

        try:
            config_driven = load_reference(reference).manifest.config_driven
        except InputError:
            # a reference directory named by its manifest's name: none of its
            # features counts as read from the config (more guards, never fewer)
            config_driven = {}
    return config_assumptions(getattr(found, "config_dependence", None), found.spec, config_driven)
