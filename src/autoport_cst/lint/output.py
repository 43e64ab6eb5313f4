"""Output formats: text, json, sarif, github, and statistics."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import PurePath

from autoport_cst import __version__
from autoport_cst.lint.diagnostics import WARNING, Diagnostic, FileResult

FORMATS = ("text", "json", "sarif", "github")
JSON_VERSION = 1


def fixable(diag: Diagnostic, unsafe: bool) -> bool:
    return diag.fix is not None and (diag.fix.safe or unsafe)


def text(diagnostics: Iterable[Diagnostic], unsafe: bool = False) -> str:
    lines = []
    for d in diagnostics:
        marker = " [*]" if fixable(d, unsafe) else ""
        level = "warning: " if d.severity == WARNING else ""
        lines.append(f"{d.path}:{d.line}:{d.column}: {d.code}{marker} {level}{d.message}")
    return "\n".join(lines) + ("\n" if lines else "")


def as_json(results: list[FileResult], diagnostics: list[Diagnostic], unsafe: bool = False) -> str:
    problems = [{"path": r.path, **p.to_dict()} for r in results for p in r.fix_problems]
    errors = [{"path": r.path, "message": r.error} for r in results if r.error]
    data = {
        "version": JSON_VERSION,
        "tool": {"name": "autoport-cst", "version": __version__},
        "summary": {
            "files": len(results),
            "errors": sum(1 for d in diagnostics if d.severity != WARNING),
            "warnings": sum(1 for d in diagnostics if d.severity == WARNING),
            "fixable": sum(1 for d in diagnostics if fixable(d, unsafe)),
            "fixed": sum(r.fixed_count for r in results),
            "changed_files": sum(1 for r in results if r.changed),
        },
        "diagnostics": [d.to_dict() for d in diagnostics],
        "fix_problems": problems,
        "internal_errors": errors,
    }
    return json.dumps(data, indent=2) + "\n"


def sarif(diagnostics: list[Diagnostic]) -> str:
    from autoport_cst.lint.rules import registry

    rules = registry()
    codes = list(rules)
    driver_rules = []
    for code, rule in rules.items():
        driver_rules.append(
            {
                "id": code,
                "name": rule.NAME,
                "shortDescription": {"text": rule.summary()},
                "fullDescription": {"text": rule.documentation()},
                "help": {"text": rule.documentation()},
                "defaultConfiguration": {"level": "error"},
            }
        )
    results = []
    for d in diagnostics:
        result = {
            "ruleId": d.code,
            "ruleIndex": codes.index(d.code) if d.code in codes else -1,
            "level": "warning" if d.severity == WARNING else "error",
            "message": {"text": d.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": PurePath(d.path).as_posix()},
                        "region": {
                            "startLine": d.line,
                            "startColumn": d.column,
                            "endLine": max(d.end_line, d.line),
                            "endColumn": max(d.end_column, 1),
                        },
                    }
                }
            ],
        }
        if d.fix is not None:
            result["properties"] = {"fix": d.fix.codemod, "safeFix": d.fix.safe}
        results.append(result)
    data = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "autoport-cst", "version": __version__, "rules": driver_rules}},
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }
    return json.dumps(data, indent=2) + "\n"


def _escape_data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(value: str) -> str:
    return _escape_data(value).replace(":", "%3A").replace(",", "%2C")


def github(diagnostics: Iterable[Diagnostic]) -> str:
    lines = []
    for d in diagnostics:
        kind = "warning" if d.severity == WARNING else "error"
        props = ",".join(
            [
                f"file={_escape_property(d.path)}",
                f"line={d.line}",
                f"col={d.column}",
                f"endLine={max(d.end_line, d.line)}",
                f"endColumn={max(d.end_column, 1)}",
                f"title={_escape_property(f'{d.code} {d.name}')}",
            ]
        )
        lines.append(f"::{kind} {props}::{_escape_data(d.message)}")
    return "\n".join(lines) + ("\n" if lines else "")


def statistics(diagnostics: list[Diagnostic], fmt: str, unsafe: bool = False) -> str:
    counts = Counter(d.code for d in diagnostics)
    names = {d.code: d.name for d in diagnostics}
    can_fix = {d.code for d in diagnostics if fixable(d, unsafe)}
    rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if fmt == "json":
        return (
            json.dumps(
                [
                    {"code": code, "name": names[code], "count": count, "fixable": code in can_fix}
                    for code, count in rows
                ],
                indent=2,
            )
            + "\n"
        )
    lines = [
        f"{count:>6}  {code}  {'[*]' if code in can_fix else '   '}  {names[code]}" for code, count in rows
    ]
    return "\n".join(lines) + ("\n" if lines else "")


def render(fmt: str, results: list[FileResult], diagnostics: list[Diagnostic], unsafe: bool = False) -> str:
    if fmt == "text":
        return text(diagnostics, unsafe)
    if fmt == "json":
        return as_json(results, diagnostics, unsafe)
    if fmt == "sarif":
        return sarif(diagnostics)
    if fmt == "github":
        return github(diagnostics)
    raise ValueError(f"unknown output format {fmt!r}")
