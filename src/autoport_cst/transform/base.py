"""The codemod framework: what a codemod declares and how it is run on one file.

A codemod is one class in one file of ``autoport_cst.codemods``. Its class
docstring is its documentation; its ``EXAMPLES`` (before/after pairs) are run
as tests and printed by ``autoport-cst codemods show``. A codemod declares:

- ``ID``: the kebab-case name used in plan.json and on the command line;
- ``REALIZES``: the architecture-spec fields (dotted paths) it can change, and
  which changes of each (``autoport_cst.transform.realizes``);
- ``Params``: a frozen dataclass of parameters, validated from plan.json;
- ``AFTER``: codemods it must run after when both are in one port;
- ``FILES``: the file roles of a package it transforms (``model``, ``config``,
  ``factory``, ``init``, ``docs``, ``registry``, ``companion``);
- ``SAFE``: False when the change alters numerics (lint applies such fixes
  only with ``--unsafe-fixes``).

``transform_module`` receives a parsed module and returns a new one, or raises
:class:`~autoport_cst.errors.PreconditionError` naming the file, the class and
what it looked for. A codemod applied to its own output changes nothing.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import libcst as cst

from autoport_cst.errors import InputError, MultiInputError, Position, PreconditionError
from autoport_cst.spec import JsonProblem, from_json
from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform.realizes import realizes

if TYPE_CHECKING:
    from autoport_cst.spec import ArchSpec, FieldDiff

FILE_ROLES = ("model", "config", "factory", "init", "docs", "registry", "companion", "tower")


@dataclass(frozen=True)
class NoParams:
    """This codemod takes no parameters."""


@dataclass(frozen=True)
class Example:
    """A before/after pair. Both sides are dedented with ``textwrap.dedent`` and
    compared byte for byte after the transform. ``raises`` instead expects a
    precondition error whose message contains that text."""

    before: str
    after: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    role: str = "model"
    path: str = "model.py"
    raises: str | None = None
    title: str = ""
    # classes defined elsewhere in the package (for codemods that need the
    # package's class list, such as rename-classes)
    package_classes: tuple[str, ...] = ()
    # the reference package's name (for absolute imports of its own modules)
    reference: str = ""

    @property
    def source(self) -> str:
        return textwrap.dedent(self.before).lstrip("\n")

    @property
    def expected(self) -> str | None:
        return None if self.after is None else textwrap.dedent(self.after).lstrip("\n")


@dataclass(frozen=True)
class Note:
    """Something a codemod reports about its edit (for example each string or
    comment it rewrote), with a position in the input file."""

    path: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: {self.message}"


@dataclass
class PortContext:
    """What a codemod may know about the port as a whole."""

    model_name: str = "model"
    class_prefix: str = "Model"
    architecture: str = "ModelForCausalLM"
    reference_prefix: str = "Model"
    reference_name: str = ""  # the reference package's name (``llama3``)
    # class names defined anywhere in the package being transformed
    package_classes: frozenset[str] = frozenset()


@dataclass
class FileContext:
    """The file a codemod is transforming, and where its notes go.

    ``codemod`` is the ID of the codemod at work (messages name it).
    ``unaffected`` collects the sites of a touched family that the codemod
    looked at and left alone on purpose, with the reason (see
    ``autoport_cst.transform.anatomy.census``)."""

    path: str
    role: str
    port: PortContext = field(default_factory=PortContext)
    notes: list[Note] = field(default_factory=list)
    codemod: str = ""
    unaffected_sites: dict[int, str] = field(default_factory=dict)
    # features the reference reads from the config (``config_driven``) that
    # the port supports for fewer values: feature -> the values it keeps
    narrowed: dict[str, list] = field(default_factory=dict)

    def note(self, line: int, column: int, message: str) -> None:
        self.notes.append(Note(self.path, line, column, message))

    def unaffected(self, node: cst.CSTNode, reason: str) -> None:
        """Declare the site at ``node`` (a call of the input module) left
        unchanged on purpose: the codemod's change does not reach it."""
        self.unaffected_sites[id(node)] = reason

    def narrow(self, feature: str, values: list) -> None:
        """Declare that the port supports only ``values`` of ``feature``, a
        feature its reference reads from the config and declares for more
        values (``config_driven``): the port's manifest declares no other, and
        the port must refuse the others where it meets them."""
        kept = self.narrowed.get(feature)
        self.narrowed[feature] = [v for v in values if kept is None or v in kept]

    def handled(self, node: cst.CSTNode, how: str) -> None:
        """Declare the site at ``node`` handled where the census cannot see it:
        guarded (its path raises when the feature is on), or changed upstream,
        where every path meets (an embedding scaled before the layer loop)."""
        self.unaffected_sites[id(node)] = how

    def precondition(
        self, message: str, node: cst.CSTNode | None = None, module: cst.Module | None = None
    ) -> PreconditionError:
        """Build a positioned precondition error (raise the result)."""
        line = column = None
        if node is not None and module is not None:
            line, column = locate(module, node)
        return PreconditionError(message, Position(self.path, line, column))

    def refuse(
        self, message: str, node: cst.CSTNode | None = None, module: cst.Module | None = None
    ) -> PreconditionError:
        """A positioned precondition error naming the codemod at work:
        ``raise ctx.refuse("no X in this file", node, module)`` reads
        ``<codemod ID>: no X in this file``. Shared helpers refuse through it,
        so the codemod's identity travels in the context, not in arguments."""
        return self.precondition(f"{self.codemod}: {message}", node, module)


