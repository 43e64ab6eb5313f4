"""Reference packages: a directory of vllm_neuron-style model files plus a
``reference.json`` manifest that declares the reference's architecture spec.

A reference is a built-in name (``llama3``) or a path to a directory with a
manifest, which includes any port written by ``apply`` (it writes the
manifest of the port), so a port can serve as the reference of the next one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoport_cst.errors import InputError, MultiInputError, Position, did_you_mean
from autoport_cst.plan.naming import ARCHITECTURE_RE, CLASS_PREFIX_RE, MODEL_NAME_RE
from autoport_cst.spec import SPEC_VERSION, ArchSpec, from_json, get_field, leaf_fields, schema_of, to_json
from autoport_cst.transform.cst.roles import file_role

if TYPE_CHECKING:
    import libcst as cst

MANIFEST = "reference.json"
MANIFEST_FORMAT = 1
COMPANIONS_DIR = "companions"
SKIPPED = {"__pycache__", MANIFEST, COMPANIONS_DIR, ".DS_Store"}


@dataclass(frozen=True)
class Provenance:
    """How a port was made (written into a port's manifest)."""

    reference: str = field(metadata={"doc": "Name of the reference it was ported from."})
    reference_sha256: str = field(metadata={"doc": "Digest of the reference's files."})
    plan_sha256: str = field(metadata={"doc": "Digest of the plan (canonical JSON)."})
    steps: tuple[str, ...] = field(default=(), metadata={"doc": "Codemod steps applied, in order."})
    tool_version: str = field(default="", metadata={"doc": "autoport-cst version."})


@dataclass(frozen=True)
class Manifest:
    """reference.json: what a reference package is and what it computes."""

    format: int = field(metadata={"doc": f"Manifest format; this tool reads {MANIFEST_FORMAT}."})
    name: str = field(metadata={"doc": "Package name (snake_case)."})
    class_prefix: str = field(metadata={"doc": "Prefix of the package's classes."})
    architecture: str = field(metadata={"doc": "Hugging Face architecture string it implements."})
    spec: ArchSpec = field(metadata={"doc": "What the reference computes."})
    summary: str = field(default="", metadata={"doc": "One line."})
    spec_version: int = field(default=SPEC_VERSION, metadata={"doc": "Spec format version."})
    config_driven: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "doc": "Spec fields the code reads from the config at run time: dotted path -> "
            'list of supported values, or "*" for any value.'
        },
    )
    companions: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "doc": "Companion file -> output path template ({name} is the model name): the file in "
            "companions/, or else the tool's template of that name (run.py)."
        },
    )
    provenance: Provenance | None = field(
        default=None, metadata={"doc": "Set in a port's manifest: how it was made."}
    )


@dataclass(frozen=True)
class Reference:
    name: str
    directory: Path
    manifest: Manifest
    files: dict[str, str]  # package-relative path -> text
    companions: dict[str, str]  # companion file name -> text
    sha256: str

    @property
    def spec(self) -> ArchSpec:
        return self.manifest.spec

    @property
    def class_prefix(self) -> str:
        return self.manifest.class_prefix

    def supports_by_config(self, path: str, value: Any) -> bool:
        """Whether the reference's code reads field ``path`` from the config and
        handles ``value``."""
        allowed = self.manifest.config_driven.get(path)
        if allowed is None:
            return False
        if allowed == "*":
            return True
        return value in allowed


def manifest_schema() -> dict[str, Any]:
    definitions: dict[str, Any] = {}
    root = schema_of(Manifest, definitions)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://autoport-cst.dev/schemas/reference-v1.json",
        "title": "autoport-cst reference manifest",
        **root,
        "$defs": definitions,
    }


def builtin_names() -> list[str]:
    from autoport_cst.reference_models import builtin_references

    return list(builtin_references())


def resolve_reference(ref: str) -> Path:
    """A built-in name or a directory path -> the reference directory."""
    from autoport_cst.reference_models import builtin_references

    builtins = builtin_references()
    if ref in builtins:
        return builtins[ref]
    path = Path(ref)
    if path.is_dir():
        if not (path / MANIFEST).is_file():
            # a bare word meant as a built-in (--ref llama beside a llama/ directory)
            hint = did_you_mean(ref, builtins) if "/" not in ref else ""
            raise InputError(
                f"{path} is not a reference package: it has no {MANIFEST} "
                f"(see `autoport-cst schema reference`){hint}"
            )
        return path
    known = ", ".join(builtins) or "none"
    raise InputError(
        f"unknown reference {ref!r}: not a built-in reference ({known}) nor a directory"
        + did_you_mean(ref, builtins)
    )


