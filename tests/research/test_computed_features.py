"""Features read from what the code computes, not from how it is written:
norms written with ``torch.pow(x, -0.5)``, RoPE by complex multiplication,
experts multiplied with ``torch.bmm``, a clamped-SwiGLU shared expert and a
routed scaling applied in the MoE block, sinks on some layers only, a norm
between the MLP's projections or on the attention's values. Each was read
as another (wrong) value before; where the research cannot tell, it says
unknown. The checkpoints are config.json only (the code analysis needs no
weights), with the transformers class defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")


def _research(tmp_path: Path, model_type: str, **values):
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from autoport_cst.research import research

    config = AutoConfig.for_model(model_type, **values).to_dict()
    config["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    directory = tmp_path / model_type
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return research(str(directory))


def _unsupported(result) -> str:
    return "\n".join(result.spec.unsupported or ())


def _rmsnorm_weight_form(module_path: str, norm_class: str) -> str:
    """What transformers' norm class computes, measured: ``x * weight`` or
    ``x * (1 + weight)`` after dividing by the root mean square."""
    import importlib

    import torch

    norm = getattr(importlib.import_module(module_path), norm_class)(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(-0.5, 0.7, 8))
        x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        out = norm(x)
    if torch.allclose(out, normed * norm.weight, atol=1e-5):
        return "weight"
    if torch.allclose(out, normed * (1 + norm.weight), atol=1e-5):
        return "1 + weight"
    return "other"


@pytest.mark.parametrize(
    ("model_type", "module_path", "norm_class"),
    [
        ("gemma3n_text", "transformers.models.gemma3n.modeling_gemma3n", "Gemma3nRMSNorm"),
        ("gemma4_text", "transformers.models.gemma4.modeling_gemma4", "Gemma4RMSNorm"),
    ],
)
def test_qk_norms_written_with_a_power_of_minus_one_half_are_rmsnorms(
    tmp_path, model_type, module_path, norm_class
):
    """Gemma 3n's and Gemma 4's RMSNorm divides by torch.pow(mean_squared,
    -0.5) and multiplies by its weight (measured on transformers' class):
    their q/k norms are per-head RMSNorms with a plain learned weight,
    applied before RoPE. Gemma 4's were read as unknown (its head_dim comes
    from ``config.per_layer_config[layer_idx]``, which the interpreter did
    not follow); the placement was the spec's default, not read, and the
    weight's form not read at all. The norm on the values is named as what
    no spec field describes."""
    assert _rmsnorm_weight_form(module_path, norm_class) == "weight"
    result = _research(tmp_path, model_type)
    attention = result.spec.attention
    assert attention.qk_norm == "per_head" and "attention.qk_norm" not in result.unknown
    assert result.finding("attention.qk_norm").known
    position = result.finding("attention.qk_norm_position")
    assert position is not None and position.known and position.value == "before_rope"
    assert attention.qk_norm_position == "before_rope" and attention.qk_norm_affine is True
    offset = result.finding("code.qk_norm_unit_offset")
    assert offset is not None and offset.known and offset.value is False
    assert result.spec.norm.kind == "rmsnorm" and result.spec.norm.unit_offset is False
    assert "q/k norms that are not RMSNorms" not in _unsupported(result)
    assert "q/k norms weighted unlike the layer norms" not in _unsupported(result)
    assert "a norm applied to the attention's values" in _unsupported(result)


@pytest.mark.parametrize("model_type", ["deepseek_v2", "llama4_text"])
def test_rope_by_complex_multiplication_is_interleaved(tmp_path, model_type):
    """view_as_complex(x.reshape(..., -1, 2)) * freqs_cis rotates adjacent
    pairs: interleaved RoPE (read as no RoPE at all before)."""
    result = _research(tmp_path, model_type)
    assert result.spec.rope.type != "none"
    assert result.spec.rope.style == "interleaved"


def test_experts_multiplied_with_bmm_are_gated_and_fused(tmp_path):
    """Llama 4's experts: bmm(x, gate_up_proj).chunk(2), up * act(gate)."""
    result = _research(tmp_path, "llama4_text")
    assert result.spec.mlp.kind == "gated"
    assert result.finding("code.fused_gate_up").value is True


def test_a_clamped_swiglu_shared_expert_and_a_block_scaling_are_read(tmp_path):
    """MiniMax M3: a shared expert computing the clamped SwiGLU (no
    activation function called) and the experts' output multiplied by
    routed_scaling_factor in the block, not in the router."""
    result = _research(tmp_path, "minimax_m3_vl_text", routed_scaling_factor=2.5)
    assert result.spec.moe.shared_experts == 1
    assert result.spec.moe.routed_scaling_factor == 2.5


