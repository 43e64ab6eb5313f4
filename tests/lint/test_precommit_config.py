"""The pre-commit configurations that README.md and docs/lint.md show work:
each is a valid ``.pre-commit-config.yaml`` (a ``repos:`` list), names only
hooks that ``.pre-commit-hooks.yaml`` defines, a local hook runs what the
published hook of its id runs, and the local hook, run by the real
pre-commit from ``PATH`` (no hook environment, no network), fails on a
violating file and is silent on a clean one."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import CLEAN, ROOT, VIOLATING

# the pre-commit of the running environment, whether or not its bin/ is on PATH
PRE_COMMIT = [sys.executable, "-m", "pre_commit"]

PUBLISHED = {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
PLACEHOLDERS = {"<URL or path of your copy of autoport-cst>", "<full commit SHA of that copy>"}


def shown_configs() -> list[tuple[str, str]]:
    """(where, yaml text) of every YAML block of the README's lint section and
    of docs/lint.md's pre-commit section."""
    readme = (ROOT / "README.md").read_text().split("### 5. Lint", 1)[1].split("\n### ", 1)[0]
    docs = (ROOT / "docs" / "lint.md").read_text().split("## pre-commit\n", 1)[1].split("\n## ", 1)[0]
    found = []
    for where, text in (("README.md", readme), ("docs/lint.md", docs)):
        blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
        assert blocks, f"{where} shows no pre-commit configuration"
        found += [(where, block) for block in blocks]
    return found


CONFIGS = shown_configs()


@pytest.mark.parametrize("where, text", CONFIGS, ids=[f"{w}-{i}" for i, (w, _) in enumerate(CONFIGS)])
def test_shown_config_is_valid_and_names_published_hooks(where, text, tmp_path):
    config = yaml.safe_load(text)
    assert isinstance(config, dict) and isinstance(config.get("repos"), list), f"{where}: no `repos:` list"
    for repo in config["repos"]:
        for hook in repo["hooks"]:
            assert hook["id"] in PUBLISHED, f"{where}: hook {hook['id']!r} is not in .pre-commit-hooks.yaml"
            if repo["repo"] == "local":
                published = PUBLISHED[hook["id"]]
                assert hook["entry"] == published["entry"], where
                assert hook["types_or"] == published["types_or"], where
        if repo["repo"] != "local":
            assert {repo["repo"], repo["rev"]} <= PLACEHOLDERS, f"{where}: {repo['repo']} @ {repo['rev']}"
    if importlib.util.find_spec("pre_commit") is None:
        pytest.skip("pre-commit is needed (pip install -e '.[dev]')")
    filled = text.replace("<URL or path of your copy of autoport-cst>", "/path/to/autoport-cst")
    filled = filled.replace("<full commit SHA of that copy>", "0123456789abcdef" * 2 + "01234567")
    (tmp_path / "config.yaml").write_text(filled)
    checked = subprocess.run(
        [*PRE_COMMIT, "validate-config", str(tmp_path / "config.yaml")], capture_output=True, text=True
    )
    assert checked.returncode == 0, f"{where}:\n{checked.stdout}{checked.stderr}"


LOCAL = sorted({text for _, text in CONFIGS if "repo: local" in text})


@pytest.mark.parametrize("text", LOCAL)
def test_shown_local_hook_runs_with_the_real_pre_commit(text, tmp_path):
    if importlib.util.find_spec("pre_commit") is None or shutil.which("git") is None:
        pytest.skip("pre-commit and git are needed (pip install -e '.[dev]')")
    project = tmp_path / "project"
    model = project / "vllm_neuron" / "model"
    model.mkdir(parents=True)
    (model / "bad.py").write_text(VIOLATING.lstrip("\n"))
    (model / "good.py").write_text(CLEAN.lstrip("\n"))
    (project / ".pre-commit-config.yaml").write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "-A"], cwd=project, check=True)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        "PRE_COMMIT_COLOR": "never",
    }
    env.pop("AUTOPORT_CST_CACHE_DIR", None)
    result = subprocess.run(
        [*PRE_COMMIT, "run", "--all-files"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "vllm_neuron/model/bad.py:5:36: NRN001" in output, output
    assert "good.py" not in output, output
