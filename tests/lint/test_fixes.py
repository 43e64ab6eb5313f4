"""The fix loop (with stand-in codemods, to pin its behaviour) and the real
fixes (the codemod library) on the rules' examples."""

from __future__ import annotations

import pytest

from autoport_cst.errors import InputError, Position, PreconditionError
from autoport_cst.lint import Diagnostic, Fix, fix_source, lint_source
from autoport_cst.lint.rules import registry


def finding(code: str, codemod: str = "stand-in") -> Diagnostic:
    return Diagnostic(path="m.py", line=1, column=1, code="NRN001", name="x", message="m", fix=Fix(codemod))


class _Dummy:
    pass


@pytest.fixture
def stand_in(monkeypatch):
    """Replace run_on_source by a function of the source text."""
    import autoport_cst.transform.base as base

    calls = []

    def install(transform):
        def fake(codemod, source, path="model.py", role="model", port=None):
            calls.append(source)
            return transform(source), []

        monkeypatch.setattr(base, "run_on_source", fake)
        return calls

    return install


def lint_bad(text: str) -> list[Diagnostic]:
    """One fixable finding per line containing BAD."""
    return [finding(text) for line in text.splitlines() if "BAD" in line]


def test_fixes_are_applied_until_nothing_changes(stand_in):
    calls = stand_in(lambda s: s.replace("BAD", "ok", 1))
    result = fix_source("a = BAD\nb = BAD\nc = BAD\n", factory=lambda c: _Dummy, lint=lint_bad)
    assert result.fixed == "a = ok\nb = ok\nc = ok\n"
    assert result.applied == ["stand-in"] * 3
    assert result.diagnostics == [] and result.fix_problems == []
    assert result.fixed_count == 3
    assert len(calls) == 3


def test_a_fix_that_breaks_parsing_is_reverted(stand_in):
    stand_in(lambda s: s + "def (:\n")
    result = fix_source("a = BAD\n", factory=lambda c: _Dummy, lint=lint_bad)
    assert result.fixed == "a = BAD\n" and not result.changed
    assert [p.kind for p in result.fix_problems] == ["reverted"]
    assert "does not parse" in result.fix_problems[0].message
    assert result.diagnostics[0].fix is None
    assert "reverted" in result.diagnostics[0].note


def test_a_precondition_error_leaves_the_finding_unfixable(stand_in):
    def refuse(source):
        raise PreconditionError("no rotary embedding class", Position("m.py"))

    stand_in(refuse)
    result = fix_source("a = BAD\n", factory=lambda c: _Dummy, lint=lint_bad)
    assert [p.kind for p in result.fix_problems] == ["not-applicable"]
    assert result.diagnostics[0].note == "stand-in does not apply here: no rotary embedding class"


def test_a_missing_codemod_is_reported(stand_in):
    stand_in(lambda s: s)

    def factory(codemod_id):
        raise InputError(f"unknown codemod {codemod_id!r}")

    result = fix_source("a = BAD\n", factory=factory, lint=lint_bad)
    assert [p.kind for p in result.fix_problems] == ["failed"]
    assert "not available" in result.fix_problems[0].message


def test_a_fix_that_never_converges_is_capped(stand_in):
    calls = stand_in(lambda s: s + "x = 1\n")
    result = fix_source("a = BAD\n", factory=lambda c: _Dummy, lint=lint_bad, max_iterations=4)
    assert len(calls) == 4
    assert [p.kind for p in result.fix_problems] == ["not-converged"]
    assert result.fixed == "a = BAD\n" + "x = 1\n" * 4


def test_a_fix_that_changes_nothing_stops_the_loop(stand_in):
    calls = stand_in(lambda s: s)
    result = fix_source("a = BAD\n", factory=lambda c: _Dummy, lint=lint_bad)
    assert len(calls) == 1
    assert [p.kind for p in result.fix_problems] == ["no-change"]


def test_unsafe_fixes_need_the_flag(stand_in):
    calls = stand_in(lambda s: s.replace("BAD", "ok"))

    def lint(text):
        return [
            Diagnostic("m.py", 1, 1, "NRN005", "x", "m", fix=Fix("f32", safe=False))
            for line in text.splitlines()
            if "BAD" in line
        ]

    assert fix_source("BAD\n", factory=lambda c: _Dummy, lint=lint).fixed == "BAD\n"
    assert calls == []
    assert fix_source("BAD\n", factory=lambda c: _Dummy, lint=lint, unsafe=True).fixed == "ok\n"


# -- the real codemods -------------------------------------------------------------------


def _fixable_examples():
    for code, rule in registry().items():
        for index, example in enumerate(rule.INVALID):
            if example.fixable:
                yield pytest.param(code, example, id=f"{code}-{index}")


@pytest.mark.parametrize("code,example", list(_fixable_examples()))
def test_after_fix_the_rule_reports_nothing_and_fixing_is_idempotent(code, example):
    first = fix_source(example.source, example.path, unsafe=True)
    assert first.changed, first.fix_problems
    assert first.fix_problems == []
    assert [d for d in first.diagnostics if d.code == code] == []
    assert [d.code for d in lint_source(first.fixed)] == [d.code for d in first.diagnostics]
    compile(first.fixed, "fixed.py", "exec")
    second = fix_source(first.fixed, example.path, unsafe=True)
    assert second.fixed == first.fixed and not second.changed


def test_lazy_rope_does_not_apply_to_a_non_rope_tensor_attribute():
    code = (
        "class Qwen3MoeAttention(nn.Module):\n"
        "    def __init__(self, config):\n"
        "        super().__init__()\n"
        "        self.k_scale = torch.ones(1, 1)\n"
    )
    diags = lint_source(code)
    assert [(d.code, d.fix) for d in diags] == [("NRN001", None)], "no fix offered: not RoPE"
    assert fix_source(code).fixed == code
