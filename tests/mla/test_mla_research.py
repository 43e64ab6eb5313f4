"""Research recognizes multi-latent attention from what the code computes:
the latent projections (kv_a_proj_with_mqa split into a latent and a rotary
key, the latent normed and expanded by kv_b_proj), the optional query LoRA,
each head split into a part without position and a rotated part. The
latent norms are not q/k norms, kv_b_proj and q_b_proj are not output
projections, and the scale (nope + rope) ** -0.5 (with YaRN's mscale_all_dim
folded in) is the latent kind's own. Group-limited routing is a spec field
(how a group is scored), not an unsupported computation. The checkpoints are
config.json only (the code analysis needs no weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

TINY_MLA = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "head_dim": 8,
    "v_head_dim": 16,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "vocab_size": 256,
}


def _research(tmp_path: Path, model_type: str, **values):
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from autoport_cst.research import research

    config = AutoConfig.for_model(model_type, **{**TINY_MLA, **values}).to_dict()
    config["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    directory = tmp_path / model_type
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return research(str(directory))


def test_deepseek_v3_attention_is_latent_with_its_sizes_and_nothing_unclassified(tmp_path):
    result = _research(tmp_path, "deepseek_v3", n_group=2, topk_group=1)
    attention = result.spec.attention
    assert attention.kind == "latent"
    assert attention.q_lora is True
    assert (attention.q_lora_rank, attention.kv_lora_rank) == (48, 32)
    assert (attention.qk_nope_head_dim, attention.qk_rope_head_dim, attention.v_head_dim) == (16, 8, 16)
    # the latent norms (q_a_layernorm, kv_a_layernorm) are no q/k norms; o_proj is the one output projection
    assert attention.qk_norm == "none"
    assert attention.o_bias is False
    assert attention.scale is None and attention.scale_key is None  # (16 + 8) ** -0.5: the latent default
    assert result.spec.moe.group_limit == "sum_top2"
    assert result.spec.unsupported is None
    assert not [name for name in result.unknown if not name.startswith("checkpoint.")]


def test_yarn_mscale_all_dim_in_the_softmax_scale_is_the_latent_default(tmp_path):
    rope = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 40.0,
        "original_max_position_embeddings": 128,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "beta_fast": 32,
        "beta_slow": 1,
    }
    result = _research(tmp_path, "deepseek_v3", rope_parameters=rope, max_position_embeddings=5120)
    assert result.spec.attention.kind == "latent"
    assert result.spec.attention.scale is None
    assert result.spec.unsupported is None


def test_deepseek_v2_lite_has_no_query_lora_and_a_group_limit_scored_by_the_best_expert(tmp_path):
    result = _research(
        tmp_path, "deepseek_v2", q_lora_rank=None, topk_method="group_limited_greedy", n_group=2, topk_group=1
    )
    attention = result.spec.attention
    assert attention.kind == "latent"
    assert attention.q_lora is False and attention.q_lora_rank is None
    assert attention.qk_norm == "none"
    assert result.spec.moe.group_limit == "max"
    assert result.spec.moe.router_activation == "softmax"


def test_the_plan_of_deepseek_v3_is_the_deepseek_v3_reference_with_no_codemod(tmp_path):
    from autoport_cst.research.reference_choice import choose_reference

    result = _research(tmp_path, "deepseek_v3", n_group=2, topk_group=1)
    choice = choose_reference(result.spec, "deepseek_v3", "DeepseekV3ForCausalLM")
    assert choice.chosen == "deepseek_v3" and choice.realizable, choice.reason
    assert choice.candidate("deepseek_v3").code_changes == ()


def test_a_norm_on_the_moe_output_is_named_not_ported(tmp_path):
    """A.X-K1 is DeepSeek-V3 with a norm on the MoE block's output
    (post_mlp_layernorm): the deepseek_v3 reference has none, so the plan is
    refused by that computation (a port from it does not validate)."""
    from autoport_cst.research.reference_choice import choose_reference

    result = _research(tmp_path, "axk1", n_group=2, topk_group=1)
    assert result.spec.attention.kind == "latent"
    assert any(entry.startswith("moe.output_norm") for entry in result.spec.unsupported or ())
    assert not choose_reference(result.spec, "axk1", "AXK1ForCausalLM").realizable


def test_a_model_type_without_its_own_modeling_file_is_read_from_its_mapped_class(tmp_path):
    """sarvam_mla has no modeling file: transformers maps it to
    DeepseekV3ForCausalLM. Without query LoRA its q_proj is 4 x 24 = 96 wide,
    which equals (heads + 2 KV heads) x head_dim in the tiny config: latent
    attention has no fused Q/K/V all the same."""
    from autoport_cst.research import research
    from autoport_cst.research.reference_choice import choose_reference
    from autoport_cst.validate import build_tiny_checkpoint

    build_tiny_checkpoint("sarvam_mla", tmp_path, seed=0)
    result = research(str(tmp_path))
    assert result.spec.attention.kind == "latent" and result.spec.attention.q_lora is False
    assert result.spec.checkpoint.qkv == "separate"
    choice = choose_reference(result.spec, "sarvam_mla", "DeepseekV3ForCausalLM")
    assert choice.chosen == "deepseek_v3" and choice.realizable, choice.reason