def locate(module: cst.Module, node: cst.CSTNode) -> tuple[int | None, int | None]:
    """1-based line and column of ``node`` in ``module``. Computed on demand
    (only when a diagnostic needs it), so codemods pay nothing for positions on
    the success path."""
    from libcst.metadata import MetadataWrapper, PositionProvider

    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    pos = positions.get(node)
    if pos is None:
        return None, None
    return pos.start.line, pos.start.column + 1


class Codemod:
    """Base class of every codemod. Subclasses set the class attributes below
    and implement :meth:`transform_module` (and :meth:`transform_text` for
    non-Python files)."""

    ID: ClassVar[str] = ""
    REALIZES: ClassVar[tuple[str, ...]] = ()
    # What a codemod that realizes no spec field is for ("every port",
    # "repair", "hardware rule"), shown where the library lists what each realizes.
    PURPOSE: ClassVar[str] = ""
    # Families of sites (``autoport_cst.transform.anatomy``) whose computation
    # this codemod changes; None: derived from ``REALIZES``.
    TOUCHES: ClassVar[tuple[str, ...] | None] = None
    Params: ClassVar[type] = NoParams
    AFTER: ClassVar[tuple[str, ...]] = ()
    FILES: ClassVar[tuple[str, ...]] = ("model",)
    SAFE: ClassVar[bool] = True
    EXAMPLES: ClassVar[tuple[Example, ...]] = ()
    # True: it needs what only a real model file has (the RoPE call, the decode
    # mask, the KV-cache spec) and refuses the generated model-shaped sources of
    # the property tests, which run it on the reference model files instead.
    NEEDS_REAL_MODEL: ClassVar[bool] = False
    # Known pitfalls of porting the features it realizes, listed by ``plan``
    # for the models that have them (``autoport_cst.spec.pitfalls``).
    PITFALLS: ClassVar[tuple[Pitfall, ...]] = ()

    def __init__(self, params: Any = None) -> None:
        self.params = params if params is not None else self.Params()

    # -- declaration helpers -------------------------------------------------

    @classmethod
    def summary(cls) -> str:
        doc = textwrap.dedent((cls.__doc__ or "").strip("\n")).strip()
        return " ".join(doc.split("\n\n")[0].split())

    @classmethod
    def documentation(cls) -> str:
        return textwrap.dedent((cls.__doc__ or "").strip("\n")).strip()

    @classmethod
    def parse_params(
        cls, data: Mapping[str, Any] | None, json_path: str = "$.params", source: str = "<params>"
    ) -> Any:
        """Validate parameters from JSON data; raises with JSON paths."""
        problems: list[JsonProblem]
        params, problems = from_json(cls.Params, dict(data or {}), json_path)
        if params is not None:
            problems = [JsonProblem(json_path, msg) for msg in cls.check_params(params)]
        if problems:
            errors = [InputError(p.message, Position(source, json_path=p.json_path)) for p in problems]
            raise MultiInputError(f"{source}: invalid parameters for codemod {cls.ID}", errors)
        return params

    @classmethod
    def check_params(cls, params: Any) -> list[str]:
        """Semantic checks beyond types; return messages (empty when fine)."""
        return []

    @classmethod
    def realizes(cls, diff: FieldDiff) -> bool:
        """Whether this codemod can realize one diff: a change ``REALIZES``
        declares (``autoport_cst.transform.realizes``; a plain tuple of paths:
        any change of those fields)."""
        return realizes(cls.REALIZES, diff)

    @classmethod
    def params_for(cls, diffs: list[FieldDiff], target: ArchSpec, port: PortContext) -> Any:
        """Parameters that realize ``diffs`` (those this codemod realizes)."""
        return cls.Params()

    @classmethod
    def param_docs(cls) -> list[tuple[str, str, str, str]]:
        """(name, type, default, doc) of each parameter."""
        rows = []
        for f in dataclasses.fields(cls.Params):
            default = "required"
            if f.default is not dataclasses.MISSING:
                default = repr(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                default = repr(f.default_factory())
            type_name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            rows.append((f.name, str(type_name), default, f.metadata.get("doc", "")))
        return rows

    def touches(self) -> tuple[str, ...]:
        """The site families this codemod, with its parameters, changes: each
        of their sites must be edited or declared unaffected."""
        if self.TOUCHES is not None:
            return self.TOUCHES
        from autoport_cst.transform.anatomy.census import families_of

        return families_of(self.REALIZES)

    # -- transformation ------------------------------------------------------

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        raise NotImplementedError

    def transform_text(self, text: str, ctx: FileContext) -> str:
        """Non-Python files (README.md). Default: unchanged."""
        return text

    def applies_to(self, role: str) -> bool:
        return role in self.FILES


def run_on_source(
    codemod: Codemod,
    source: str,
    path: str = "model.py",
    role: str = "model",
    port: PortContext | None = None,
) -> tuple[str, list[Note]]:
    """Parse, transform and print one file (used by tests, docs and lint fixes).
    Raises PreconditionError."""
    ctx = FileContext(path=path, role=role, port=port or PortContext(), codemod=codemod.ID)
    if path.endswith(".py"):
        module = cst.parse_module(source)
        ctx.port.package_classes = ctx.port.package_classes | frozenset(defined_classes(module))
        return codemod.transform_module(module, ctx).code, ctx.notes
    return codemod.transform_text(source, ctx), ctx.notes


def run_example(codemod_cls: type[Codemod], example: Example) -> tuple[str, list[Note]]:
    """Run one inline example (raises PreconditionError for ``raises`` examples)."""
    codemod = codemod_cls(codemod_cls.parse_params(example.params))
    port = PortContext(package_classes=frozenset(example.package_classes), reference_name=example.reference)
    return run_on_source(codemod, example.source, example.path, example.role, port)


def defined_classes(module: cst.Module) -> list[str]:
    return [s.name.value for s in module.body if isinstance(s, cst.ClassDef)]


def fail(
    ctx: FileContext, message: str, node: cst.CSTNode | None = None, module: cst.Module | None = None
) -> PreconditionError:
    """Shorthand: ``raise fail(ctx, "...", node, module)``."""
    return ctx.precondition(message, node, module)
