"""The install gets the CPU build of torch on any Linux machine, never CUDA.

PyPI's Linux torch is the CUDA build. pyproject.toml pins, on Linux, a local
version ``X+cpu``: PyPI serves no local versions, so from PyPI the pin cannot
resolve at all, and from PyTorch's CPU index (which README.md's install
command names) or a local copy of the wheel it resolves to the CPU build.
These tests keep pyproject.toml, README.md and .ci/run in agreement, check
the installed torch, and ask pip which torch the pin resolves to from the
indexes this machine's pip sees."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.version import Version

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
LINUX = [
    {"sys_platform": "linux", "platform_machine": machine, "python_version": "3.11"}
    for machine in ("x86_64", "aarch64")
]
OTHERS = [
    {"sys_platform": "darwin", "platform_machine": "arm64", "python_version": "3.11"},
    {"sys_platform": "win32", "platform_machine": "AMD64", "python_version": "3.11"},
]


def torch_requirements(repo_root) -> list[Requirement]:
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    assert not any(Requirement(r).name == "torch" for r in project["dependencies"]), "torch in the core"
    validate = [Requirement(r) for r in project["optional-dependencies"]["validate"]]
    return [r for r in validate if r.name == "torch"]


def applicable(requirements: list[Requirement], environment: dict) -> Requirement:
    [requirement] = [
        r for r in requirements if r.marker is None or Marker(str(r.marker)).evaluate(environment)
    ]
    return requirement


def pinned_version(requirement: Requirement) -> Version:
    [specifier] = list(requirement.specifier)
    assert specifier.operator == "==" and "*" not in specifier.version, requirement
    return Version(specifier.version)


def test_the_linux_torch_requirement_admits_only_the_cpu_build(repo_root):
    requirements = torch_requirements(repo_root)
    for environment in LINUX:
        requirement = applicable(requirements, environment)
        version = pinned_version(requirement)
        assert version.local == "cpu", f"{requirement}: not pinned to a +cpu build on {environment}"
        public = version.public
        for cuda in (public, f"{public}+cu126", f"{public}+cu128", f"{public}+cu130"):
            assert not requirement.specifier.contains(cuda), f"{requirement} admits {cuda}"
        assert requirement.specifier.contains(str(version))
    for environment in OTHERS:  # PyPI's torch is the CPU build there
        assert pinned_version(applicable(requirements, environment)).local is None


def install_line(text: str) -> str:
    [line] = [line for line in text.splitlines() if line.startswith("pip install torch==")]
    return line


def test_readme_and_ci_install_the_pinned_cpu_build_first(repo_root):
    pin = pinned_version(applicable(torch_requirements(repo_root), LINUX[0]))
    readme = install_line((repo_root / "README.md").read_text())
    assert install_line((repo_root / ".ci" / "run").read_text()) == readme
    first, rest = readme.split(" && ", 1)
    assert first.split() == ["pip", "install", f"torch=={pin}", "--index-url", CPU_INDEX, "--no-deps"]
    assert rest.startswith('pip install -e ".[validate,dev]"'), rest


def test_the_installed_torch_is_the_pinned_cpu_build(repo_root):
    try:
        installed = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torch is not installed (core install)")
    if not sys.platform.startswith("linux"):
        pytest.skip("the +cpu pin is Linux's")
    pin = pinned_version(applicable(torch_requirements(repo_root), LINUX[0]))
    assert Version(installed) == pin, f"torch {installed} is installed, pyproject.toml pins {pin}"
    requires = importlib.metadata.requires("torch") or []
    assert not [r for r in requires if re.match(r"(nvidia-|triton)", r)], "a CUDA build's dependencies"


def test_pip_never_resolves_the_pin_to_a_cuda_build(repo_root, tmp_path):
    """Ask this machine's pip (its configured indexes and wheel directories,
    PyPI among them) what the Linux pin resolves to: the CPU wheel, or
    nothing at all; never a CUDA build."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the +cpu pin is Linux's")
    requirement = applicable(torch_requirements(repo_root), LINUX[0])
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps"]
    result = subprocess.run(
        [*command, "--quiet", "--report", str(report), str(requirement).split(";")[0]],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        assert "No matching distribution found" in result.stderr, result.stdout + result.stderr
        return
    [chosen] = json.loads(report.read_text())["install"]
    url = chosen["download_info"]["url"]
    assert Version(chosen["metadata"]["version"]).local == "cpu", url
    assert not [r for r in chosen["metadata"].get("requires_dist", []) if r.startswith("nvidia-")], url
