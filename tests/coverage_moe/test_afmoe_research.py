"""AfMoE, read by what its attention computes: RoPE on the layers
``config.layer_types`` makes slide, whether or not a window is set (``if
self.is_local_attention:``: spec ``rope.nope_rule = "layer_type"``), and a
gate on the attention output (``output * sigmoid(gate_proj(x))``), which
once read as extra KV heads ([64, 32, 32, 64] as 4 KV heads where the config
says 2). The gate is read as what a port computes (spec
``attention.output_gate = "sigmoid"``, its module the checkpoint's
``self_attn.gate_proj``), not as KV heads, and no longer blocks the plan."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    from autoport_cst.validate import build_tiny_checkpoint

    directory = tmp_path_factory.mktemp("afmoe") / "src"
    build_tiny_checkpoint("AfmoeForCausalLM", directory, seed=0)
    return directory


def _findings(source: Path) -> dict:
    from autoport_cst.research.code_analysis import analyze_code
    from autoport_cst.research.config_analysis import analyze_config, read_config, resolve_config
    from autoport_cst.research.sources import locate_modeling_source

    path = source / "config.json"
    raw = read_config(path)
    resolved = resolve_config(raw, str(path))
    cfg = analyze_config(raw, resolved, str(path))
    code = analyze_code(locate_modeling_source("afmoe", str(path)), resolved, cfg.architecture, cfg.dims)
    return {f.field: f for f in code.findings}


def test_the_sliding_layers_rotate_whatever_the_window(source):
    found = _findings(source)
    assert found["rope.nope_rule"].value == "layer_type"
    assert "self.is_local_attention" in found["rope.nope_rule"].evidence


def test_the_output_gate_is_read_not_as_kv_heads(source):
    found = _findings(source)
    gate = found["attention.output_gate"]
    assert gate.known and gate.value == "sigmoid" and "gate_proj" in gate.evidence
    assert "unsupported.attention_output_gate" not in found
    heads = found.get("attention.num_kv_heads")
    assert heads is None or heads.value == 2


def test_the_plan_realizes_the_gate_from_the_checkpoints_key(source):
    from autoport_cst.research import choose_reference, research
    from autoport_cst.transform.library import realizing

    found = research(str(source))
    assert found.spec.attention.output_gate == "sigmoid"
    # the port's canonical gate_proj is the checkpoint's own key: no rename
    assert "self_attn.gate_proj" not in (found.spec.checkpoint.key_map or {})
    assert "model.layers.*.self_attn.gate_proj.weight" in found.checkpoint_keys
    choice = choose_reference(found.spec, "afmoe", found.architecture, found=found)
    qwen3_moe = choice.candidate("qwen3_moe")
    assert qwen3_moe is not None and "attention.output_gate" not in qwen3_moe.blocking
    plans = {f.path: f.how for f in qwen3_moe.fields}
    assert plans["attention.output_gate"] == "codemod attention-output-gate"
    assert [c.ID for c in realizing("attention.output_gate")] == ["attention-output-gate"]
