"""The research of tiny checkpoints of transformers architectures: each
detected feature is what that architecture's transformers code computes
(with the configuration values in tiny_models.ARCHITECTURES)."""

from __future__ import annotations

import pytest

from autoport_cst.spec import get_field
from tests.research.tiny_models import ARCHITECTURES

LLAMA_LIKE = {
    "norm.kind": "rmsnorm",
    "norm.bias": False,
    "norm.unit_offset": False,
    "norm.placement": "pre",
    "norm.eps_key": "rms_norm_eps",
    "attention.num_heads": 4,
    "attention.num_kv_heads": 2,
    "attention.head_dim": 16,
    "attention.qkv_bias": False,
    "attention.o_bias": False,
    "attention.qk_norm": "none",
    "attention.sliding_window": "none",
    "attention.sinks": False,
    "attention.softcap": None,
    "attention.scale": None,
    "rope.partial_rotary_factor": 1.0,
    "rope.style": "rotate_half",
    "mlp.kind": "gated",
    "mlp.activation": "silu",
    "mlp.bias": False,
    "mlp.glu": "standard",
    "moe": None,
    "embedding.scale": "none",
    "embedding.multiplier": None,
    "lm_head.bias": False,
    "lm_head.softcap": None,
    "lm_head.logits_divisor": None,
    "residual.parallel": "none",
    "residual.multiplier": None,
    "checkpoint.qkv": "separate",
    "checkpoint.gate_up": "separate",
    "checkpoint.key_map": None,
    "checkpoint.linear_layout": "out_in",
    "attention.kind": "softmax",
    "attention.output_norm": False,
    "attention.other_mixer_layers": None,
    "embedding.learned_positions": False,
    "norm.affine": True,
    "rope.layer_parameters": None,
    "unsupported": None,
}

MOE_LIKE = {k: v for k, v in LLAMA_LIKE.items() if k != "moe"}

