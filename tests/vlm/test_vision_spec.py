"""The spec's vision section: research reads a vision-language checkpoint's
tower from what transformers' modules compute, qwen3_vl's reference.json
declares it, and the reference choice keeps text and vision-language models
apart (a text-only model never takes qwen3_vl; a VLM takes only a vision
reference or is refused naming the tower's features)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from autoport_cst.apply.reference import load_reference
from autoport_cst.research import vision_tower as vt
from autoport_cst.research.reference_choice import choose_reference, vision_mismatch
from autoport_cst.spec import ArchSpec, VisionSpec, diff_specs, from_json, to_json

from .conftest import QWEN_VL_ARCHITECTURES


def _meta_model(architecture: str):
    import transformers

    from autoport_cst.research.vlm import component_paths, meta_model
    from autoport_cst.validate.vision_tiny import tiny_vlm_config

    config = tiny_vlm_config(architecture)
    model = meta_model(config, architecture, "tiny")
    assert isinstance(model, getattr(transformers, architecture))
    return model, component_paths(model, config)


@pytest.fixture(scope="module")
def visions() -> dict[str, VisionSpec]:
    from autoport_cst.research.vision import read_vision

    found = {}
    for architecture in QWEN_VL_ARCHITECTURES:
        model, paths = _meta_model(architecture)
        spec, findings = read_vision(model, paths["tower"], paths["text"], paths)
        assert spec is not None, [f for f in findings if not f.known]
        found[architecture] = spec
    return found


def test_the_vision_section_round_trips_through_json():
    spec = ArchSpec(vision=VisionSpec(depth=27, attention="window", full_attention_blocks=(7, 15)))
    loaded, problems = from_json(ArchSpec, to_json(spec))
    assert problems == [] and loaded == spec
    assert from_json(ArchSpec, {"vision": {"attention": "sliding"}})[1]  # not a tower attention kind


def test_norm_and_activation_are_read_by_what_they_compute():
    assert vt.norm_kind(nn.LayerNorm(8)) == "layernorm"
    assert vt.norm_kind(nn.RMSNorm(8)) == "rmsnorm"
    assert vt.activation_of(nn.GELU(approximate="tanh")) == "gelu_tanh"
    assert vt.activation_of(nn.GELU()) == "gelu"
    assert vt.activation_of(lambda x: x * torch.sigmoid(1.702 * x)) == "quick_gelu"
    assert vt.activation_of(torch.tanh) is None


def test_qwen3_vl_tower(visions):
    v = visions["Qwen3VLForConditionalGeneration"]
    assert (v.norm, v.norm_bias, v.mlp_kind, v.activation) == ("layernorm", True, "plain", "gelu_tanh")
    assert (v.patch_bias, v.positions, v.attention) == (True, "learned_and_rope_2d", "full")
    assert (v.merger_norm, v.deepstack, v.deepstack_layers) == ("layernorm", True, (0, 1))
    assert (v.patch_size, v.temporal_patch_size, v.spatial_merge_size, v.depth) == (4, 2, 2, 3)
    assert v.mrope_section == (4, 2, 2) and v.mrope_interleaved is True
    assert (v.text_prefix, v.tower_prefix) == ("model.language_model", "model.visual")
    assert v.config_keys is None and v.module_names["merger_norm"] == "merger.norm"


def test_qwen2_5_vl_tower(visions):
    v = visions["Qwen2_5_VLForConditionalGeneration"]
    assert (v.norm, v.norm_bias, v.mlp_kind, v.activation) == ("rmsnorm", False, "gated", "silu")
    assert (v.patch_bias, v.positions, v.merger_norm, v.deepstack) == (False, "rope_2d", "rmsnorm", False)
    assert v.attention == "window" and v.full_attention_blocks == (1,) and v.window_size
    assert v.mrope_interleaved is False
    # the gate told from the up projection by what the activation does to it
    assert (v.module_names["mlp_gate"], v.module_names["mlp_up"]) == ("mlp.gate_proj", "mlp.up_proj")
    assert v.config_keys is None


def test_qwen2_vl_tower(visions):
    v = visions["Qwen2VLForConditionalGeneration"]
    assert (v.norm, v.mlp_kind, v.activation, v.attention) == ("layernorm", "plain", "quick_gelu", "full")
    assert (v.patch_bias, v.positions, v.merger_norm, v.deepstack) == (False, "rope_2d", "layernorm", False)
    assert v.mrope_interleaved is False
    assert v.module_names == {
        "mlp_up": "mlp.fc1",
        "mlp_down": "mlp.fc2",
        "merger_norm": "merger.ln_q",
        "merger_fc1": "merger.mlp.0",
        "merger_fc2": "merger.mlp.2",
    }
    # the tower width under embed_dim, the merged width under hidden_size, the MLP by its ratio
    assert v.config_keys == {
        "hidden_size": "embed_dim",
        "out_hidden_size": "hidden_size",
        "intermediate_size": "embed_dim * mlp_ratio",
    }


def test_qwen3_vl_reference_declares_the_tower_qwen3_vl_has(visions):
    reference = load_reference("qwen3_vl")
    assert reference.spec.vision is not None
    assert (
        diff_specs(
            reference.spec,
            dataclasses.replace(reference.spec, vision=visions["Qwen3VLForConditionalGeneration"]),
        )
        == []
    )


def test_text_only_models_never_take_a_vision_reference():
    text = load_reference("qwen3").spec
    assert vision_mismatch(load_reference("qwen3_vl").spec, text) is not None
    choice = choose_reference(text, "qwen3", "Qwen3ForCausalLM", refs=["qwen3", "qwen3_vl"])
    assert choice.chosen == "qwen3" and choice.realizable
    assert "text-only model" in choice.candidate("qwen3_vl").error


def test_a_vlm_without_a_vision_reference_is_refused_naming_the_tower():
    vlm = load_reference("qwen3_vl").spec
    choice = choose_reference(vlm, "vlm", "Qwen3VLForConditionalGeneration", refs=["qwen3", "llama3"])
    assert not choice.realizable and "vision tower" in choice.reason


def test_the_qwen2_family_towers_take_qwen3_vl_by_codemods(visions):
    """Qwen2-VL's and Qwen2.5-VL's tower and M-RoPE differences are all realized
    (tests/vlm/test_vision_codemods.py ports and validates both)."""
    reference = load_reference("qwen3_vl").spec
    for architecture in ("Qwen2_5_VLForConditionalGeneration", "Qwen2VLForConditionalGeneration"):
        target = dataclasses.replace(reference, vision=visions[architecture])
        choice = choose_reference(target, "vlm", architecture, refs=["qwen3_vl", "qwen3"])
        assert choice.chosen == "qwen3_vl" and choice.realizable, choice.reason


def test_a_tower_difference_no_codemod_realizes_blocks_by_name(visions):
    reference = load_reference("qwen3_vl").spec
    tower = dataclasses.replace(visions["Qwen2VLForConditionalGeneration"], activation="relu")
    target = dataclasses.replace(reference, vision=tower)
    choice = choose_reference(target, "vlm", "Qwen2VLForConditionalGeneration", refs=["qwen3_vl", "qwen3"])
    assert not choice.realizable
    assert set(choice.candidate("qwen3_vl").blocking) == {"vision.activation"}


def _plan(tmp_path, architecture: str):
    from click.testing import CliRunner

    from autoport_cst.cli import cli
    from autoport_cst.validate.vision_tiny import build_tiny_vlm_checkpoint

    checkpoint = build_tiny_vlm_checkpoint(tmp_path / "ckpt", seed=0, architecture=architecture)
    out = tmp_path / "plan.json"
    return CliRunner().invoke(cli, ["plan", str(checkpoint), "-o", str(out)]), out


def test_plan_of_a_tiny_qwen3_vl_takes_qwen3_vl_with_an_empty_diff(tmp_path):
    import json

    result, out = _plan(tmp_path, "Qwen3VLForConditionalGeneration")
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())
    assert plan["reference"] == "qwen3_vl" and plan["steps"] == []
    assert "realizable with 0 field(s) needing a codemod (none) and 0 read from the config" in result.output
    assert "vision tower (104,128 parameters): tower TP 1" in result.output  # sized apart from the decoder
    found, _ = from_json(ArchSpec, plan["spec"])
    assert found.vision.deepstack and found.vision.mrope_interleaved
    assert diff_specs(load_reference("qwen3_vl").spec, found) == []


@pytest.mark.slow
def test_the_qwen3_vl_port_registers_its_conditional_generation_class(tmp_path):
    """The registry imports the class the package exports (Qwen3VlForConditionalGeneration, not a
    ForCausalLM it does not define) under the checkpoint's architecture string; the port validates."""
    from click.testing import CliRunner

    from autoport_cst.cli import cli

    result, plan = _plan(tmp_path, "Qwen3VLForConditionalGeneration")
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    applied = CliRunner().invoke(cli, ["apply", "--plan", str(plan), "--out", str(out)])
    assert applied.exit_code == 0, applied.output
    registry = (out / "vllm_neuron" / "model" / "registry.py").read_text()
    assert "from .qwen3_vl import Qwen3VlForConditionalGeneration" in registry
    assert '("Qwen3VLForConditionalGeneration", Qwen3VlForConditionalGeneration)' in registry
    exported = (out / "vllm_neuron" / "model" / "qwen3_vl" / "__init__.py").read_text()
    assert "from .factory import Qwen3VlForConditionalGeneration" in exported
    port = out / "vllm_neuron" / "model" / "qwen3_vl"
    validated = CliRunner().invoke(cli, ["validate", str(port), "--hf", str(tmp_path / "ckpt")])
    assert validated.exit_code == 0, validated.output
    assert "equivalent" in validated.output
