"""The quality gate: the repository's own pre-commit hooks are valid and run
the gate's commands with the tools the dev extra pins; the gate itself (ruff,
ruff format, mypy src, our linter on the reference packages) passes (slow:
mypy reads the whole package and torch's stubs)."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement

GATE = {
    "ruff-check": "ruff check --force-exclude",
    "ruff-format": "ruff format --force-exclude",
    "mypy": "mypy src",
    "autoport-cst-lint-references": "autoport-cst lint reference_models",
}


def _hooks(repo_root) -> dict[str, dict]:
    config = yaml.safe_load((repo_root / ".pre-commit-config.yaml").read_text())
    return {hook["id"]: {**hook, "repo": repo["repo"]} for repo in config["repos"] for hook in repo["hooks"]}


def test_precommit_hooks_run_the_gate_locally(repo_root):
    hooks = _hooks(repo_root)
    assert {name: hook["entry"] for name, hook in hooks.items()} == GATE
    for name, hook in hooks.items():
        # the tools of the developer's environment: no hook environment, no network
        assert hook["repo"] == "local" and hook["language"] == "system", name
    for whole_tree in ("mypy", "autoport-cst-lint-references"):
        assert hooks[whole_tree]["pass_filenames"] is False


def test_precommit_config_is_valid(repo_root):
    if shutil.which("pre-commit") is None:
        pytest.skip("pre-commit is needed (pip install -e '.[dev]')")
    checked = subprocess.run(
        ["pre-commit", "validate-config", ".pre-commit-config.yaml"],
        cwd=repo_root,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dev_extra_pins_the_gate_tools(repo_root):
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    pins = {r.name: r for r in map(Requirement, project["optional-dependencies"]["dev"])}
    for tool in ("ruff", "mypy"):
        (spec,) = pins[tool].specifier
        assert spec.operator == "==", f"{tool} is not pinned"
        installed = importlib.metadata.version(tool)
        if installed != spec.version:
            pytest.skip(f"{tool} {installed} is installed, the gate pins {spec.version}")


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "ruff", "check", "."],
        [sys.executable, "-m", "ruff", "format", "--check", "."],
        [sys.executable, "-m", "mypy", "src"],
        [sys.executable, "-m", "autoport_cst", "lint", "reference_models"],
    ],
    ids=["ruff-check", "ruff-format", "mypy", "lint-references"],
)
def test_the_gate_passes(repo_root, command):
    run = subprocess.run(command, cwd=repo_root, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
