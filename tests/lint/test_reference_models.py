"""Every reference model, and every port that `apply` writes from the
bundled example plans, lints clean (references under this repository's
lint configuration, pyproject.toml)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.lint import lint_paths, lint_source, load_settings

from .conftest import ROOT

REFERENCES = sorted(
    p for p in (ROOT / "reference_models").iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
)
PLANS = sorted((ROOT / "examples").glob("*.plan.json"))


@pytest.mark.parametrize("reference", REFERENCES, ids=lambda p: p.name)
def test_reference_model_is_clean(reference):
    files = sorted(reference.rglob("*.py"))
    assert files
    for path in files:
        diags = lint_source(path.read_text(), str(path), settings=load_settings(str(path)))
        assert diags == [], "\n".join(f"{d.path}:{d.line}:{d.column}: {d.code} {d.message}" for d in diags)


def test_reference_models_directory_is_clean_from_the_cli():
    result = CliRunner().invoke(
        __import__("autoport_cst.cli", fromlist=["cli"]).cli,
        ["lint", "--no-cache", str(ROOT / "reference_models")],
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.name)
def test_ports_written_by_apply_are_clean(plan, tmp_path):
    from autoport_cst.cli import cli

    result = CliRunner().invoke(cli, ["apply", "--plan", str(plan), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    files = sorted(Path(tmp_path).rglob("*.py"))
    assert files
    report = lint_paths([str(tmp_path)], use_cache=False)
    assert report.errors == []
    assert report.diagnostics == [], "\n".join(
        f"{d.path}:{d.line}:{d.column}: {d.code} {d.message}" for d in report.diagnostics
    )
