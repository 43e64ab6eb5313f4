"""The error types that cross layer boundaries.

Inside the engine, outcomes are data (results with a failure field). These
exceptions are raised by loaders and codemods and turned into results by the
engine, or into one message and exit code 2 by the CLI (the exit codes:
``autoport_cst.cli.common``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Position:
    """A place in an input: a file, and optionally a 1-based line and column,
    or a JSON path for JSON inputs."""

    path: str
    line: int | None = None
    column: int | None = None
    json_path: str | None = None

    def __str__(self) -> str:
        text = self.path
        if self.line is not None:
            text += f":{self.line}"
            if self.column is not None:
                text += f":{self.column}"
        if self.json_path is not None:
            text += f" at {self.json_path}"
        return text


class AutoportError(Exception):
    """Base class: a user-facing problem with a clear message (exit code 2)."""

    def __init__(self, message: str, position: Position | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.position = position

    def __str__(self) -> str:
        if self.position is None:
            return self.message
        return f"{self.position}: {self.message}"


class InputError(AutoportError):
    """Malformed input: a plan, a manifest, a parameter, a path."""


class MultiInputError(InputError):
    """Several input errors found in one pass (for example every schema
    violation of a plan), reported together."""

    def __init__(self, summary: str, errors: Sequence[AutoportError]) -> None:
        super().__init__(summary)
        self.errors = list(errors)

    def __str__(self) -> str:
        lines = [self.message]
        lines += [f"  {error}" for error in self.errors]
        return "\n".join(lines)


class PreconditionError(AutoportError):
    """A codemod did not find what it transforms. The message names the file,
    the class and what was looked for."""

    # set by the engine: the failing step's codemod and the spec fields it realizes
    step: str | None = None
    realizes: tuple[str, ...] = ()


class UnrealizableDiffError(AutoportError):
    """No codemod realizes some fields of the architecture diff."""

    def __init__(self, message: str, fields: list[str], features: list[str] | None = None) -> None:
        super().__init__(message)
        self.fields = fields
        # The features by name: ``fields`` with the spec's ``unsupported``
        # entry replaced by the computations it lists (``moe.expert_mlp``, ...).
        self.features = features if features is not None else list(fields)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'llama3'?)"`` when ``name`` is close to one of
    ``choices`` (difflib), else ``""``: appended to an "unknown X" message."""
    import difflib

    options = list(dict.fromkeys(choices))  # each once: a mapping's values repeat
    lowered = {option.lower(): option for option in options}
    if name.lower() in lowered:  # a difference of case only
        close = [lowered[name.lower()]]
    else:
        close = difflib.get_close_matches(name, options, n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
