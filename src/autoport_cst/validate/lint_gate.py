"""The hardware rules, checked before anything runs.

A port that breaks a Trainium hardware rule is a wrong port, whatever it
computes on CPU: the stand-in's kernels run code the device would refuse or
get wrong (a segmented-prefill kernel handed a non-packed FP8 cache asserts on
the device; the CPU run passes with the kernel's own refusal). So
``validate_model`` lints the port package with autoport-cst's own rules
(``autoport_cst.lint``, as ``autoport-cst lint <package>`` does: the
configuration of the nearest ``pyproject.toml``, suppression comments; the
results kept in this process by the files' contents, nothing on disk:
``lint.cache.MemoryCache``) once its input is checked, and an error-severity finding fails the
report at stage ``lint`` (exit 1) without running the port. Warnings do not
fail it. Every finding, warnings too, is in the report's ``lint``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

STAGE = "lint"


def lint_findings(package_dir: str | Path) -> list[Any]:
    """The findings of the lint rules on the package's files, in file and line
    order (``autoport_cst.lint.Diagnostic``). A rule that crashes is the
    validator's own failure (RuntimeError), not the port's."""
    from autoport_cst.lint import lint_paths

    report = lint_paths([str(package_dir)], use_cache=False, memory_cache=True, jobs=1)
    if report.errors:
        raise RuntimeError("the linter failed on the port: " + "; ".join(report.errors))
    return report.diagnostics


def failing(findings: list[Any]) -> list[Any]:
    """The findings that fail a validation (errors; a warning does not)."""
    return [d for d in findings if d.severity == "error"]


def how_to_fix(finding: Any, package_dir: str | Path) -> str:
    """What to run, or to do, about one finding."""
    if finding.fix is None:
        return f"no automatic fix: see `autoport-cst lint --explain {finding.code}`"
    if not finding.fix.safe:
        return (
            f"`autoport-cst lint --fix --unsafe-fixes {package_dir}` "
            f"(the {finding.fix.codemod} codemod; it changes numerics)"
        )
    return f"`autoport-cst lint --fix {package_dir}` (the {finding.fix.codemod} codemod)"


def failure_message(errors: list[Any], package_dir: str | Path) -> str:
    """The report's failure message: each finding positioned, with its fix."""
    count = f"{len(errors)} Trainium hardware rule{'s' if len(errors) > 1 else ''}"
    lines = [f"the port breaks {count} (autoport-cst lint; the port was not run):"]
    for finding in errors:
        lines.append(
            f"{finding.path}:{finding.line}:{finding.column}: {finding.code} {finding.name}: "
            f"{finding.message}; fix: {how_to_fix(finding, package_dir)}"
        )
    return "\n".join(lines)


def failed_checks(errors: list[Any]) -> list[str]:
    return [f"lint {d.code} {d.name} at {d.path}:{d.line}:{d.column}" for d in errors]
