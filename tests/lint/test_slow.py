"""Opt-in exhaustive runs (``--run-slow`` or ``AUTOPORT_RUN_SLOW=1``):

- every file of the installed transformers ``models/`` directory (about
  2,600 files) lints without an internal error;
- generated programs (hypothesmith, from the Python grammar) never crash the
  engine and always produce well-formed diagnostics.
"""

from __future__ import annotations

import pytest

from autoport_cst.lint import lint_paths, lint_source

from .conftest import transformers_models_dir

pytestmark = pytest.mark.slow


def test_no_crash_on_the_transformers_models_directory():
    models = transformers_models_dir()
    if models is None:
        pytest.skip("transformers is not installed")
    report = lint_paths([str(models)], use_cache=False)
    assert len(report.results) > 1000
    assert report.errors == []
    syntax = [d for d in report.diagnostics if d.code == "NRN999"]
    assert syntax == [], syntax[:5]
    for d in report.diagnostics:
        assert d.line >= 1 and d.column >= 1 and d.end_line >= d.line


@pytest.mark.filterwarnings("ignore::SyntaxWarning")
def test_no_crash_on_generated_programs():
    hypothesmith = pytest.importorskip("hypothesmith")
    from hypothesis import HealthCheck, given, settings

    @settings(
        max_examples=300,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(hypothesmith.from_grammar() | hypothesmith.from_node())
    def check(source):
        diags = lint_source(source, "gen.py")
        lines = source.splitlines() or [""]
        for d in diags:
            assert d.code.startswith("NRN")
            assert 1 <= d.line <= len(lines) + 1
            assert d.column >= 1

    check()
