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


def test_qk_norms_written_with_a_power_of_minus_one_half_are_rmsnorms(tmp_path):
    """Gemma 3n's RMSNorm divides by torch.pow(mean_squared, -0.5): its
    q/k norms are per-head RMSNorms (read as no q/k norm before), and its
    norm on the values is named as what no spec field describes."""
    result = _research(tmp_path, "gemma3n_text")
    assert result.spec.attention.qk_norm == "per_head"
    assert result.spec.norm.kind == "rmsnorm"
    assert "a norm applied to the attention's values" in _unsupported(result)


def test_qk_norms_the_research_cannot_size_are_unknown_not_none(tmp_path):
    result = _research(tmp_path, "gemma4_text")
    assert result.spec.attention.qk_norm != "none" or "attention.qk_norm" in result.unknown
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
