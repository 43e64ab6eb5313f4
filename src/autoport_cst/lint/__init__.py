"""Hardware-rule linter for vllm_neuron model code (``autoport-cst lint``).

Library API::

    from autoport_cst.lint import lint_source
    for d in lint_source(code, path="model.py"):
        print(d.path, d.line, d.column, d.code, d.message)

- :func:`lint_source` (code, path=..., select=, ignore=, options=, settings=)
  -> list of :class:`Diagnostic` (1-based line and column);
- :func:`fix_source` (code, path=..., unsafe=...) -> :class:`FileResult` with
  the fixed text and the remaining diagnostics;
- :func:`lint_paths` (paths, ...) -> :class:`Report` over files and
  directories, with configuration and the cache;
- :func:`load_settings` (path) -> the :class:`LintSettings` that configure
  ``path`` (``[tool.autoport-cst.lint]`` of the nearest pyproject.toml);
- :func:`all_rules` -> code -> rule class.

Nothing here imports torch or transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autoport_cst.lint.config import LintSettings
from autoport_cst.lint.diagnostics import Diagnostic, FileResult, Fix, FixProblem

if TYPE_CHECKING:  # pragma: no cover
    from autoport_cst.lint.runner import Report

__all__ = [
    "Diagnostic",
    "FileResult",
    "Fix",
    "FixProblem",
    "LintSettings",
    "fix_source",
    "lint_paths",
    "lint_source",
    "load_settings",
    "all_rules",
]


def lint_source(code: str | bytes, path: str = "<string>", **kwargs: Any) -> list[Diagnostic]:
    """Lint one file's text; see :func:`autoport_cst.lint.engine.lint_source`."""
    from autoport_cst.lint.engine import lint_source as _lint_source

    return _lint_source(code, path, **kwargs)


def fix_source(
    code: str,
    path: str = "model.py",
    *,
    unsafe: bool = False,
    settings: LintSettings | None = None,
    **kwargs: Any,
) -> FileResult:
    """Apply the fixes of the findings until nothing changes; see
    :func:`autoport_cst.lint.fixes.fix_source`."""
    from autoport_cst.lint.fixes import fix_source as _fix_source

    return _fix_source(code, path, settings, unsafe=unsafe, **kwargs)


def lint_paths(paths: list[str], **options: Any) -> Report:
    """Lint files and directories (configuration, cache and all) and return
    the report; ``options`` are the fields of
    :class:`autoport_cst.lint.runner.RunOptions`."""
    from autoport_cst.lint.runner import RunOptions, run

    return run(list(paths), RunOptions(**options))


def load_settings(path: str) -> LintSettings:
    """The settings that configure ``path``."""
    from autoport_cst.lint.config import settings_for

    return settings_for(path)


def all_rules() -> dict[str, type]:
    """Rule code -> rule class."""
    from autoport_cst.lint.rules import registry

    return registry()
