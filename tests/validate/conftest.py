"""Fixtures of the validation tests: tiny checkpoints (built once per
session), the llama3 reference package, and copies of it broken on purpose."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.edited_copies import edited_copy

ROOT = Path(__file__).resolve().parents[2]

LLAMA3 = ROOT / "reference_models" / "llama3"


@pytest.fixture(scope="session")
def llama3_dir() -> Path:
    return LLAMA3


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    directory = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_checkpoint("LlamaForCausalLM", directory, seed=0)
    return directory


@pytest.fixture
def broken_port(tmp_path: Path):
    """Copy the llama3 reference to tmp_path and apply one text edit."""

    def make(old: str, new: str, name: str = "broken") -> Path:
        return edited_copy(LLAMA3, tmp_path / name, [(old, new)])

    return make


@pytest.fixture(scope="session")
def checkpoint_editor():
    """``edit(source, target, change)``: copy a checkpoint and rewrite its
    safetensors through ``change(state)``."""
    return _edit_checkpoint


def _edit_checkpoint(source: Path, target: Path, edit) -> Path:
    """Copy a checkpoint and rewrite its safetensors through ``edit(state)``."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    path = target / "model.safetensors"
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path), metadata={"format": "pt"})
    return target
