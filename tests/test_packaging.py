"""A non-editable install from this checkout carries the codemod library and
the reference models, and `apply` runs from it without torch.

The wheel is built and installed offline, from whatever environment runs the
suite (the one the README's set-up command made, or any fresh venv with
``pip install -e ".[dev]"``): the build backend comes from that environment
(the ``dev`` extra installs a setuptools that satisfies ``build-system``), and
the test venv sees that environment's packages behind its own, so the wheel's
dependencies (libcst, click, rich) are found without an index."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run a command; on failure, the assertion shows what it printed."""
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, (
        f"exit {result.returncode}: {' '.join(map(str, command))}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation"]
    run([*pip_wheel, "--no-index", "-q", "-w", str(out)])
    [path] = out.glob("autoport_cst-*.whl")
    return path


def running_site_packages() -> list[str]:
    """The site-packages directories of the interpreter running the suite, in
    import order (a venv's own, then its base's when it includes them)."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[Path, str]:
    """A new venv with the wheel's files in its site-packages (a pure wheel
    installs as its archive laid out there); the running environment's
    packages are on its path behind its own (a ``.pth`` file), so the wheel's
    dependencies resolve without a network. Returns (python, site-packages)."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    ).stdout.strip()
    Path(site, "_running_environment.pth").write_text("\n".join(running_site_packages()) + "\n")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return python, site


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
        "autoport_cst/apply/companion_templates.py",
    }
    assert expected <= names, sorted(expected - names)
    for codemod in (ROOT / "codemods").glob("*.py"):
        assert f"autoport_cst/codemods/{codemod.name}" in names


def test_installed_wheel_applies_the_example(installed, tmp_path):
    python, site = installed
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
    run([str(python), "-c", code], cwd=tmp_path)
    assert (tmp_path / "out/vllm_neuron/model/qwen2/model.py").is_file()
    assert (tmp_path / "out/vllm_neuron/model/registry.py").is_file()


def test_a_failing_command_shows_its_output():
    with pytest.raises(AssertionError) as failure:
        run([sys.executable, "-c", "import sys; print('to stdout'); sys.exit('to stderr')"])
    assert "to stdout" in str(failure.value) and "to stderr" in str(failure.value)


def test_console_script_and_module_entry_point():
    result = run([sys.executable, "-m", "autoport_cst", "--version"])
    assert "autoport-cst" in result.stdout
