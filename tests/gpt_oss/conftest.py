"""Fixtures of the gpt_oss tests: tiny random GptOssForCausalLM checkpoints
(built once per session and seed; nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPT_OSS = ROOT / "reference_models" / "gpt_oss"


@pytest.fixture(scope="session")
def tiny_gpt_oss_seed(tmp_path_factory):
    """``tiny_gpt_oss_seed(seed)`` -> a tiny GptOssForCausalLM checkpoint."""
    from autoport_cst.validate import build_tiny_checkpoint

    built: dict[int, Path] = {}

    def make(seed: int) -> Path:
        if seed not in built:
            directory = tmp_path_factory.mktemp(f"tiny-gpt-oss-seed{seed}")
            build_tiny_checkpoint("GptOssForCausalLM", directory, seed=seed)
            built[seed] = directory
        return built[seed]

    return make


@pytest.fixture(scope="session")
def tiny_gpt_oss(tiny_gpt_oss_seed) -> Path:
    return tiny_gpt_oss_seed(0)
