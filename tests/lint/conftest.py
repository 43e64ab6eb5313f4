"""Fixtures of the lint tests. The ``slow`` marker is handled by
tests/conftest.py (``--run-slow`` / ``AUTOPORT_RUN_SLOW=1``); ``pre_commit``
marks the test that builds a pre-commit hook environment from PyPI (it runs
in the default suite; deselect with ``-m "not pre_commit"``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_config_caches():
    from autoport_cst.lint import config

    config.clear_caches()
    yield
    config.clear_caches()


@pytest.fixture
def write(tmp_path):
    """write("a/b.py", code) -> Path, with the code dedented."""

    def _write(relative: str, code: str) -> Path:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(code).lstrip("\n"))
        return path

    return _write


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run from a temporary directory, with the cache there too."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOPORT_CST_CACHE_DIR", raising=False)
    return tmp_path


def transformers_models_dir() -> Path | None:
    """The installed transformers/models directory, found without importing
    transformers."""
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "models"
    return path if path.is_dir() else None


VIOLATING = """
class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000):
        super().__init__()
        self.dim = dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        freqs = torch.outer(position_ids.float(), self.inv_freq)
        return freqs.cos().to(x.device), freqs.sin()
"""

CLEAN = """
class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)
"""


@pytest.fixture
def violating_source() -> str:
    return VIOLATING.lstrip("\n")


@pytest.fixture
def clean_source() -> str:
    return CLEAN.lstrip("\n")
