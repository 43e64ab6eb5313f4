"""Every rule's inline VALID / INVALID examples, run as tests (one test per
example), plus the rule declarations themselves."""

from __future__ import annotations

import re

import pytest

from autoport_cst.lint import lint_source
from autoport_cst.lint.rules import registry

RULES = registry()


def _cases(kind: str):
    for code, rule in RULES.items():
        examples = rule.valid_examples() if kind == "valid" else rule.INVALID
        for index, example in enumerate(examples):
            title = example.title or f"{kind}{index}"
            yield pytest.param(code, example, id=f"{code}-{kind}{index}-{title.replace(' ', '_')}")


def _lint(code: str, example):
    options = {code: dict(example.options)} if example.options else None
    return lint_source(example.source, example.path, options=options)


@pytest.mark.parametrize("code,example", list(_cases("valid")))
def test_valid_example_reports_nothing(code, example):
    found = [d for d in _lint(code, example) if d.code == code]
    assert found == [], "\n".join(f"{d.line}:{d.column} {d.message}" for d in found)


@pytest.mark.parametrize("code,example", list(_cases("invalid")))
def test_invalid_example_reports_exactly_there(code, example):
    found = [d for d in _lint(code, example) if d.code == code]
    assert tuple((d.line, d.column) for d in found) == example.at, "\n".join(
        f"{d.line}:{d.column} {d.message}" for d in found
    )
    for d in found:
        assert d.severity == example.severity
        if example.message is not None:
            assert example.message in d.message
        if example.fixable is not None:
            assert (d.fix is not None) == example.fixable, d
        lines = example.source.splitlines()
        assert 1 <= d.line <= max(len(lines), 1)
        assert d.end_line >= d.line


@pytest.mark.parametrize("code", list(RULES))
def test_rule_declaration(code):
    rule = RULES[code]
    assert re.fullmatch(r"NRN\d{3}", rule.CODE)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", rule.NAME), rule.NAME
    doc = rule.documentation()
    assert "Why" in doc or rule.PSEUDO, "the docstring says why it breaks on hardware"
    assert "Example" in doc
    assert rule.VALID and rule.INVALID, "every rule has inline examples"
    assert rule.SCOPE in ("file", "forward", "init")
    if rule.FIX is not None:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.FIX)


def test_rule_set_is_stable():
    """Codes and names are a public contract (configs and suppressions use
    them): changing one is a breaking change."""
    assert {c: r.NAME for c, r in RULES.items()} == {
        "NRN001": "no-tensor-compute-in-init",
        "NRN002": "no-device-move-in-forward",
        "NRN003": "no-item-in-forward",
        "NRN004": "decode-bias-2d",
        "NRN005": "router-float32",
        "NRN006": "config-default-shadows-derivation",
        "NRN007": "config-rope-theta-top-level",
        "NRN008": "config-field-alias",
        "NRN009": "fp8-segmented-guard",
        "NRN010": "lm-head-dp-sampling",
        "NRN900": "invalid-suppression",
        "NRN901": "unused-suppression",
        "NRN999": "syntax-error",
    }


def test_one_rule_per_module():
    modules = {rule.__module__ for rule in RULES.values()}
    assert len(modules) == len(RULES)


def test_fix_codemods_exist():
    """The codemods the rules name as fixes are in the codemod library, with
    the declared safety."""
    from autoport_cst.transform.library import library

    codemods = library()
    for rule in RULES.values():
        if rule.FIX is None:
            continue
        assert rule.FIX in codemods, f"{rule.CODE}: no codemod {rule.FIX}"
        assert codemods[rule.FIX].SAFE == rule.FIX_SAFE, rule.CODE


def test_documentation_lists_every_rule():
    from .conftest import ROOT

    doc = (ROOT / "docs" / "lint.md").read_text()
    for code, rule in RULES.items():
        assert code in doc and rule.NAME in doc, code
        for option in rule.OPTIONS:
            assert option in doc, (code, option)
