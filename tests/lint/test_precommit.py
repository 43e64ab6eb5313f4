"""The pre-commit hooks, run by the real pre-commit tool.

A snapshot of this checkout (its source files, committed or not) becomes a
temporary hook repository; a second temporary git repository holds one
violating and one clean file. ``pre-commit try-repo`` builds the hook
environment with pip (from PyPI: libcst, click, rich) and runs the hooks:
the lint hook fails on the violating file and every hook passes on the clean
one. The environment has no torch and no transformers.

Two pre-commit invocations; try-repo builds the hook environment in a
throw-away store each time (with pip: tens of seconds each).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import CLEAN, ROOT, VIOLATING

pytestmark = pytest.mark.pre_commit

# what the package build needs (setup.py, pyproject.toml and the package dirs)
SNAPSHOT = (
    "pyproject.toml",
    "setup.py",
    "README.md",
    ".pre-commit-hooks.yaml",
    "src",
    "codemods",
    "reference_models",
)
SKIPPED_PARTS = {"__pycache__", ".autoport-cst-cache", ".pytest_cache", ".hypothesis"}


def _git(cwd: Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@example.invalid",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@example.invalid",
    }
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def _snapshot(target: Path) -> None:
    for name in SNAPSHOT:
        source = ROOT / name
        if source.is_file():
            shutil.copy2(source, target / name)
        elif source.is_dir():
            for path in source.rglob("*"):
                rel = path.relative_to(ROOT)
                if (
                    path.is_dir()
                    or SKIPPED_PARTS & set(rel.parts)
                    or any(part.endswith(".egg-info") for part in rel.parts)
                ):
                    continue
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / rel)


def test_precommit_hooks_fail_on_a_violation_and_pass_on_clean_code(tmp_path):
    if shutil.which("pre-commit") is None or shutil.which("git") is None:
        pytest.skip("pre-commit and git are needed (pip install pre-commit)")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    _snapshot(hooks)
    assert (hooks / ".pre-commit-hooks.yaml").is_file()
    _git(hooks, "init", "-q")
    _git(hooks, "add", "-A")
    _git(hooks, "commit", "-q", "-m", "snapshot")

    project = tmp_path / "project"
    (project / "model").mkdir(parents=True)
    (project / "model" / "bad.py").write_text(VIOLATING.lstrip("\n"))
    (project / "model" / "good.py").write_text(CLEAN.lstrip("\n"))
    _git(project, "init", "-q")
    _git(project, "add", "-A")

    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "PRE_COMMIT_COLOR": "never"}
    env.pop("AUTOPORT_CST_CACHE_DIR", None)

    def try_repo(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["pre-commit", "try-repo", str(hooks), *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )

    failing = try_repo("autoport-cst-lint", "--files", "model/bad.py")
    output = failing.stdout + failing.stderr
    assert failing.returncode == 1, output
    assert "model/bad.py:5:36: NRN001" in output
    assert "model/bad.py:10:28: NRN002" in output

    passing = try_repo("--files", "model/good.py")  # every hook: lint and fix
    output = passing.stdout + passing.stderr
    assert passing.returncode == 0, output
    assert output.count("Passed") == 2, output

    # try-repo builds each environment in a throw-away store, from the core
    # dependencies of the snapshot's pyproject.toml: no torch, no transformers
    import tomllib

    project_table = tomllib.loads((hooks / "pyproject.toml").read_text())["project"]
    core = " ".join(project_table["dependencies"]).lower()
    assert "torch" not in core and "transformers" not in core
