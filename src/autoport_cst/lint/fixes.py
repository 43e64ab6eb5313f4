"""The fix loop: codemods applied until nothing changes.

For one file: lint; collect the codemods offered by the remaining findings
(safe ones, and unsafe ones with ``--unsafe-fixes``); run each through
:func:`autoport_cst.transform.run_on_source`; keep a result only if it parses
(a fix that breaks parsing is reverted and reported); lint again; repeat until
no codemod changes anything or ``max_iterations`` is reached (reported as not
converged). A codemod whose preconditions fail (``PreconditionError``) does
not apply to this file: its findings stay, marked as not fixable here.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from autoport_cst.lint.config import LintSettings
from autoport_cst.lint.diagnostics import Diagnostic, FileResult, FixProblem

if TYPE_CHECKING:
    from autoport_cst.transform.base import Codemod

MAX_ITERATIONS = 10

CodemodFactory = Callable[[str], "type[Codemod]"]


def default_factory(codemod_id: str) -> type[Codemod]:
    """The codemod class for an ID (imports the codemod library lazily)."""
    from autoport_cst.transform.library import get_codemod

    return get_codemod(codemod_id)


def _parses(code: str, path: str) -> str | None:
    """None when ``code`` parses (Python and LibCST), else the error."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(code, path)
    except SyntaxError as error:
        return f"line {error.lineno}: {error.msg}"
    except (ValueError, RecursionError) as error:
        return str(error)
    import libcst as cst

    try:
        cst.parse_module(code)
    except Exception as error:  # noqa: BLE001 - any parser failure
        return f"LibCST: {str(error).splitlines()[0]}"
    return None


def wanted_fixes(diagnostics: list[Diagnostic], unsafe: bool) -> list[str]:
    out: list[str] = []
    for diag in diagnostics:
        if diag.fix is None or (not diag.fix.safe and not unsafe):
            continue
        if diag.fix.codemod not in out:
            out.append(diag.fix.codemod)
    return out


def fix_source(
    code: str,
    path: str = "model.py",
    settings: LintSettings | None = None,
    *,
    unsafe: bool = False,
    max_iterations: int = MAX_ITERATIONS,
    factory: CodemodFactory | None = None,
    lint: Callable[[str], list[Diagnostic]] | None = None,
) -> FileResult:
    """Fix one file's text. Returns a FileResult with ``original``,
    ``fixed`` (the final text), ``applied`` codemod IDs in order, the
    remaining diagnostics, and ``fix_problems``."""
    from autoport_cst.lint.engine import lint_source

    settings = settings or LintSettings()
    factory = factory or default_factory
    if lint is None:

        def lint(text: str) -> list[Diagnostic]:
            return lint_source(text, path, settings=settings)

    result = FileResult(path=path, original=code)
    current = code
    blocked: dict[str, str] = {}
    diagnostics = lint(current)
    initial = len(diagnostics)
    converged = False
    for _ in range(max_iterations):
        if any(d.code == "NRN999" for d in diagnostics):
            converged = True
            break
        todo = [c for c in wanted_fixes(diagnostics, unsafe) if c not in blocked]
        if not todo:
            converged = True
            break
        changed = False
        for codemod_id in todo:
            new, problem = _try_fix(codemod_id, current, path, factory)
            if problem is not None:
                blocked[codemod_id] = problem.message
                result.fix_problems.append(problem)
                continue
            current = new
            changed = True
            result.applied.append(codemod_id)
        diagnostics = lint(current)
        if not changed:
            converged = True
            break
    if not converged:
        result.fix_problems.append(
            FixProblem(
                ",".join(dict.fromkeys(result.applied)) or "-",
                "not-converged",
                f"fixes did not converge after {max_iterations} iterations; the last result is kept",
            )
        )

    # findings whose fix was tried and refused: say why, and do not offer it
    out = [_refused(diag, blocked) for diag in diagnostics]
    result.diagnostics = out
    result.fixed = current
    result.fixed_count = max(0, initial - len(out)) if current != code else 0
    return result


def _try_fix(
    codemod_id: str, current: str, path: str, factory: CodemodFactory
) -> tuple[str, FixProblem | None]:
    """The text after the codemod, or why it is not kept (a fix that does not
    apply here, crashes, changes nothing or breaks parsing)."""
    from autoport_cst.errors import AutoportError, PreconditionError
    from autoport_cst.transform.base import run_on_source

    try:
        codemod_cls = factory(codemod_id)
    except AutoportError as error:
        return current, FixProblem(codemod_id, "failed", f"codemod {codemod_id} is not available: {error}")
    try:
        new, _notes = run_on_source(codemod_cls(), current, path=path, role="model")
    except PreconditionError as error:
        return current, FixProblem(
            codemod_id, "not-applicable", f"{codemod_id} does not apply here: {error.message}"
        )
    except Exception as error:  # noqa: BLE001 - a codemod bug must not lose the file
        return current, FixProblem(
            codemod_id, "failed", f"{codemod_id} failed: {type(error).__name__}: {error}"
        )
    if new == current:
        return current, FixProblem(codemod_id, "no-change", f"{codemod_id} changes nothing here")
    broken = _parses(new, path)
    if broken is not None:
        message = f"{codemod_id} produced code that does not parse ({broken}); reverted"
        return current, FixProblem(codemod_id, "reverted", message)
    return new, None


def _refused(diag: Diagnostic, blocked: dict[str, str]) -> Diagnostic:
    """A finding whose fix was tried and not kept: no fix offered, the reason noted."""
    if diag.fix is not None and diag.fix.codemod in blocked:
        from dataclasses import replace

        return replace(diag, fix=None, note=blocked[diag.fix.codemod])
    return diag
