"""README.md tells the truth: its set-up commands are what CI runs, and the
flags it documents exist."""

from __future__ import annotations

import re

from click.testing import CliRunner

from autoport_cst.cli import cli


def fenced_bash(readme: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", readme, re.S)]


def test_ci_runs_the_readme_setup_commands(repo_root):
    readme = (repo_root / "README.md").read_text()
    setup = readme.split("## Set-up", 1)[1].split("## ", 1)[0]
    install, tests = fenced_bash(setup)[:2]
    ci = (repo_root / ".ci" / "run").read_text()
    assert install in ci.splitlines()
    assert tests in ci.splitlines()
    assert ci.index(install) < ci.index(tests)


def test_documented_apply_flags_exist(repo_root):
    readme = (repo_root / "README.md").read_text()
    help_text = CliRunner().invoke(cli, ["apply", "--help"]).output
    for flag in set(re.findall(r"`(--[a-z-]+)", readme)):
        if flag in ("--run-slow",):
            continue
        command = "apply"
        if flag not in help_text:
            raise AssertionError(f"README documents {flag}, which `autoport-cst {command}` does not have")
