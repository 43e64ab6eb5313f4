"""What research does not read as one softmax attention and one feed-forward
is refused by the computation its code performs, found in that code (never
by the model's name), with the source position: a token mixer looping over
the positions (Mamba, RWKV, the gated delta rule of a hybrid, Jamba's layers, the Mamba-2 mixer
beside FalconH1's attention), a
convolutional mixer (LFM), experts chosen without a top-k (PhiMoE's
sparsemixer), an attention one module down whose wrapper adds and norms the
residual (BERT as a decoder, DBRX) or that writes out its scores (GPT-Neo),
DBRX's clamped projections, several attentions in one layer (LongCat
Flash, TrOCR's cross-attention), layers as parallel lists (XLM); never "decoder layers / an attention research could not find".
(XGLM's attention written out with torch.bmm and its sinusoidal positions are read:
tests/research/test_sinusoidal_positions.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

FAILURES = ("code.decoder_layers", "code.attention")

# architecture -> (the features its refusal names, words the message must hold)
NAMED = {
    "MambaForCausalLM": (
        {"recurrent_mixer"},
        ["MambaMixer", "mamba_selective_scan (modeling_mamba.py:", "conv1d"],
    ),
    "RwkvForCausalLM": ({"recurrent_mixer"}, ["rwkv_linear_attention_cpu (modeling_rwkv.py:"]),
    "Qwen3NextForCausalLM": (
        {"attention.other_mixer_layers", "recurrent_mixer"},
        ["Qwen3NextGatedDeltaNet", "gated_delta_rule (modeling_qwen3_next.py:"],
    ),
    # its layers a list built by appending each layer's class (attention or Mamba) in a loop
    "JambaForCausalLM": (
        {"attention.other_mixer_layers", "recurrent_mixer"},
        ["JambaMambaMixer", "conv1d", "mamba_selective_scan (modeling_jamba.py:"],
    ),
    # a Mamba-2 mixer beside the attention in every layer, its scan a cumulative sum (segment_sum)
    "FalconH1ForCausalLM": (
        {"recurrent_mixer"},
        ["beside the attention", "segment_sum (modeling_falcon_h1.py:"],
    ),
    "Lfm3ForCausalLM": (
        {"attention.other_mixer_layers", "convolution_mixer"},
        ["Lfm3ShortConv.forward (modeling_lfm3.py:", "a convolution over the positions"],
    ),
    "PhimoeForCausalLM": ({"routing_without_topk"}, ["sparsemixer (modeling_phimoe.py:", "PhimoeExperts"]),
    "BertLMHeadModel": (
        {"sublayer_residual"},
        ["BertAttention.forward (modeling_bert.py:", "in BertSelfOutput, then a norm (LayerNorm)"],
    ),
    "LongcatFlashForCausalLM": ({"several_attentions"}, ["holds 2 attention sublayers: self_attn.0"]),
    # a self-attention and a cross-attention (encoder_attn) in one layer
    "TrOCRForCausalLM": ({"several_attentions"}, ["holds 2 attention sublayers: self_attn", "encoder_attn"]),
    # attentions[i], ffns[i], layer_norm1[i], layer_norm2[i]: no one list of layers
    "XLMWithLMHeadModel": (
        {"parallel_layer_lists"},
        [
            "XLMModel.forward (modeling_xlm.py:",
            "attentions (2 x MultiHeadAttention), ffns (2 x TransformerFFN)",
        ],
    ),
    # its feed-forward an nn.Sequential (Linear, ReLU, Linear), its embeddings scaled by np.sqrt(d_model): an
    # ordinary block; the positions a buffer of sines and cosines a function of the file computes
    "CTRLLMHeadModel": (
        {"sinusoidal_positions"},
        ["adds positional_encoding (a function, modeling_ctrl.py:"],
    ),
    # the norm and the residual inside each sublayer's block, scores and an nn.Softmax module written out
    "CpmAntForCausalLM": (
        {"explicit_attention", "sublayer_residual"},
        [
            "CpmAntAttention.forward (modeling_cpmant.py:",
            "CpmAntSelfAttentionBlock.forward (modeling_cpmant.py:",
            "to the output of CpmAntAttention)",
        ],
    ),
    # the text model built by MllamaTextModel._from_config(config.get_text_config()); layers attending to images
    "MllamaForCausalLM": (
        {"cross_attention_layers"},
        ["MllamaCrossAttentionDecoderLayer (layers 3 of 4)", "k_proj from cross_attention_states"],
    ),
    # classes defined under `else:` of `if is_xlstm_available():`, the kernels kept as attributes
    "xLSTMForCausalLM": (
        {"recurrent_mixer"},
        ["mlstm_layer (xLSTMLayer)", "mlstm_recurrent_sequence_native (modeling_xlstm.py:"],
    ),
    # layer classes chosen from a dict keyed by (is_sliding, is_loop_layer)
    # (its token embedding normalizes its own output: Inkling2LoopNormedEmbedding)
    "Inkling2LoopForCausalLM": (
        {"several_attentions", "embedding_norm"},
        [
            "Inkling2LoopSlidingAttention",
            "embed_tokens (Inkling2LoopNormedEmbedding) normalizes its own output",
        ],
    ),
    # several residual streams mixed by learned weights (attn_hc, ffn_hc), the embeddings copied into them:
    # not an embedding scale or a norm placement research could not classify
    "DeepseekV4ForCausalLM": (
        {
            "attention.latent",
            "hyper_connections",
            "routing_without_topk",
            "attention.o_bias",
        },
        [
            "the residual is several streams mixed by learned weights: attn_hc (DeepseekV4HyperConnection",
            "ffn_hc (DeepseekV4HyperConnection",
            "DeepseekV4Model copies the token embeddings into the streams (expand)",
        ],
    ),
    # the attention's experts (JetMoeMoA) and the MLP's: two modules of 3-D weights chained by the block
    "JetMoeForCausalLM": (
        {"routed_attention", "split_expert_projections"},
        [
            "the experts' weights: input_linear (JetMoeParallelExperts: weight [",
            "JetMoeMoE.forward (modeling_jetmoe.py:",
            "input_linear weight [4, 256, 64] then output_linear weight [4, 64, 128] (JetMoeParallelExperts), "
            "the activation applied between them by JetMoeMoE, which adds its parameter bias",
        ],
    ),
}


def _refusal(found):
    from autoport_cst.port import refusal
    from autoport_cst.research import choose_reference

    return refusal(found, choose_reference(found.spec, "tiny", found.architecture, None))


@pytest.fixture(scope="module")
def researched(tmp_path_factory):
    from autoport_cst.research import research
    from autoport_cst.validate import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("named")
    cache: dict[str, object] = {}

    def get(architecture: str):
        if architecture not in cache:
            build_tiny_checkpoint(architecture, root / architecture, seed=0)
            cache[architecture] = research(str(root / architecture))
        return cache[architecture]

    return get


@pytest.mark.parametrize("architecture", sorted(NAMED))
def test_the_refusal_names_the_computation(researched, architecture):
    features, words = NAMED[architecture]
    error = _refusal(researched(architecture))
    assert error is not None
    assert set(error.features) == features, error.features
    message = str(error)
    assert all(w in message for w in words), message
    assert not any(f"[{failure}]" in message for failure in FAILURES), message


@pytest.mark.parametrize("clip", [8.0, None])
def test_dbrx_is_refused_for_clip_qkv_and_its_residual_in_the_wrapper(tmp_path: Path, clip):
    """DBRX (full-size config: research needs no weights): the projections
    clamped when clip_qkv is set (the path the config takes), and the
    residual DbrxNormAttentionNorm adds."""
    from autoport_cst.research import research
    from autoport_cst.validate.tiny import resolve_config, write_config_json

    config, _ = resolve_config("DbrxForCausalLM")
    config.architectures = ["DbrxForCausalLM"]
    config.attn_config.clip_qkv = clip
    write_config_json(config, tmp_path / "config.json")
    error = _refusal(research(str(tmp_path)))
    expected = {"fused_expert_rows", "sublayer_residual"} | ({"qkv_clip"} if clip else set())
    assert error is not None and set(error.features) == expected, error
    assert "DbrxNormAttentionNorm.forward (modeling_dbrx.py:" in str(error)
    assert ("DbrxAttention.forward (modeling_dbrx.py:" in str(error)) == bool(clip)
    # the experts' layout: w1, v1, w2 each [experts x ffn_hidden_size, hidden], viewed per expert
    width = config.ffn_config.moe_num_experts * config.ffn_config.ffn_hidden_size
    assert f"mlp.w1 [{width}, {config.d_model}]" in str(error), str(error)
    assert "split per expert by a view to 3-D and an index (modeling_dbrx.py:" in str(error)


def test_a_cause_is_named_once(tmp_path: Path):
    """XLNet (full-size config): its attention computes with its own
    parameters (q, k, v, o, r and the relative-position biases), which is
    named; the kernel arguments it has no kernel call for (scale, sinks,
    softcap, window, biases) are not listed beside it, nor the norms' kind,
    bias and offset and the parallel residual that follow from the layer's
    flow research did not follow (norm.placement says why)."""
    from autoport_cst.research import research
    from autoport_cst.validate.tiny import resolve_config, write_config_json

    config, _ = resolve_config("XLNetLMHeadModel")
    config.architectures = ["XLNetLMHeadModel"]
    write_config_json(config, tmp_path / "config.json")
    error = _refusal(research(str(tmp_path)))
    assert error is not None
    assert set(error.features) == {
        "learned parameters in the attention computation",
        "norm.placement",
        "embedding.scale",
    }, error.features
    assert "r_w_bias" in str(error) and "found 1 attention and 0 MLP calls" in str(error), str(error)


def test_a_mixer_built_beside_the_attention_only_for_an_unknown_layer_kind_is_named_in_its_place(
    tmp_path: Path,
):
    """LFM2-MoE's default config has no layer_types: research builds both the
    attention and the short convolution of a layer (its kind unknown), and
    forward runs one or the other by a run-time condition. The convolution is
    named as computed in place of the attention, not beside it (FalconH1's
    mixer is: both on one path), and explains the norm placement research
    could not agree on between the two paths (refused as norm.placement
    before)."""
    from autoport_cst.research import research
    from autoport_cst.validate.tiny import resolve_config, write_config_json

    config, _ = resolve_config("Lfm2MoeForCausalLM")
    config.architectures = ["Lfm2MoeForCausalLM"]
    write_config_json(config, tmp_path / "config.json")
    error = _refusal(research(str(tmp_path)))
    assert error is not None
    assert set(error.features) == {"convolution_mixer"}, error.features
    assert "beside the attention" not in str(error), str(error)
    assert "conv (Lfm2MoeShortConv) in place of the attention" in str(error), str(error)


def test_a_mixture_of_attention_heads_is_named(researched):
    """JetMoE's attention routes each token to top-k experts for its query
    and output projections (JetMoeMoA): named as routed attention, not as an
    attention output bias research could not classify."""
    error = _refusal(researched("JetMoeForCausalLM"))
    assert error is not None and "routed_attention" in error.features, error.features
    assert "attention.o_bias" not in error.features
    assert "JetMoeMoA.forward (modeling_jetmoe.py:" in str(error)


def _full_size(tmp_path: Path, architecture: str):
    from autoport_cst.research import research
    from autoport_cst.validate.tiny import resolve_config, write_config_json

    config, _ = resolve_config(architecture)
    config.architectures = [architecture]
    write_config_json(config, tmp_path / "config.json")
    return research(str(tmp_path))


def test_a_reversible_residual_is_named(tmp_path: Path):
    """Reformer (full-size config): each layer adds its attention's output
    to the other of two residual streams (``prev_attn_output``), named as a
    reversible residual, not as decoder layers not found."""
    error = _refusal(_full_size(tmp_path, "ReformerModelWithLMHead"))
    assert error is not None and set(error.features) == {"reversible_residual"}, error
    assert "ReformerLayer.forward (modeling_reformer.py:" in str(error)
    assert "computed from hidden_states, to another input, prev_attn_output" in str(error)


@pytest.mark.parametrize(
    ("architecture", "decoder"),
    [
        ("FuyuForCausalLM", "vision_embed_tokens"),  # Persimmon's decoder; its image-patch embedding refused
        ("Gemma4UnifiedAssistantForCausalLM", "modeling_gemma4_unified.py"),
    ],
)
def test_a_decoder_built_by_auto_model_from_config_is_found(tmp_path: Path, architecture, decoder):
    """Fuyu and the Gemma 4 assistant build their decoder with
    ``AutoModel.from_config(text_config)``: research follows it to the class
    transformers maps the sub-config's model_type to (full-size configs) and
    refuses them for what that decoder computes, not for layers not found."""
    found = _full_size(tmp_path, architecture)
    layers = next(f for f in found.findings if f.field == "num_layers" and f.source == "code")
    assert layers.known and layers.value == found_layers(architecture), layers
    error = _refusal(found)
    if decoder is None:
        assert error is None, str(error)
        return
    assert error is not None and "code.decoder_layers" not in error.features, error
    assert decoder in str(error), str(error)


def found_layers(architecture: str) -> int:
    from autoport_cst.validate.tiny import resolve_config

    config, _ = resolve_config(architecture)
    return config.text_config.num_hidden_layers


def test_inkling_s_attention_built_with_a_cast_module_is_found(researched):
    """Inkling builds its key and value convolutions as ``Module(...).to(dtype=...)``
    (the module itself): the attention is found and the short convolution
    beside it named, not decoder layers not found."""
    error = _refusal(researched("InklingForCausalLM"))
    assert error is not None and "convolution_mixer" in error.features, error.features
    assert "code.decoder_layers" not in error.features


@pytest.mark.parametrize(
    ("architecture", "features", "words"),
    [
        # its LM head, rotary fraction and RoPE read from text_config, and Persimmon's LayerNorm q/k
        # norms the layer norms' kind (qk-norm builds them with the port's LayerNorm class): only the
        # image-patch embedding beside the decoder, which a port would drop
        ("FuyuForCausalLM", {"modules_beside_decoder"}, ["model.vision_embed_tokens (linear)"]),
        (
            "Gemma4UnifiedAssistantForCausalLM",
            {"external_inputs"},
            ["gives Gemma4UnifiedTextModel no token ids: its input is pre_projection (", "shared_kv_states"],
        ),
    ],
)
def test_a_model_delegating_to_a_text_model_is_researched_on_its_text_config(
    tmp_path: Path, architecture, features, words
):
    """Fuyu and the Gemma 4 assistant (full-size configs) hold their text
    model's sizes in ``text_config``: research reads them there (the top
    level's identity and tying kept), so that no field of the top level is
    refused as unclassified (Fuyu's LM head bias, rope type and rotary
    fraction were). The assistant runs its decoder on another model's
    states: named, not an embedding scale not traced."""
    from autoport_cst.validate.tiny import resolve_config

    found = _full_size(tmp_path, architecture)
    text = resolve_config(architecture)[0].get_text_config()
    assert found.spec.hidden_size == text.hidden_size and found.spec.embedding.vocab_size == text.vocab_size
    assert found.model_type == resolve_config(architecture)[0].model_type
    error = _refusal(found)
    if not features:
        assert error is None, str(error)
        return
    assert error is not None and features <= set(error.features), error.features
    for field in ("lm_head.bias", "embedding.scale", "attention.scale"):
        assert field not in error.features, error.features
    assert all(w in str(error) for w in words), str(error)


def test_text_model_config_is_the_sub_config_only_where_the_model_delegates():
    """A config whose get_text_config() is itself (Llama) is read as it is;
    Fuyu's is read from text_config, with the top level's identity, tying
    and dtype."""
    from autoport_cst.research.config_analysis import text_model_config
    from autoport_cst.validate.tiny import resolve_config

    llama, _ = resolve_config("LlamaForCausalLM")
    raw = llama.to_dict()
    assert text_model_config(raw, llama) == (raw, llama)
    fuyu, _ = resolve_config("FuyuForCausalLM")
    raw = {**fuyu.to_dict(), "architectures": ["FuyuForCausalLM"], "tie_word_embeddings": True}
    values, resolved = text_model_config(raw, fuyu)
    assert resolved is fuyu.text_config
    assert values["hidden_size"] == fuyu.text_config.hidden_size and "text_config" not in values
    assert values["model_type"] == "fuyu" and values["architectures"] == ["FuyuForCausalLM"]
    assert values["tie_word_embeddings"] is True


def test_no_hyper_connections_expert_layouts_or_external_inputs_in_a_plain_model(researched):
    """A Llama (one residual stream, no experts, its own token embeddings)
    and a Qwen3-MoE (its experts one module computing act(x W_gate) * (x
    W_up) W_down) name none of these computations."""
    names = (
        "hyper_connections",
        "split_expert_projections",
        "fused_expert_rows",
        "external_inputs",
        "relative_position_bias",
        "attention_sizes_per_layer",
    )
    for architecture in ("LlamaForCausalLM", "Qwen3MoeForCausalLM"):
        found = researched(architecture)
        assert not any(f.field == f"unsupported.{n}" for f in found.findings for n in names), architecture
        assert _refusal(found) is None, architecture


def test_inkling_is_refused_by_what_it_computes_each_named_once(researched):
    """Inkling: the sliding layers' own head count and size (swa_*), the
    relative-position logits computed from r_proj, the token embedding's own
    norm, the short convolutions and the stacked shared experts, each named;
    not the sizes built other than the config's, the KV head count r_proj
    was counted in, the embedding scale and tying (the class declares no
    tied weights), or the shared-expert gate, which follow from them."""
    error = _refusal(researched("InklingForCausalLM"))
    assert error is not None
    named = {
        "attention_sizes_per_layer",
        "convolution_mixer",
        "embedding_norm",
        "relative_position_bias",
        "stacked_shared_experts",
    }
    assert named <= set(error.features), error.features
    followed = {
        "attention.num_heads",
        "attention.num_kv_heads",
        "attention.head_dim",
        "embedding.scale",
        "embedding.tied",
        "moe.shared_expert_gate",
    }
    assert not followed & set(error.features), error.features
    for words in (
        "layers 0-4: q_proj 8192",
        "layer 5: q_proj 64",
        "rel_logits_proj (InklingRelativeLogits) computes from r_proj",
        "embed_tokens (InklingNormedEmbedding) normalizes its own output with embed_norm",
    ):
        assert words in str(error), str(error)
