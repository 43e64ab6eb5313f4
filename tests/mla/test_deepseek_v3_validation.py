"""The deepseek_v3 reference validates against transformers' DeepseekV3ForCausalLM
(tests/mla/conftest.py's tiny checkpoint): TP=1 fp32 by default; bf16, TP=2,
expert parallelism, data parallelism and the config variants it declares (RoPE types, tied
embeddings, expert key layout) opt-in (slow). norm_topk_prob is no declared
variant: a model may not read it (DeepSeek-V2), so a port fixes it (norm-topk-prob)
or guards it."""

from __future__ import annotations

import pytest

from autoport_cst.validate import validate_model

from .conftest import REFERENCE

# validations on one checkpoint share its transformers run (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("shared_reference_runs")


def _failure(report) -> str:
    return f"{report.first_diverging} {report.failure} {report.failed_checks}"


def test_tp1_fp32_validates_prefill_expanded_and_decode_absorbed(tiny_deepseek_v3):
    report = validate_model(
        REFERENCE, tiny_deepseek_v3, steps=8, config_variants=False, parallel_layouts=False
    )
    assert report.equivalent, _failure(report)
    compared = {component["name"] for component in report.components}
    assert {"layers.0.q_latent", "layers.0.kv_latent", "layers.3.kv_latent"} <= compared
    calls = report.environment["stand_in"]["kernel_calls"]
    assert calls["prefill"]["flash_attention"] > 0 and "mla_decode_attention" not in calls["prefill"]
    assert calls["decode"]["mla_decode_attention"] > 0 and calls["decode"]["mla_absorb"] > 0
    assert "flash_attention" not in calls["decode"]


@pytest.mark.slow
def test_bf16_validates(tiny_deepseek_v3):
    report = validate_model(REFERENCE, tiny_deepseek_v3, dtype="bf16", steps=8)
    assert report.equivalent, _failure(report)


@pytest.mark.slow
def test_tp2_validates(tiny_deepseek_v3):
    report = validate_model(REFERENCE, tiny_deepseek_v3, tp=2, steps=8, config_variants=False)
    assert report.equivalent, _failure(report)


@pytest.mark.slow
def test_default_run_validates_every_declared_variant_and_layout(tiny_deepseek_v3):
    report = validate_model(REFERENCE, tiny_deepseek_v3, steps=8)
    assert report.equivalent, _failure(report)
    labels = {entry["label"]: entry["equivalent"] for entry in report.config_variants}
    assert labels['rope.type="yarn"']
    # the reference's forward takes no prompt embeddings and no spec_decode_metadata (no
    # speculative decoding): those runs are reported not run
    refused = ("prompt embeddings", "2 tokens per decode step")
    embeds = [e for e in report.parallel_layouts if e["label"].startswith(refused)]
    assert len(embeds) == 3 and all(e["summary"].startswith("not run: the port refuses it") for e in embeds)
    others = [e for e in report.parallel_layouts if e not in embeds]
    assert [e["label"] for e in others][-1] == "EP 2 at TP=2"
    assert all(entry["equivalent"] for entry in others), report.parallel_layouts


@pytest.mark.slow
def test_tp2_with_expert_parallelism_2_validates(tiny_deepseek_v3):
    """EP=2 inside TP=2: each rank loads and runs its 2 of the 4 experts."""
    report = validate_model(REFERENCE, tiny_deepseek_v3, tp=2, ep=2, steps=8, config_variants=False)
    assert report.equivalent, _failure(report)
    layout = report.environment["stand_in"]["expert_parallel"]
    assert layout["ep_degree"] == 2 and layout["read_by_model"]
