"""An attention one module down whose wrapper only passes it through
(GPT-Neo's ``attn.attention``: ``GPTNeoAttention.forward`` returns
``self.attention(...)`` as it is) is read as the layer's attention: its
norms, feed-forward, biases and checkpoint names are read, and its scores
written out by what they compute (no scaling: scale 1), and the boolean
mask it selects them by (a buffer: the sliding window of the local layers,
tests/coverage_dense/test_gpt_neo.py), with the config fields it and the
sliding layers come from."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")


def test_the_attention_inside_a_pass_through_wrapper_is_read(tiny):
    found = tiny.research("gpt_neo")
    spec = found.spec
    assert (spec.norm.kind, spec.norm.bias, spec.norm.placement) == ("layernorm", True, "pre")
    assert (spec.mlp.kind, spec.mlp.activation, spec.mlp.bias) == ("plain", "gelu_tanh", True)
    assert (spec.attention.qkv_bias, spec.attention.o_bias) == (False, True)
    assert spec.embedding.learned_positions is True
    assert spec.checkpoint.key_map["self_attn"] == "attn.attention"
    assert spec.checkpoint.key_map["self_attn.o_proj"] == "attn.attention.out_proj"
    assert spec.checkpoint.key_map["mlp.up_proj"] == "mlp.c_fc"
    assert not any(e.startswith("code.attention") for e in spec.unsupported or ())


def test_unscaled_scores_read_as_scale_one(tiny):
    scale = tiny.research("gpt_neo").finding("attention.scale", "code")
    assert scale is not None and scale.value == 1.0, scale
    assert "unscaled" in scale.evidence


def test_the_window_and_its_fields_are_read(tiny):
    spec = tiny.research("gpt_neo").spec
    assert (spec.attention.sliding_window, spec.attention.sliding_window_size) == ("per_layer", 16)
    assert (spec.attention.layer_types_key, spec.attention.sliding_layer_type) == (
        "attention_layers",
        "local",
    )
    assert not spec.unsupported, spec.unsupported
