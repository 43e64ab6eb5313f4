"""Results as data: a positioned diagnostic, the fix it offers and the
outcome for one file. Nothing here imports LibCST, so output formatters and
the cache can use these types cheaply."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Fix:
    """The codemod that fixes a diagnostic. ``safe`` is False when the fix
    changes numerics; such fixes run only with ``--unsafe-fixes``."""

    codemod: str
    safe: bool = True


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One finding. Lines and columns are 1-based; ``end_line`` and
    ``end_column`` point just past the reported range (exclusive end, as in
    SARIF). ``severity`` is ``error`` or ``warning``: warnings are printed but
    do not fail the run unless ``warnings-as-errors`` is set. ``note`` says why
    a fix was not applied, when one was tried."""

    path: str
    line: int
    column: int
    code: str
    name: str
    message: str
    end_line: int = 0
    end_column: int = 0
    severity: str = ERROR
    fix: Fix | None = None
    note: str | None = None

    def with_path(self, path: str) -> Diagnostic:
        return replace(self, path=path)

    def sort_key(self) -> tuple:
        return (self.path, self.line, self.column, self.code, self.message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "code": self.code,
            "name": self.name,
            "severity": self.severity,
            "message": self.message,
            "fix": None if self.fix is None else {"codemod": self.fix.codemod, "safe": self.fix.safe},
            "note": self.note,
        }

    # compact form for the cache (the path is not stored)
    def to_row(self) -> list:
        fix = None if self.fix is None else [self.fix.codemod, self.fix.safe]
        return [
            self.line,
            self.column,
            self.end_line,
            self.end_column,
            self.code,
            self.name,
            self.message,
            self.severity,
            fix,
            self.note,
        ]

    @classmethod
    def from_row(cls, path: str, row: list) -> Diagnostic:
        line, column, end_line, end_column, code, name, message, severity, fix, note = row
        return cls(
            path=path,
            line=line,
            column=column,
            end_line=end_line,
            end_column=end_column,
            code=code,
            name=name,
            message=message,
            severity=severity,
            fix=None if fix is None else Fix(fix[0], fix[1]),
            note=note,
        )


@dataclass(frozen=True, slots=True)
class FixProblem:
    """A fix that was tried and not kept: its codemod did not apply here
    (precondition), crashed, produced code that does not parse (reverted), or
    the fix loop did not converge."""

    codemod: str
    kind: str  # "not-applicable" | "reverted" | "no-change" | "failed" | "not-converged"
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"codemod": self.codemod, "kind": self.kind, "message": self.message}


@dataclass
class FileResult:
    """What linting (and possibly fixing) one file produced. ``error`` is set
    for an internal error (a rule crashed): that is exit code 2, unlike a
    syntax error in the input, which is a diagnostic."""

    path: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    error: str | None = None
    cached: bool = False
    # fix mode
    original: str | None = None
    fixed: str | None = None
    applied: list[str] = field(default_factory=list)
    fixed_count: int = 0
    fix_problems: list[FixProblem] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.fixed is not None and self.original is not None and self.fixed != self.original
