"""GPT-J: a RoPE base written in the modeling code, q/k/v projections
declared in another order than the kernel reads them, and config fields
under GPT-2's names; research reads each from what the code computes."""

from __future__ import annotations


def test_the_rope_base_written_in_the_code_is_read(tiny):
    """``create_sinusoidal_positions`` computes ``10000 ** (arange(0, dim, 2)
    / dim)`` and the config has no RoPE field: the base is the code's, the
    frequencies the default ones, rotated in adjacent pairs on the first
    rotary_dim (8 of 16) channels of each head."""
    found = tiny.research("gptj")
    rope = found.spec.rope
    assert rope.theta_in_code == 10000.0 and rope.type == "default", rope
    assert rope.style == "interleaved" and rope.partial_rotary_factor == 0.5, rope
    assert found.spec.unsupported is None and "rope.type" not in found.unknown
    layers = found.finding("num_layers", "code")
    assert layers is not None and layers.evidence.startswith("GPTJModel.h:")
    (theta,) = [f for f in found.findings if f.field == "rope.theta_in_code"]
    assert "create_sinusoidal_positions (GPTJRotaryEmbedding.__init__)" in theta.evidence


def test_q_k_v_are_told_apart_by_the_kernel_arguments(tiny):
    """GPTJAttention declares k_proj, v_proj, q_proj in that order; the
    kernel's query, key and value arguments name them (on the forward path
    that does not update a cache: there keys and values read both)."""
    key_map = tiny.research("gptj").spec.checkpoint.key_map or {}
    assert not any(
        name.startswith(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")) for name in key_map
    )
    assert key_map["self_attn"] == "attn" and key_map["self_attn.o_proj"] == "attn.out_proj"


def test_config_fields_under_other_names_are_mapped(tiny):
    """config.json writes n_embd, n_head, n_layer, n_positions (transformers'
    attribute_map), n_inner = null for 4 * n_embd, and rotary_dim in channels."""
    keys = tiny.research("gptj").spec.checkpoint.config_keys
    assert keys == {
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
        "max_position_embeddings": "n_positions",
        "intermediate_size": "n_inner or 4 * n_embd",
        "partial_rotary_factor": "rotary_dim / (n_embd // n_head)",
    }


def test_a_llama_config_needs_no_key_map(tiny):
    assert tiny.research("llama").spec.checkpoint.config_keys is None


def test_codegen_fuses_qkv_in_groups_of_q_v_k(tmp_path):
    """CodeGen views its qkv_proj output as 4 groups of 3 x (hidden / 4) and
    splits each into query, value, key (the order its kernel arguments read
    them in; the query's cast to the value's dtype is no dependence)."""
    from autoport_cst.research import research
    from autoport_cst.validate import build_tiny_checkpoint

    source = tmp_path / "codegen"
    build_tiny_checkpoint("CodeGenForCausalLM", source, seed=0, dimensions={"num_attention_heads": 8})
    checkpoint = research(str(source)).spec.checkpoint
    assert (checkpoint.qkv, checkpoint.qkv_groups, checkpoint.qkv_order) == ("fused_grouped", 4, "qvk")
    assert checkpoint.key_map is not None and checkpoint.key_map["self_attn"] == "attn"


def test_gpt_neox_keeps_its_per_head_layout(tiny):
    checkpoint = tiny.research("gpt_neox").spec.checkpoint
    assert checkpoint.qkv == "fused_per_head" and checkpoint.qkv_groups is None
