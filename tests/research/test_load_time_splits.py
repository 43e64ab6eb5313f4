"""Tensors transformers splits at load time (its checkpoint conversion):
HRM-Text's code builds separate gate/up and q/k/v projections (and an
output gate), but its checkpoints, as transformers saves them, store
``mlp.gate_up_proj`` and ``attn.gqkv_proj`` (output gate, q, k and v in one
tensor), chunked at load. Research stated both 'separate' for a
config-only checkpoint, and q/k/v 'separate' for a saved one; the layout is
now read from transformers' conversion: gate/up fused ([gate | up], the
spec's fused rows), q/k/v unknown (a fused [gate | q | k | v] is no spec
layout). A checkpoint holding the code's own tensors stays separate."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def hrm(tmp_path_factory):
    """HRM-Text's tiny checkpoint in both key formats (the same tensors),
    and a config.json-only copy."""
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("hrm")
    for key_format in ("saved", "model"):
        build_tiny_checkpoint("hrm_text", root / key_format, seed=0, key_format=key_format)
    (root / "config").mkdir()
    (root / "config" / "config.json").write_text((root / "saved" / "config.json").read_text())
    return root


def _research(directory):
    from autoport_cst.research import research

    return research(str(directory))


def test_transformers_saves_hrm_text_fused(hrm):
    """What the split's order means, measured on transformers' own save:
    the stored tensors are the code's projections stacked in the order the
    conversion names them."""
    from safetensors.torch import load_file

    saved = load_file(str(hrm / "saved" / "model.safetensors"))
    model = load_file(str(hrm / "model" / "model.safetensors"))
    layer = "model.L_module.layers.0"
    assert f"{layer}.mlp.gate_proj.weight" not in saved
    expected_gate_up = torch.cat([model[f"{layer}.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    assert torch.equal(saved[f"{layer}.mlp.gate_up_proj.weight"], expected_gate_up)
    gqkv = torch.cat([model[f"{layer}.self_attn.{p}_proj.weight"] for p in ("gate", "q", "k", "v")])
    assert torch.equal(saved[f"{layer}.attn.gqkv_proj.weight"], gqkv)


@pytest.mark.parametrize("checkpoint", ["config", "saved"])
def test_fused_tensors_split_at_load_are_read_from_the_conversion(hrm, checkpoint):
    result = _research(hrm / checkpoint)
    layout = result.spec.checkpoint
    assert layout.gate_up == "fused" and "checkpoint.gate_up" not in result.unknown
    gate_up = result.decision("checkpoint.gate_up")
    assert gate_up.known and "mlp.gate_up_proj" in gate_up.evidence
    assert "checkpoint.qkv" in result.unknown
    qkv = result.decision("checkpoint.qkv")
    assert not qkv.known and "attn.gqkv_proj" in qkv.evidence and "self_attn.gate_proj" in qkv.evidence


def test_a_checkpoint_holding_the_code_s_tensors_is_separate(hrm):
    result = _research(hrm / "model")
    assert result.spec.checkpoint.gate_up == "separate" and result.spec.checkpoint.qkv == "separate"
    assert "checkpoint.qkv" not in result.unknown and "checkpoint.gate_up" not in result.unknown


def test_no_load_time_split_leaves_the_layout_to_the_code(tmp_path):
    """A model type without a load-time split (Llama) keeps its layout."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("llama", num_hidden_layers=2).to_dict()
    config["architectures"] = ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = _research(tmp_path)
    assert result.spec.checkpoint.gate_up == "separate" and result.spec.checkpoint.qkv == "separate"
    assert "transformers' checkpoint conversion" not in result.decision("checkpoint.gate_up").evidence
