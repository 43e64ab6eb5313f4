"""The qwen3_vl reference validates against transformers'
Qwen3VLForConditionalGeneration component by component (validate/vision_validate.py):
the M-RoPE positions, the tower's blocks, deep-stack mergers and merger, the
decoder's components and the logits, on a prompt with two images and a
text-only prompt, prefill and teacher-forced decode, TP=1 fp32 (bf16 opt-in)."""

from __future__ import annotations

import pytest

from autoport_cst.validate.vision_validate import validate_vlm

from .conftest import REFERENCE


def _failure(report) -> str:
    return f"{report.first_diverging} {report.failure_stage}: {report.failure}"


def test_tp1_fp32_validates_with_and_without_an_image(tiny_qwen3_vl):
    report = validate_vlm(REFERENCE, tiny_qwen3_vl, steps=2)
    assert report.equivalent, _failure(report)
    compared = {(check["prompt"], check["name"]) for check in report.checks}
    assert {
        ("image", "mrope_positions"),
        ("image", "vision.blocks.2"),
        ("image", "vision.deepstack.1"),
        ("image", "vision.merger"),
        ("image", "layers.2.output"),
        ("image", "logits"),
        ("text", "mrope_positions"),
        ("text", "logits"),
    } <= compared
    assert not any(name.startswith("vision.") for prompt, name in compared if prompt == "text")
    rows = {(c["prompt"], c["name"]): c.get("rows") for c in report.checks}
    assert rows[("image", "logits")] == rows[("image", "embedding")] == 24 + 2  # prompt + decode steps
    assert report.kernel_calls["decode"]["attention_decode"] > 0
    assert "attention_decode" not in report.kernel_calls["prefill"]


@pytest.mark.slow
def test_bf16_validates(tiny_qwen3_vl):
    report = validate_vlm(REFERENCE, tiny_qwen3_vl, dtype="bf16", steps=3)
    assert report.equivalent, _failure(report)
    assert all(c["gate"] == "r_ratio" for c in report.checks if "gate" in c)


def test_tp2_fp32_validates(tiny_qwen3_vl):
    """Two gloo ranks: the tower's heads and MLP and the decoder sharded, the
    prefill's sequence-parallel slices joined in rank order."""
    report = validate_vlm(REFERENCE, tiny_qwen3_vl, steps=2, tp=2)
    assert report.equivalent, _failure(report)
    assert report.tp == 2


@pytest.mark.slow
def test_tp2_bf16_validates(tiny_qwen3_vl):
    report = validate_vlm(REFERENCE, tiny_qwen3_vl, dtype="bf16", steps=2, tp=2)
    assert report.equivalent, _failure(report)


def test_another_family_fails_at_load_naming_the_key(tmp_path):
    """The reference on a Qwen2.5-VL checkpoint (no patch-embedding bias, no
    deep-stack mergers): transformers loads it, the port cannot: a port failure."""
    from autoport_cst.validate.vision_tiny import build_tiny_vlm_checkpoint

    checkpoint = build_tiny_vlm_checkpoint(tmp_path, architecture="Qwen2_5_VLForConditionalGeneration")
    report = validate_vlm(REFERENCE, checkpoint, steps=1)
    assert not report.equivalent and report.failure_stage == "load"
    assert "no tensor 'model.visual.patch_embed.proj.bias'" in report.failure
