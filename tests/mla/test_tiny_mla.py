"""A tiny DeepSeek-V3 keeps the head_dim it is given: DeepseekV3Config's
head_dim is its rope dimension (qk_rope_head_dim), which the shrinker's
hidden / heads would otherwise replace (transformers then cannot run it)."""

from __future__ import annotations

from transformers import DeepseekV3Config

from autoport_cst.validate.tiny import shrink_config


def test_a_head_dim_given_is_kept():
    config = shrink_config(
        DeepseekV3Config(), "DeepseekV3ForCausalLM", {"qk_rope_head_dim": 8, "head_dim": 8}
    )
    assert config.head_dim == config.qk_rope_head_dim == 8


def test_without_one_the_head_dim_is_hidden_over_heads():
    config = shrink_config(DeepseekV3Config(), "DeepseekV3ForCausalLM", {})
    assert config.head_dim == 64 // 4
