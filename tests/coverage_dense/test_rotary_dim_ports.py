"""GPT-J and CodeGen port and validate from tiny checkpoints of their
transformers architectures: a RoPE base written in the code (10000), interleaved rotary on
the first rotary_dim channels of each head, attention and MLP in parallel
after one LayerNorm, a biased GELU-tanh MLP beside bias-free q/k/v, an LM
head with a bias, and config fields under GPT-2's names (n_embd, n_inner =
null for 4 * n_embd, rotary_dim in channels); CodeGen's fused qkv_proj in
four groups of [q v k] rows."""

from __future__ import annotations

import json

import pytest

from autoport_cst.port import port
from autoport_cst.validate import build_tiny_checkpoint

pytest.importorskip("transformers")

GPTJ_STEPS = {
    "rope-base-default",
    "config-key-aliases",
    "interleaved-rope",
    "partial-rotary",
    "parallel-residual",
    "lm-head-bias",
    "mlp-kind",
    "mlp-bias",
    "mlp-activation",
    "swap-norm",
    "checkpoint-keys",
}


@pytest.mark.slow
def test_gptj_ports_and_validates_with_its_config_variant(tmp_path):
    """TP=1 fp32 and bf16, the four parallel layouts, and the variant of the
    fields the port reads at run time (rotary_dim among them: the port reads
    the rotated fraction from it)."""
    source = tmp_path / "gptj"
    build_tiny_checkpoint("GPTJForCausalLM", source, seed=0)
    outcome = port(str(source), "gptj", tmp_path / "out", steps=8)
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    assert GPTJ_STEPS <= set(outcome.steps), outcome.steps
    assert "rotary_dim" in (outcome.variant or {}), outcome.variant
    plan = json.loads(outcome.plan_path.read_text(encoding="utf-8"))
    assert plan["spec"]["rope"]["theta_in_code"] == 10000.0
    assert plan["spec"]["residual"]["parallel"] == "shared_norm"
    assert not any(guard["field"] in ("n_embd", "hidden_size", "rotary_dim") for guard in _guards(plan))


@pytest.mark.slow
def test_gptj_validates_on_two_ranks(tmp_path):
    source = tmp_path / "gptj"
    build_tiny_checkpoint("GPTJForCausalLM", source, seed=1)
    outcome = port(str(source), "gptj_tp2", tmp_path / "out", tp=2, checkpoint="source", steps=8)
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    assert (2, "fp32") in [(r.tp, r.dtype) for r in outcome.runs]


def _guards(plan: dict) -> list[dict]:
    return [a for s in plan["steps"] if s["codemod"] == "config-guards" for a in s["params"]["assumed"]]


@pytest.mark.slow
def test_codegen_with_groups_of_two_heads_validates_on_two_ranks(tmp_path):
    """CodeGen fuses q, k and v in one qkv_proj whose rows come in four groups
    (the model-parallel shards it was trained with), each [q v k]: with 8
    heads a group holds two heads' rows, so neither a per-head nor a
    concatenated split loads it; the port gathers each rank's rows."""
    source = tmp_path / "codegen"
    build_tiny_checkpoint("CodeGenForCausalLM", source, seed=0, dimensions={"num_attention_heads": 8})
    outcome = port(str(source), "codegen", tmp_path / "out", tp=2, checkpoint="source", steps=8)
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    assert {"fused-checkpoint", *GPTJ_STEPS} <= set(outcome.steps), outcome.steps
    plan = json.loads(outcome.plan_path.read_text(encoding="utf-8"))
    checkpoint = plan["spec"]["checkpoint"]
    assert (checkpoint["qkv"], checkpoint["qkv_groups"], checkpoint["qkv_order"]) == (
        "fused_grouped",
        4,
        "qvk",
    )


@pytest.mark.slow
def test_codegen_ports_with_its_config_variant(tmp_path):
    source = tmp_path / "codegen"
    build_tiny_checkpoint("CodeGenForCausalLM", source, seed=0)
    outcome = port(str(source), "codegen", tmp_path / "out", steps=8)
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    assert "rotary_dim" in (outcome.variant or {}), outcome.variant
