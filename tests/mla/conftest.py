"""A tiny DeepSeek-V3 checkpoint whose multi-latent attention is small enough
to validate in seconds: 2 groups of 2 experts (1 group chosen per token, so
group-limited routing matters), latent 32, rope 8, nope 16, value 16, query
LoRA 48. ``head_dim`` is the rope dimension and every head its own KV head,
as DeepseekV3Config derives them: what ``autoport-cst tiny`` builds by
default for a multi-latent attention config (validate/tiny.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "reference_models" / "deepseek_v3"

MLA_DIMENSIONS = {
    "n_group": 2,
    "topk_group": 1,
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "head_dim": 8,
    "v_head_dim": 16,
    "num_key_value_heads": 4,
}


@pytest.fixture(scope="session")
def tiny_deepseek_v3(tmp_path_factory) -> Path:
    from autoport_cst.validate import build_tiny_checkpoint

    directory = tmp_path_factory.mktemp("tiny-deepseek-v3")
    build_tiny_checkpoint("DeepseekV3ForCausalLM", directory, seed=0)  # the MLA_DIMENSIONS by default
    return directory
