"""Architectures whose computation the spec cannot describe, or that no
codemod realizes, are refused by the planner with the feature named (the
spec field that blocks every reference), not ported and left to fail."""

from __future__ import annotations

import pytest

from autoport_cst.errors import UnrealizableDiffError
from autoport_cst.port import port
from autoport_cst.research import research
from autoport_cst.validate import build_tiny_checkpoint
from tests.validation_depth import feature_depth, port_at_depth

pytest.importorskip("transformers")

# architecture -> (blocking spec field, text its value or evidence must contain)
REFUSALS = {
    "DiffLlamaForCausalLM": ("attention.kind", "differential"),  # two softmax maps, subtracted
    "BitNetForCausalLM": ("attention.output_norm", "True"),  # attn_sub_norm before o_proj
    # (Persimmon's LayerNorm q/k norms are realized: qk-norm; tests/codemods_attention/test_persimmon_qk_layernorm.py)
    "Lfm2ForCausalLM": ("unsupported", "mlp.intermediate_size: the code builds"),  # adjusted FFN width
    # BERT-style post-LN encoder: its layers are found, its attention is one module down (attention.self),
    # the residual added and normed in RobertaSelfOutput
    "RobertaForCausalLM": ("unsupported", "sublayer_residual: RobertaAttention.forward"),
    # dynamic mask attention: a bias from dt_proj(values) scaled by the learned A, added to the scores
    "DogeForCausalLM": ("unsupported", "learned parameters in the attention computation"),
    # (Cohere 2 MoE, its layers without RoPE and its parallel residual, is realized on the MoE reference:
    # tests/coverage_moe/test_cohere2_moe_port.py)
    # (BLOOM's and MPT's ALiBi is realized: alibi-positions; Falcon-RW's stays refused: tests/coverage_dense/test_falcon.py)
    # a fixed table of sines and cosines of the positions, a buffer a function of the file fills, added to
    # the token embeddings (XGLM's, a module whose table research reads, is realized: tests/coverage_dense/test_xglm.py)
    "CTRLLMHeadModel": ("unsupported", "sinusoidal_positions: CTRLModel.forward"),
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("refusals")


@pytest.mark.parametrize("architecture", sorted(REFUSALS))
def test_refused_with_the_feature_named(architecture, workdir):
    field, text = REFUSALS[architecture]
    source = workdir / architecture
    build_tiny_checkpoint(architecture, source, seed=0)
    found = research(str(source))
    value = found.spec
    for part in field.split("."):
        value = getattr(value, part)
    assert text in str(value), value
    with pytest.raises(UnrealizableDiffError) as refused:
        port(str(source), "refused_" + architecture.lower().removesuffix("forcausallm"), workdir / "out")
    assert field in refused.value.fields, refused.value.fields
    # the message and the features name what blocks, not only the spec section
    if field == "unsupported":
        named = [entry.partition(":")[0] for entry in found.spec.unsupported]
        assert named and set(named) <= set(refused.value.features), refused.value.features
        assert all(name in str(refused.value) for name in named)
    else:
        assert field in refused.value.features


def test_nope_by_a_guard_with_a_clause_false_on_every_layer(workdir):
    """Layers without RoPE chosen by a guard that also reads other fields
    (Cohere 2 MoE's ``self.sliding_window is not None or self.force_rope``,
    force_rope from mlp_layer_types and prefix_dense_sliding_window_pattern):
    the clause false on every layer of the config is named and left out, and
    the rule is the sliding window's; the config guards refuse a dense layer."""
    source = workdir / "cohere2-moe-types"
    build_tiny_checkpoint("Cohere2MoeForCausalLM", source, seed=0)
    found = research(str(source))
    assert found.spec.rope.nope_layers == (3,) and found.spec.rope.nope_rule == "sliding"
    assert not [e for e in found.spec.unsupported or () if e.startswith("nope_layers:")]
    evidence = found.decision("rope.nope_rule").evidence
    assert "`self.force_rope`" in evidence and "config.prefix_dense_sliding_window_pattern" in evidence, (
        evidence
    )


def test_flint_is_planned_as_moe_with_dense_layers(workdir):
    """Flint's layers after the first two are MoE (mlp_only_layers [0, 1]):
    its plan is an MoE model with two dense layers, never a dense model, its
    layers without RoPE the full-attention ones (rule ``sliding``, which
    nope-layers realizes) and nothing refused: its RoPE is read on its first
    rotating layer (layer 0, full attention, takes none)."""
    source = workdir / "flint-moe"
    build_tiny_checkpoint("FlintForCausalLM", source, seed=0)
    spec = research(str(source)).spec
    assert spec.moe is not None and spec.moe.num_experts == 4 and spec.moe.top_k == 2
    assert spec.moe.dense_layers == (0, 1)
    assert spec.unsupported is None
    assert spec.rope.nope_rule == "sliding"
    assert spec.rope.style == "rotate_half" and spec.rope.partial_rotary_factor == 1.0


def test_clipped_qkv_is_refused(workdir):
    """OLMo with clip_qkv clamps the projections: the spec has no field for it."""
    import json
    import shutil

    plain = workdir / "olmo-plain"
    build_tiny_checkpoint("OlmoForCausalLM", plain, seed=0)
    clipped = workdir / "olmo-clip"
    shutil.copytree(plain, clipped)
    config = json.loads((clipped / "config.json").read_text())
    config["clip_qkv"] = 8.0
    (clipped / "config.json").write_text(json.dumps(config))
    assert research(str(plain)).spec.unsupported is None
    entries = research(str(clipped)).spec.unsupported
    assert entries and any("clip_qkv" in e for e in entries)
    with pytest.raises(UnrealizableDiffError) as refused:
        port(str(clipped), "refused_olmo_clip", workdir / "out")
    assert "unsupported" in refused.value.fields


def test_full_width_qk_norms_replace_per_head_ones(workdir, request):
    """OLMo 3 has full-width q/k norms: from the qwen3 reference, qk-norm
    removes the per-head norms and adds full-width ones."""
    source = workdir / "olmo3"
    build_tiny_checkpoint("Olmo3ForCausalLM", source, seed=0)
    assert research(str(source)).spec.attention.qk_norm == "full_width"
    outcome = port_at_depth(
        feature_depth(request.config), str(source), "port_olmo3", workdir / "out", force=True, steps=8
    )
    assert outcome.reference == "qwen3" and "qk-norm" in outcome.steps
    text = (outcome.package_dir / "model.py").read_text()
    assert "_full_width_qk_norm" in text and "rmsnorm_QK_pre_rope_enabled=True" not in text
    assert outcome.validated, [(r.dtype, r.first_diverging) for r in outcome.runs]


def test_a_failed_codemod_precondition_refuses_with_the_feature(workdir):
    """Cohere 2 MoE's LayerNorm leaves the MoE reference's fused decode kernel
    (an RMSNorm of the experts' input) for the unfused path by its experts'
    ``self.fused_decode`` flag; on a copy of the reference whose experts call
    that flag by another name the swap-norm precondition fails: the port is
    refused naming the feature and the kernel's position, and nothing is
    written."""
    import json
    import shutil
    from pathlib import Path

    reference = workdir / "renamed-flag" / "qwen3_moe"
    shutil.copytree(Path(__file__).resolve().parents[2] / "reference_models" / "qwen3_moe", reference)
    model = reference / "model.py"
    text = model.read_text(encoding="utf-8")
    assert text.count("self.fused_decode") >= 2
    model.write_text(text.replace("self.fused_decode", "self.decode_fused"), encoding="utf-8")
    source = workdir / "cohere2_moe"
    build_tiny_checkpoint("Cohere2MoeForCausalLM", source, seed=0)
    # sliding layers only: its full-attention layers take no RoPE, which research refuses first
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    config["layer_types"] = ["sliding_attention"] * len(config["layer_types"])
    (source / "config.json").write_text(json.dumps(config), encoding="utf-8")
    out = workdir / "cohere2-out"
    with pytest.raises(UnrealizableDiffError) as refused:
        port(str(source), "refused_cohere2_moe", out, ref=str(reference))
    assert "norm.kind" in refused.value.features, refused.value.features
    assert "qwen3_moe/model.py:" in str(refused.value)
    assert "has no self.fused_decode flag" in str(refused.value)
    assert not (out / "vllm_neuron" / "model" / "refused_cohere2_moe").exists()
