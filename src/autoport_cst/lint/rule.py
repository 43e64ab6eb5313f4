"""What a lint rule declares.

A rule is one class in one module of ``autoport_cst.lint.rules``:

- ``CODE`` (``NRN003``) and ``NAME`` (``no-item-in-forward``): stable, used by
  ``--select``, ``--ignore``, configuration and suppression comments;
- the class docstring: what the rule finds, why it breaks on hardware, an
  example (rendered by ``autoport-cst lint --explain CODE``);
- ``MESSAGE``: the default report text;
- ``SCOPE``: where a finding counts. ``forward``: only in functions on the
  forward path; ``init``: only in ``__init__`` of an ``nn.Module`` (and what
  it calls); ``file``: anywhere. The engine applies it after the traversal,
  when the module's call graph is known;
- ``FIX`` / ``FIX_SAFE``: the codemod (by ID) that fixes a finding, and
  whether that fix keeps numerics (unsafe fixes need ``--unsafe-fixes``);
- ``REPAIR``: ``apply`` runs the fix on a reference that breaks the rule;
- ``OPTIONS``: settings read from ``[tool.autoport-cst.lint.options.CODE]``;
- ``VALID`` / ``INVALID``: inline examples that are run as tests.

Logic lives in ``visit_<Node>`` / ``leave_<Node>`` methods (exact LibCST node
class names), called by the engine's single traversal, and in ``finish``,
called once after it, when the call graph, the class attributes and every
assignment of the file are known.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from autoport_cst.lint.diagnostics import ERROR, Fix

if TYPE_CHECKING:  # pragma: no cover
    import libcst as cst

    from autoport_cst.lint.engine import LintContext
    from autoport_cst.lint.index import Site


@dataclass(frozen=True)
class Option:
    """A rule option: its type (``bool``, ``int``, ``str`` or ``list[str]``),
    default and documentation."""

    type: str
    default: Any
    doc: str

    def check(self, value: Any) -> str | None:
        """A problem with ``value``, or None."""
        if self.type == "bool" and not isinstance(value, bool):
            return "expected true or false"
        if self.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            return "expected an integer"
        if self.type == "str" and not isinstance(value, str):
            return "expected a string"
        if self.type == "list[str]" and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            return "expected a list of strings"
        return None


@dataclass(frozen=True)
class Valid:
    """Code on which the rule reports nothing."""

    code: str
    options: Mapping[str, Any] = field(default_factory=dict)
    title: str = ""
    path: str = "model.py"

    @property
    def source(self) -> str:
        return textwrap.dedent(self.code).lstrip("\n")


@dataclass(frozen=True)
class Invalid:
    """Code on which the rule reports exactly at ``at``: the 1-based
    (line, column) of each of its diagnostics, in order. ``message`` must
    occur in every one of them; ``severity`` is their severity."""

    code: str
    at: tuple[tuple[int, int], ...]
    message: str | None = None
    severity: str = ERROR
    options: Mapping[str, Any] = field(default_factory=dict)
    title: str = ""
    path: str = "model.py"
    # whether the rule offers a fix for these diagnostics
    fixable: bool | None = None

    @property
    def source(self) -> str:
        return textwrap.dedent(self.code).lstrip("\n")


class Rule:
    """Base class of every rule (see the module docstring)."""

    CODE: ClassVar[str] = ""
    NAME: ClassVar[str] = ""
    MESSAGE: ClassVar[str] = ""
    SCOPE: ClassVar[str] = "file"
    FIX: ClassVar[str | None] = None
    FIX_SAFE: ClassVar[bool] = True
    OPTIONS: ClassVar[dict[str, Option]] = {}
    VALID: ClassVar[tuple[Valid | str, ...]] = ()
    INVALID: ClassVar[tuple[Invalid, ...]] = ()
    # emitted by the engine itself (syntax errors, suppression problems)
    PSEUDO: ClassVar[bool] = False
    # a reference package breaking this rule gets the fix as a repair step of
    # every port (the rule finds a latent bug that ports to other models expose)
    REPAIR: ClassVar[bool] = False

    def __init__(self, ctx: LintContext, options: Mapping[str, Any] | None = None) -> None:
        self.ctx = ctx
        values = {name: opt.default for name, opt in self.OPTIONS.items()}
        values.update(options or {})
        self.options = values

    # -- documentation --------------------------------------------------------

    @classmethod
    def documentation(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")

    @classmethod
    def summary(cls) -> str:
        """The first paragraph of the docstring, on one line."""
        doc = cls.documentation()
        if not doc:
            return cls.MESSAGE
        return " ".join(doc.split("\n\n", 1)[0].split())

    @classmethod
    def valid_examples(cls) -> list[Valid]:
        return [v if isinstance(v, Valid) else Valid(v) for v in cls.VALID]

    # -- reporting ------------------------------------------------------------

    def fix(self) -> Fix | None:
        """The fix offered for a finding of this rule."""
        return None if self.FIX is None else Fix(self.FIX, self.FIX_SAFE)

    def report(
        self,
        node: cst.CSTNode,
        message: str | None = None,
        *,
        site: Site | None = None,
        severity: str = ERROR,
        fix: Fix | None | bool = True,
        scope: str | None = None,
    ) -> None:
        """Record a finding at ``node``. ``site`` is where the node was seen
        (``self.ctx.site()`` during the traversal; pass the saved site when
        reporting from ``finish``). ``fix=True`` offers the rule's ``FIX``."""
        if fix is True:
            fix = self.fix()
        elif fix is False:
            fix = None
        self.ctx.add(
            self,
            node,
            message or self.MESSAGE,
            site=site,
            severity=severity,
            fix=fix,
            scope=scope or self.SCOPE,
        )

    def finish(self) -> None:
        """Called once after the traversal."""
