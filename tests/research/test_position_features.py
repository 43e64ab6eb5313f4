"""Position features the research reads per layer, from what the code
computes with what each layer is passed: a scale of the queries that grows
with the position (an attention temperature, read with its config fields), layers the backbone
passes no position embeddings (NoPE layers, refused unless a port can read
them from the fields it knows), and a RoPE base per layer (refused)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("tiny")


def _unsupported(result) -> list[str]:
    return [item.split(":", 1)[0] for item in result.spec.unsupported or ()]


def test_position_dependent_query_scaling_is_read_as_an_attention_temperature(tiny):
    """Ministral 3 multiplies the rotated queries by
    1 + beta * log(1 + floor(position_ids / n)), in a helper function, the
    factor cast to the queries' dtype: the plan reads beta and n from the
    config fields that hold them (position-scaled-attention realizes it)."""
    result = tiny.research("ministral3")
    assert "position_scaled_attention" not in _unsupported(result)
    attention = result.spec.attention
    assert attention.temperature_beta_key == "rope_parameters.llama_4_scaling_beta"
    assert attention.temperature_floor_key == "rope_parameters.original_max_position_embeddings"
    assert (attention.temperature_offset, attention.temperature_layers) == (0.0, "all")
    assert attention.temperature_rounded is True


def test_layers_the_backbone_passes_no_position_embeddings_are_nope_layers(tiny):
    """GraniteSWA with layer_rope_theta 0 on layers 0 and 2: its backbone
    passes them None for the position embeddings and their attention skips
    RoPE. They are NoPE layers, and no port reads them from
    layer_rope_theta: refused, not planned as rotating every layer."""
    result = tiny.research("granite_swa_nope")
    assert result.spec.rope.nope_layers == (0, 2)
    assert "nope_layers" in _unsupported(result)


def test_nope_layers_of_a_moe_model_with_per_layer_theta(tiny):
    result = tiny.research("granitemoe_swa_nope")
    assert result.spec.rope.nope_layers == (1, 3)
    assert "nope_layers" in _unsupported(result)


def test_a_rope_base_per_layer_is_refused(tiny):
    """Two rotary modules built from copies of the config with different
    rope_theta, one per layer: the plan would rotate both with one base."""
    result = tiny.research("granite_swa_thetas")
    assert result.spec.rope.nope_layers is None
    (item,) = [u for u in result.spec.unsupported or () if u.startswith("layer_rope_bases")]
    assert "500000" in item and "10000" in item


def test_one_rope_base_on_every_layer_stays_portable(tiny):
    result = tiny.research("granite_swa")
    assert result.spec.rope.nope_layers is None
    assert result.spec.unsupported is None


def test_nope_layers_told_by_the_layer_types_are_read_as_a_rule(tiny):
    """Cohere 2 skips RoPE where its layer has no sliding window (from
    layer_types): the rule the nope-layers port reads, not a refusal."""
    result = tiny.research("cohere2")
    assert result.spec.rope.nope_layers == (3,)
    assert result.spec.rope.nope_rule == "sliding"
    assert not [u for u in result.spec.unsupported or () if u.startswith("nope_layers")]


def test_nope_layers_read_from_no_rope_layers_stay_portable(tiny):
    result = tiny.research("smollm3")
    assert result.spec.rope.nope_layers == (1,)
    assert result.spec.unsupported is None


def test_llama4_reads_its_temperature_on_the_layers_without_rope_and_its_chunked_attention(tmp_path):
    """Llama 4 scales its queries inline, on the layers without RoPE, from
    the positions counted past the cache (offset 1, the product rounded); its
    backbone builds a chunked causal mask for the layers layer_types marks
    chunked_attention: attention.chunked per_layer, with the chunk (the tiny
    checkpoint's 12 tokens, below the validation prompts)."""
    from autoport_cst.research import research
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    build_tiny_checkpoint("Llama4ForCausalLM", tmp_path / "llama4", seed=0)
    result = research(str(tmp_path / "llama4"))
    attention = result.spec.attention
    assert (attention.temperature_beta_key, attention.temperature_floor_key) == ("attn_scale", "floor_scale")
    assert (attention.temperature_offset, attention.temperature_layers) == (1.0, "nope")
    assert attention.temperature_rounded is False
    assert (attention.chunked, attention.chunk_size) == ("per_layer", 12)
    # its L2 norm of the rotated q/k heads: per head, no weight, on the RoPE layers only
    assert (attention.qk_norm, attention.qk_norm_position) == ("per_head", "after_rope")
    assert (attention.qk_norm_affine, attention.qk_norm_layers) == (False, "rope")
    assert not any("norm" in key for key in result.spec.checkpoint.key_map or {})
    assert not [u for u in result.spec.unsupported or () if u.startswith("chunked_attention")]


@pytest.mark.slow
def test_llama4_with_no_chunked_layer_has_no_chunked_attention(tmp_path):
    """A chunk size with no layer marked chunked_attention: nothing to port, nothing refused."""
    import json

    from autoport_cst.research import research
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    build_tiny_checkpoint("Llama4ForCausalLM", tmp_path / "llama4", seed=0)
    path = tmp_path / "llama4" / "config.json"
    config = json.loads(path.read_text())
    config["layer_types"] = ["full_attention"] * len(config["layer_types"])
    path.write_text(json.dumps(config))
    result = research(str(tmp_path / "llama4"))
    assert result.spec.attention.chunked == "none"
    assert not [u for u in result.spec.unsupported or () if u.startswith("chunked_attention")]