EXPECTED: dict[str, dict[str, object]] = {
    "llama": {
        **LLAMA_LIKE,
        "embedding.tied": False,
        "checkpoint.lm_head_stored": True,
        "mlp.intermediate_size": 96,
        "rope.type": "default",
    },
    "mistral": {**LLAMA_LIKE, "attention.sliding_window": "all", "attention.sliding_window_size": 32},
    "qwen2": {**LLAMA_LIKE, "attention.qkv_bias": True, "attention.o_bias": False},
    "qwen2_sliding": {
        **LLAMA_LIKE,
        "attention.qkv_bias": True,
        "attention.sliding_window": "per_layer",
        "attention.sliding_window_size": 16,
        "attention.layer_types": ("full_attention", "sliding_attention"),
    },
    "qwen3": {**LLAMA_LIKE, "attention.qk_norm": "per_head"},
    "gemma": {
        **LLAMA_LIKE,
        "norm.unit_offset": True,
        "embedding.scale": "sqrt_hidden",
        "mlp.activation": "gelu_tanh",
        "embedding.tied": True,
        "checkpoint.lm_head_stored": False,
    },
    "gemma2": {
        **LLAMA_LIKE,
        "norm.unit_offset": True,
        "norm.placement": "sandwich",
        "embedding.scale": "sqrt_hidden",
        "mlp.activation": "gelu_tanh",
        "attention.sliding_window": "per_layer",
        "attention.sliding_window_size": 32,
        "attention.layer_types": ("sliding_attention", "full_attention"),
        "attention.softcap": 50.0,
        "lm_head.softcap": 30.0,
    },
    "phi3": {
        **LLAMA_LIKE,
        "checkpoint.qkv": "fused",
        "checkpoint.gate_up": "fused",
        "mlp.intermediate_size": 96,
    },
    "stablelm": {
        **LLAMA_LIKE,
        "norm.kind": "layernorm",
        "norm.bias": True,
        "norm.eps_key": "layer_norm_eps",
        "rope.partial_rotary_factor": 0.25,
    },
    "gpt_neox": {
        **LLAMA_LIKE,
        "norm.kind": "layernorm",
        "norm.bias": True,
        "norm.eps_key": "layer_norm_eps",
        "attention.num_kv_heads": 4,
        "attention.qkv_bias": True,
        "attention.o_bias": True,
        "checkpoint.qkv": "fused_per_head",
        "rope.partial_rotary_factor": 0.25,
        "mlp.kind": "plain",
        "mlp.activation": "gelu",
        "mlp.bias": True,
        "residual.parallel": "separate_norms",
        "checkpoint.key_map": {
            "model": "gpt_neox",
            "self_attn": "attention",
            "self_attn.qkv_proj": "attention.query_key_value",
            "self_attn.o_proj": "attention.dense",
            "mlp.up_proj": "mlp.dense_h_to_4h",
            "mlp.down_proj": "mlp.dense_4h_to_h",
            "model.embed_tokens": "gpt_neox.embed_in",
            "model.norm": "gpt_neox.final_layer_norm",
        },
    },
    "starcoder2": {
        **LLAMA_LIKE,
        "norm.kind": "layernorm",
        "norm.bias": True,
        "norm.eps_key": "norm_epsilon",
        "attention.qkv_bias": True,
        "attention.o_bias": True,
        "mlp.kind": "plain",
        "mlp.activation": "gelu_tanh",
        "mlp.bias": True,
        "checkpoint.key_map": {"mlp.up_proj": "mlp.c_fc", "mlp.down_proj": "mlp.c_proj"},
    },
    "olmo2": {**LLAMA_LIKE, "norm.placement": "post", "attention.qk_norm": "full_width"},
    "granite": {
        **LLAMA_LIKE,
        "embedding.multiplier": 12.0,
        "residual.multiplier": 0.22,
        "attention.scale": 0.0078125,
        "lm_head.logits_divisor": 8.0,
        "attention.scale_key": "attention_multiplier",
        "attention.scale_form": "multiplier",
        "lm_head.logits_key": "logits_scaling",
        "lm_head.logits_form": "divisor",
    },
    "mixtral": {
        **MOE_LIKE,
        "moe.num_experts": 4,
        "moe.top_k": 2,
        "moe.intermediate_size": 96,
        "moe.router_activation": "softmax",
        "moe.norm_topk_prob": True,
        "moe.shared_experts": 0,
        "moe.router_bias": False,
        "mlp.intermediate_size": None,
        "checkpoint.gate_up": "fused",
    },
    "qwen3_moe": {
        **MOE_LIKE,
        "attention.qk_norm": "per_head",
        "moe.num_experts": 4,
        "moe.top_k": 2,
        "moe.intermediate_size": 48,
        "moe.norm_topk_prob": True,
        "moe.shared_experts": 0,
        "moe.shared_expert_gate": False,
        "checkpoint.gate_up": "fused",
    },
    "qwen2_moe": {
        **MOE_LIKE,
        "attention.qkv_bias": True,
        "moe.num_experts": 4,
        "moe.top_k": 2,
        "moe.intermediate_size": 48,
        "moe.norm_topk_prob": False,
        "moe.shared_experts": 1,
        "moe.shared_expert_gate": True,
        "checkpoint.gate_up": "fused",
        # the canonical names are Qwen3-MoE's: Qwen2-MoE names its one shared expert in the singular
        "checkpoint.key_map": {"mlp.shared_experts": "mlp.shared_expert"},
    },
    "gpt_oss": {
        **MOE_LIKE,
        "attention.qkv_bias": True,
        "attention.o_bias": True,
        "attention.sinks": True,
        "attention.sliding_window": "per_layer",
        "attention.sliding_window_size": 32,
        "rope.type": "yarn",
        "moe.num_experts": 4,
        "moe.top_k": 2,
        "moe.router_bias": True,
        "moe.norm_topk_prob": True,
        "moe.router_activation": "softmax",
        "mlp.bias": True,
        "mlp.glu": "clamped_swiglu",
        "mlp.glu_alpha": 1.702,
        "mlp.glu_limit": 7.0,
        "checkpoint.gate_up": "fused",
        "checkpoint.key_map": {"mlp.gate": "mlp.router"},  # the router's key, read from the header
    },
    "phi": {
        **LLAMA_LIKE,
        "norm.kind": "layernorm",
        "norm.bias": True,
        "norm.eps_key": "layer_norm_eps",
        "attention.qkv_bias": True,
        "attention.o_bias": True,
        "rope.partial_rotary_factor": 0.5,
        "mlp.kind": "plain",
        "mlp.activation": "gelu_tanh",
        "mlp.bias": True,
        "lm_head.bias": True,
        "residual.parallel": "shared_norm",
        "checkpoint.key_map": {
            "self_attn.o_proj": "self_attn.dense",
            "mlp.up_proj": "mlp.fc1",
            "mlp.down_proj": "mlp.fc2",
            "model.norm": "model.final_layernorm",
        },
    },
    "cohere": {
        **LLAMA_LIKE,
        "norm.kind": "layernorm",
        "norm.bias": False,
        "norm.eps_key": "layer_norm_eps",
        "rope.style": "interleaved",
        "residual.parallel": "shared_norm",
        "lm_head.logits_divisor": 8.0,
        "lm_head.logits_key": "logit_scale",
        "lm_head.logits_form": "multiplier",
        "embedding.tied": True,
    },
    "olmo": {
        **LLAMA_LIKE,
        "norm.kind": "layernorm",
        "norm.bias": False,
        "norm.eps": 1e-5,
        "norm.fixed_eps": 1e-5,  # F.layer_norm(..., eps=1e-5): a constant of the code, no config field
        "norm.affine": False,
    },
    "smollm3": {**LLAMA_LIKE, "rope.nope_layers": (1,)},
    "gemma_tied": {
        **LLAMA_LIKE,
        "norm.unit_offset": True,
        "embedding.scale": "sqrt_hidden",
        "mlp.activation": "gelu_tanh",
        "embedding.tied": True,
        "checkpoint.lm_head_stored": False,
    },
}
# what a source could not classify, by design of the model (never guessed)
EXPECTED_UNKNOWN: dict[str, set[str]] = {}


