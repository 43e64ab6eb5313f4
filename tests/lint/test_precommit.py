"""The pre-commit hooks, run by the real pre-commit tool.

A snapshot of this checkout (its source files, committed or not) becomes a
temporary hook repository; a second temporary git repository holds one
violating and one clean file. The lint hook runs from the configuration
docs/lint.md shows, its ``repo:`` and ``rev:`` filled with the snapshot and
its commit, and fails on the violating file; ``pre-commit try-repo`` runs
every hook on the clean one, and they pass. pre-commit builds the hook
environment with pip (from PyPI: libcst, click, rich): no torch and no
transformers.

Two pre-commit invocations, each building the hook environment in a
throw-away store (with pip: tens of seconds each).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import CLEAN, ROOT, VIOLATING

# the pre-commit of the running environment, whether or not its bin/ is on PATH
PRE_COMMIT = [sys.executable, "-m", "pre_commit"]

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


DOC_REPO = "<URL or path of your copy of autoport-cst>"
DOC_REV = "<full commit SHA of that copy>"


def documented_config() -> str:
    """The configuration docs/lint.md shows for this repository's hooks."""
    section = (ROOT / "docs" / "lint.md").read_text().split("## pre-commit\n", 1)[1].split("\n## ", 1)[0]
    [config] = [block for block in re.findall(r"```yaml\n(.*?)```", section, re.S) if DOC_REPO in block]
    assert DOC_REV in config
    return config


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
    if importlib.util.find_spec("pre_commit") is None or shutil.which("git") is None:
        pytest.skip("pre-commit and git are needed (pip install pre-commit)")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    _snapshot(hooks)
    assert (hooks / ".pre-commit-hooks.yaml").is_file()
    _git(hooks, "init", "-q")
    _git(hooks, "add", "-A")
    _git(hooks, "commit", "-q", "-m", "snapshot")
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=hooks, check=True, capture_output=True, text=True
    ).stdout.strip()

    project = tmp_path / "project"
    (project / "vllm_neuron" / "model").mkdir(parents=True)
    (project / "vllm_neuron" / "model" / "bad.py").write_text(VIOLATING.lstrip("\n"))
    (project / "vllm_neuron" / "model" / "good.py").write_text(CLEAN.lstrip("\n"))
    (project / ".pre-commit-config.yaml").write_text(
        documented_config().replace(DOC_REPO, str(hooks)).replace(DOC_REV, commit)
    )
    _git(project, "init", "-q")
    _git(project, "add", "-A")

    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "PRE_COMMIT_COLOR": "never"}
    env.pop("AUTOPORT_CST_CACHE_DIR", None)

    def pre_commit(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*PRE_COMMIT, *args], cwd=project, env=env, capture_output=True, text=True, timeout=900
        )

    failing = pre_commit("run", "--files", "vllm_neuron/model/bad.py")  # the documented configuration
    output = failing.stdout + failing.stderr
    assert failing.returncode == 1, output
    assert "vllm_neuron/model/bad.py:5:36: NRN001" in output
    assert "vllm_neuron/model/bad.py:10:28: NRN002" in output

    passing = pre_commit("try-repo", str(hooks), "--files", "vllm_neuron/model/good.py")  # lint and fix
    output = passing.stdout + passing.stderr
    assert passing.returncode == 0, output
    assert output.count("Passed") == 2, output

    # try-repo builds each environment in a throw-away store, from the core
    # dependencies of the snapshot's pyproject.toml: no torch, no transformers
    import tomllib

    project_table = tomllib.loads((hooks / "pyproject.toml").read_text())["project"]
    core = " ".join(project_table["dependencies"]).lower()
    assert "torch" not in core and "transformers" not in core
