"""A non-editable install from this checkout carries the codemod library and
the reference models, and `apply` runs from it without torch."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    [path] = out.glob("autoport_cst-*.whl")
    return path


def test_wheel_contents(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        "autoport_cst/cli/__init__.py",
        "autoport_cst/codemods/__init__.py",
        "autoport_cst/codemods/rename_classes.py",
        "autoport_cst/codemods/swap_norm.py",
        "autoport_cst/reference_models/__init__.py",
        "autoport_cst/reference_models/registry_base.py",
        "autoport_cst/reference_models/llama3/model.py",
        "autoport_cst/reference_models/llama3/config.py",
        "autoport_cst/reference_models/llama3/README.md",
        "autoport_cst/reference_models/llama3/reference.json",
        "autoport_cst/reference_models/llama3/companions/run.py",
    }
    assert expected <= names, sorted(expected - names)
    for codemod in (ROOT / "codemods").glob("*.py"):
        assert f"autoport_cst/codemods/{codemod.name}" in names


def test_installed_wheel_applies_the_example(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with zipfile.ZipFile(wheel) as archive:  # install the wheel's files into the venv
        archive.extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    code = (
        "import sys, autoport_cst\n"
        f"assert autoport_cst.__file__.startswith({site!r}), autoport_cst.__file__\n"
        "from autoport_cst.cli import cli\n"
        "try:\n"
        f"    cli.main(['apply', '--plan', {str(ROOT / 'examples' / 'qwen2.plan.json')!r}, '--out', 'out', '-q'])\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    subprocess.run([str(python), "-c", code], cwd=work, check=True, capture_output=True, text=True)
    assert (work / "out/vllm_neuron/model/qwen2/model.py").is_file()
    assert (work / "out/vllm_neuron/model/registry.py").is_file()


def test_console_script_and_module_entry_point():
    result = subprocess.run(
        [sys.executable, "-m", "autoport_cst", "--version"], capture_output=True, text=True, check=True
    )
    assert "autoport-cst" in result.stdout
