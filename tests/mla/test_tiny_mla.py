"""Tiny checkpoints of multi-latent attention models run in transformers by
default: the latent sizes shrink, ``head_dim`` stays the rope dimension
(``qk_rope_head_dim``), every query head keeps its own key and value, and
expert groups divide the tiny expert count (with fewer chosen than there are);
a size given with --set is taken as given."""

from __future__ import annotations

import pytest
import torch
from transformers import DeepseekV3Config

from autoport_cst.validate.tiny import LATENT_DIMENSIONS, build_tiny_checkpoint, shrink_config

from .conftest import MLA_DIMENSIONS


def test_the_default_tiny_deepseek_v3_has_the_conftest_dimensions():
    config = shrink_config(DeepseekV3Config(), "DeepseekV3ForCausalLM", {})
    assert {name: getattr(config, name) for name in MLA_DIMENSIONS} == MLA_DIMENSIONS


def test_a_size_given_is_kept():
    config = shrink_config(DeepseekV3Config(), "DeepseekV3ForCausalLM", {"qk_rope_head_dim": 4, "n_group": 1})
    assert config.head_dim == config.qk_rope_head_dim == 4
    assert config.n_group == 1 and config.kv_lora_rank == LATENT_DIMENSIONS["kv_lora_rank"]


@pytest.mark.parametrize(
    "architecture",
    ["DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "Glm4MoeLiteForCausalLM", "MiniCPM3ForCausalLM"],
)
def test_transformers_runs_the_default_tiny_checkpoint(architecture, tmp_path):
    import transformers

    build_tiny_checkpoint(architecture, tmp_path, seed=0)
    model = getattr(transformers, architecture).from_pretrained(tmp_path)
    with torch.no_grad():
        logits = model(torch.arange(1, 9)[None]).logits
    assert logits.shape[:2] == (1, 8) and torch.isfinite(logits).all()
