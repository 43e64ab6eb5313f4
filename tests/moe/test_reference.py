"""The qwen3_moe reference validates against Qwen3MoeForCausalLM: float32 and
bfloat16, one rank and two, on the layout transformers saves (fused expert
tensors) and on the per-expert layout of released checkpoints."""

from __future__ import annotations

import pytest

from autoport_cst.validate import validate_model

from .conftest import QWEN3_MOE, hub_layout, tiny

# validations on one checkpoint share its transformers run (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("shared_reference_runs")

STEPS = 8


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_reference_validates(tiny_qwen3_moe, dtype):
    report = validate_model(QWEN3_MOE, tiny_qwen3_moe, dtype=dtype, steps=STEPS)
    assert report.equivalent, report.summary()
    assert report.unused_checkpoint_keys == []
    compared = {c["name"] for c in report.components}
    assert {"layers.0.mlp", "layers.1.mlp", "logits"} <= compared


@pytest.mark.slow
def test_reference_validates_on_two_ranks(tiny_qwen3_moe):
    """(The qwen2_moe port's two-rank test, in the default run, covers the same
    experts code.)"""
    report = validate_model(QWEN3_MOE, tiny_qwen3_moe, tp=2, dtype="fp32", steps=STEPS)
    assert report.equivalent, report.summary()


@pytest.mark.slow
def test_reference_validates_on_two_ranks_bf16(tiny_qwen3_moe):
    report = validate_model(QWEN3_MOE, tiny_qwen3_moe, tp=2, dtype="bf16", steps=STEPS)
    assert report.equivalent, report.summary()


def test_per_expert_checkpoint_with_renormalized_top_k(tmp_path_factory, tmp_path):
    """Released Qwen3-MoE checkpoints store one tensor per expert and set
    norm_topk_prob; the reference reads both from the checkpoint."""
    fused = tiny(tmp_path_factory, "Qwen3MoeForCausalLM", "tiny-qwen3-moe-renorm", {"norm_topk_prob": True})
    checkpoint = hub_layout(fused, tmp_path / "hub", "qwen")
    report = validate_model(QWEN3_MOE, checkpoint, dtype="fp32", steps=STEPS)
    assert report.equivalent, report.summary()
    assert report.unused_checkpoint_keys == []


def test_reference_without_codemods_does_not_validate_against_dots1(tiny_dots1):
    """A sigmoid router with a routing bias and shared experts is a different
    computation: validation names the first MoE as the diverging component."""
    report = validate_model(QWEN3_MOE, tiny_dots1, dtype="fp32", steps=4)
    assert not report.equivalent
    assert report.first_diverging is not None
    assert report.first_diverging.component == "layers.0.mlp"