def test_at_least_fifteen_architectures():
    assert len({model_type for model_type, _ in ARCHITECTURES.values()}) >= 15


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detected_spec(tiny, name):
    result = tiny.research(name)
    mismatches = {
        path: (get_field(result.spec, path), want)
        for path, want in EXPECTED[name].items()
        if get_field(result.spec, path) != want
    }
    assert not mismatches, f"{name}: detected != expected: {mismatches}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_unknowns_are_reported_not_guessed(tiny, name):
    result = tiny.research(name)
    assert set(result.unknown) == EXPECTED_UNKNOWN.get(name, set())
    for field in result.unknown:
        decision = result.decision(field)
        assert decision is not None and decision.confidence == "unknown" and decision.evidence


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tiny_checkpoints_raise_no_conflict(tiny, name):
    # config, code and checkpoint of an untouched checkpoint agree
    result = tiny.research(name)
    assert [c for c in result.conflicts if c.severity == "error"] == []


@pytest.mark.parametrize(
    "name, field",
    [
        ("gemma", "norm.unit_offset"),
        ("stablelm", "norm.kind"),
        ("cohere", "norm.kind"),
        ("olmo2", "norm.placement"),
        ("gpt_neox", "residual.parallel"),
        ("qwen2", "attention.qkv_bias"),
        ("granite", "residual.multiplier"),
        ("gpt_oss", "attention.sinks"),
        ("qwen2_moe", "moe.shared_expert_gate"),
    ],
)
def test_features_come_from_the_code(tiny, name, field):
    decision = tiny.research(name).decision(field)
    assert decision.source == "code"
    assert "modeling_" in decision.evidence or "torch.nn" in decision.evidence


def test_sizes_come_from_the_config(tiny):
    result = tiny.research("llama")
    assert result.decision("norm.eps").source == "config"
    assert result.spec.rope.theta == 10000.0
    assert (
        result.spec.hidden_size == 64
        and result.spec.num_layers == 2
        and result.spec.embedding.vocab_size == 320
    )


def test_gpt_oss_clamped_swiglu_is_read_from_the_code(tiny):
    """GPT-OSS's experts compute gate.clamp(max=L) * sigmoid(alpha * gate) *
    (up.clamp(-L, L) + 1): the research names that computation (mlp.glu),
    with alpha and L as the code evaluates them, instead of leaving the
    activation unknown."""
    result = tiny.research("gpt_oss")
    glu = result.decision("mlp.glu")
    assert glu.source == "code" and glu.value == "clamped_swiglu"
    assert "clamp" in glu.evidence and "sigmoid" in glu.evidence
    assert result.decision("mlp.activation").value == "silu"
    assert result.spec.unsupported is None


def test_checkpoint_findings(tiny):
    phi3 = tiny.research("phi3")
    assert phi3.finding("checkpoint.fused_qkv").value is True
    assert phi3.finding("checkpoint.fused_gate_up").value is True
    qwen2 = tiny.research("qwen2")
    assert "model.layers.*.self_attn.q_proj" in qwen2.finding("checkpoint.bias_modules").value
    assert "model.layers.*.self_attn.o_proj" not in qwen2.finding("checkpoint.bias_modules").value
    assert tiny.research("gemma").finding("checkpoint.lm_head_stored").value is False
    assert tiny.research("llama").finding("checkpoint.lm_head_stored").value is True
    assert tiny.research("qwen3_moe").finding("checkpoint.expert_layout").value == "stacked"


def test_parameter_count_from_the_header(tiny):
    import math

    from safetensors import safe_open

    result = tiny.research("qwen3_moe")
    path = tiny.directory("qwen3_moe") / "model.safetensors"
    with safe_open(str(path), "pt") as handle:
        total = sum(math.prod(handle.get_slice(k).get_shape()) for k in handle.keys())
    assert result.parameters.source == "checkpoint"
    assert result.parameters.total == total
    assert 0 < result.parameters.experts < total


def test_research_is_deterministic(tiny):
    from autoport_cst.research import research
    from autoport_cst.research.pipeline import to_data

    directory = str(tiny.directory("gpt_oss"))
    assert to_data(research(directory)) == to_data(research(directory))


def test_plain_swiglu_experts_are_not_clamped(tiny):
    """The clamped form is recognised by its arithmetic only: experts that
    compute act(gate) * up (Qwen3-MoE, Mixtral) stay standard."""
    for name in ("qwen3_moe", "mixtral"):
        spec = tiny.research(name).spec
        assert spec.mlp.glu == "standard" and spec.mlp.glu_alpha is None, name