def test_sinks_on_some_layers_only_are_unknown_not_absent(tmp_path):
    """MiMo-V2-Flash passes sinks to the kernel on its sliding-window
    layers only; the first layer has none."""
    result = _research(tmp_path, "mimo_v2_flash", num_hidden_layers=2, hybrid_layer_pattern=[0, 1])
    assert "attention.sinks" in result.unknown


def test_a_norm_between_the_mlp_projections_is_refused(tmp_path):
    """BitNet normalises act(gate) * up before down_proj."""
    result = _research(tmp_path, "bitnet")
    assert "a norm inside the MLP before its output projection" in _unsupported(result)


def test_rope_frequencies_rewritten_in_place_are_unknown(tmp_path):
    """Cohere Compass recomposes its cos/sin tables from sections of other
    axes with in-place slice writes the interpreter does not follow: the
    style is unknown (it was planned as plain rotate-half)."""
    result = _research(tmp_path, "cohere_compass_text")
    assert "rope.style" in result.unknown


def test_inkling_routed_experts_are_the_module_that_selects_per_expert(tmp_path):
    """Inkling's MoE block holds two modules of 3-D expert parameters: the
    routed experts (one expert's fused gate_up chosen by index) and two
    shared experts stacked (every token, torch.bmm). The shared stack was
    read as the experts (2 experts, separate gate/up, no shared expert) and
    the routing bias added as ``self.e_score_correction_bias.float()`` as
    none; the shared stack is refused by name."""
    from transformers import AutoConfig

    from autoport_cst.research import research
    from autoport_cst.validate.tiny import shrink_config, write_config_json

    config = shrink_config(AutoConfig.for_model("inkling_text"), "InklingForCausalLM")
    directory = tmp_path / "inkling"
    directory.mkdir()
    write_config_json(config, directory / "config.json")
    result = research(str(directory))
    moe = result.spec.moe
    assert moe is not None and moe.num_experts == config.n_routed_experts
    assert moe.shared_experts == config.n_shared_experts
    assert moe.routing_bias is True
    assert result.spec.mlp.kind == "gated" and result.spec.checkpoint.gate_up == "fused"
    assert any(u.startswith("stacked_shared_experts: ") for u in result.spec.unsupported or ())


def _inkling_router_weights(config, global_scale: float):
    """transformers' Inkling router run on random input: the k routed
    weights and the shared experts' gammas."""
    import torch
    from transformers.models.inkling.modeling_inkling import InklingTopkRouter

    router = InklingTopkRouter(config)
    with torch.no_grad():
        router.weight.normal_(generator=torch.Generator().manual_seed(0))
        router.global_scale.fill_(global_scale)
        x = torch.randn(5, config.hidden_size, generator=torch.Generator().manual_seed(1))
        _, weights, _, gammas = router(x)
    return weights, gammas


def test_inkling_routing_weights_normalised_with_the_shared_experts_are_not_stated(tmp_path):
    """Inkling's router normalises the k chosen experts' sigmoid weights
    together with the shared experts' (exp(x - logsumexp(x)) over both,
    then cut), and scales them by route_scale and the learned global_scale
    (measured on transformers' router). Research stated the k weights not
    renormalised (norm_topk_prob False) and scaled by route_scale alone, as
    certain; both are now unknown, with the reason, and the plan refused."""
    import torch
    from transformers import AutoConfig

    from autoport_cst.research import research
    from autoport_cst.validate.tiny import shrink_config, write_config_json

    config = shrink_config(AutoConfig.for_model("inkling_text"), "InklingForCausalLM")
    config.route_scale = 1.0
    weights, gammas = _inkling_router_weights(config, 1.0)
    total = weights.float().sum(-1) + gammas.float().sum(-1)
    assert torch.allclose(total, torch.ones_like(total), atol=1e-5)  # normalised together
    assert not torch.allclose(weights.float().sum(-1), torch.ones(5), atol=1e-2)  # the k alone: not
    doubled, _ = _inkling_router_weights(config, 2.0)
    assert torch.allclose(doubled, 2 * weights, atol=1e-6)  # the learned scale multiplies them

    directory = tmp_path / "inkling"
    directory.mkdir()
    write_config_json(config, directory / "config.json")
    result = research(str(directory))
    assert result.spec.moe is not None and result.spec.moe.router_activation == "sigmoid"
    for field in ("moe.norm_topk_prob", "moe.routed_scaling_factor"):
        assert field in result.unknown
        assert not result.finding(field, "code").known
    assert "together with" in result.finding("moe.norm_topk_prob", "code").evidence
    assert "global_scale" in result.finding("moe.routed_scaling_factor", "code").evidence
    unsupported = _unsupported(result)
    assert "moe.norm_topk_prob: " in unsupported and "moe.routed_scaling_factor: " in unsupported