def load_reference(ref: str) -> Reference:
    directory = resolve_reference(ref)
    manifest_path = directory / MANIFEST
    manifest = _load_manifest(manifest_path)
    files: dict[str, str] = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if path.is_dir() or rel.parts[0] in SKIPPED or any(p in SKIPPED for p in rel.parts):
            continue
        if path.suffix in (".pyc", ".pyo"):
            continue
        files[rel.as_posix()] = _read(path)
    companions = {name: _companion(directory, manifest, name) for name in manifest.companions}
    roles = {file_role(p) for p in files}
    if "model" not in roles:
        raise InputError(f"reference {directory} has no model file (model.py or model_*.py)")
    digest = hashlib.sha256()
    for name, text in [*files.items(), *((f"{COMPANIONS_DIR}/{k}", v) for k, v in companions.items())]:
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    digest.update(json.dumps(to_json(manifest.spec), sort_keys=True).encode())
    return Reference(manifest.name, directory, manifest, files, companions, digest.hexdigest())


class ParsedTexts:
    """Each text parsed once by LibCST (the composer lints the config files,
    the engine transforms every file): the module, or the error parsing
    raised, raised again."""

    def __init__(self) -> None:
        self._found: dict[str, cst.Module | Exception] = {}

    def module(self, text: str) -> cst.Module:
        found = self._found.get(text)
        if found is None:
            import libcst as cst

            try:
                found = cst.parse_module(text)
            except Exception as error:  # raised again to each caller, as parsing would
                found = error
            self._found[text] = found
        if isinstance(found, Exception):
            raise found
        return found


def _companion(directory: Path, manifest: Manifest, name: str) -> str:
    """The text of companion ``name``: the reference's own file in
    ``companions/``, or else made from the template of that name
    (``companion_templates``)."""
    from autoport_cst.apply.companion_templates import TEMPLATES

    path = directory / COMPANIONS_DIR / name
    if path.is_file():
        return _read(path)
    if name in TEMPLATES:
        return TEMPLATES[name](manifest)
    raise InputError(
        f"companion file {COMPANIONS_DIR}/{name} is missing (and no template makes one: "
        f"{', '.join(sorted(TEMPLATES))})",
        Position(str(directory / MANIFEST), json_path=f"$.companions.{name}"),
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None


def _load_manifest(path: Path) -> Manifest:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"malformed JSON: {exc.msg}", Position(str(path), exc.lineno, exc.colno)) from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    manifest, problems = from_json(Manifest, data)
    messages = [(p.json_path, p.message) for p in problems]
    if manifest is not None:
        messages += _semantic_problems(manifest)
    if messages:
        errors = [InputError(msg, Position(str(path), json_path=jp)) for jp, msg in messages]
        raise MultiInputError(f"{path}: invalid reference manifest", errors)
    return manifest


def _semantic_problems(manifest: Manifest) -> list[tuple[str, str]]:
    problems = []
    if manifest.format != MANIFEST_FORMAT:
        problems.append(("$.format", f"unsupported manifest format {manifest.format}"))
    if manifest.spec_version != SPEC_VERSION:
        problems.append(("$.spec_version", f"unsupported spec version {manifest.spec_version}"))
    if not MODEL_NAME_RE.match(manifest.name):
        problems.append(("$.name", f"{manifest.name!r} is not snake_case"))
    if not CLASS_PREFIX_RE.match(manifest.class_prefix):
        problems.append(("$.class_prefix", f"{manifest.class_prefix!r} is not PascalCase"))
    if not ARCHITECTURE_RE.match(manifest.architecture):
        problems.append(("$.architecture", f"{manifest.architecture!r} is not a class name"))
    known = {path for path, _, _ in leaf_fields()}
    for path, allowed in manifest.config_driven.items():
        if path not in known:
            problems.append((f"$.config_driven.{path}", "not a field of the architecture spec"))
        elif allowed != "*" and not isinstance(allowed, list):
            problems.append((f"$.config_driven.{path}", 'expected a list of values or "*"'))
        elif isinstance(allowed, list) and get_field(manifest.spec, path) not in allowed:
            problems.append((f"$.config_driven.{path}", "the reference's own spec value is not in the list"))
    return problems
