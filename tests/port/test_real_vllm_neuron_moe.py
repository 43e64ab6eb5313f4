"""Ports from the real vllm_neuron qwen3_moe package (vllm-project/vllm-neuron,
third-party: never shipped; README, "The real vllm_neuron packages"). They run
only where a local rebuild is present: ``AUTOPORT_REAL_VLLM_NEURON`` names the
directory holding ``qwen3_moe/`` (``model_bf16.py``, ``config.py``,
``weight_loaders_bf16.py`` and a hand-written ``reference.json``), by default
``/work/real/vllm_neuron/model``; skipped otherwise.

What is measured here is where the MoE ports from the real code stop: each
refusal names the codemod and the real file, and nothing is written. The real
router always renormalizes its softmax top-k (``NF.moe_block_tkg`` in
``_run_moe_block_tkg``, ``NF.router`` in ``forward_prefill``, with no switch),
so norm-topk-prob refuses a model that does not renormalize (OLMoE) naming
every site it would leave; the real attention loader fuses Q/K/V without a
bias, so add-qkv-bias refuses Qwen2-MoE; fused-checkpoint finds no dense
``NF.mlp`` in the real file for a checkpoint whose experts store gate and up
fused (transformers 5's own layout of Mixtral and OLMoE)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

REAL = Path(os.environ.get("AUTOPORT_REAL_VLLM_NEURON", "/work/real/vllm_neuron/model"))
pytestmark = pytest.mark.skipif(
    not (REAL / "qwen3_moe" / "reference.json").is_file(),
    reason=f"no local rebuild of the real vllm_neuron qwen3_moe under {REAL} (AUTOPORT_REAL_VLLM_NEURON)",
)


def _refusal(architecture: str, key_format: str, tmp_path: Path, values: dict | None = None) -> str:
    """The failure of applying the plan of a tiny ``architecture`` (vocabulary 512) onto the real
    qwen3_moe; asserts that nothing was built."""
    from autoport_cst.apply import build_port, load_reference
    from autoport_cst.plan import from_research
    from autoport_cst.research import choose_reference, research
    from autoport_cst.validate import build_tiny_checkpoint

    checkpoint = tmp_path / architecture
    build_tiny_checkpoint(
        architecture,
        checkpoint,
        seed=0,
        dimensions={"vocab_size": 512, **(values or {})},
        key_format=key_format,
    )
    found = research(str(checkpoint))
    ref = str(REAL / "qwen3_moe")
    choice = choose_reference(found.spec, "port", found.architecture, [ref], found)
    plan = from_research(found, "port", choice.chosen, "real-code test")
    result = build_port(plan, load_reference(ref))
    assert not result.ok
    return str(result.failure)


@pytest.mark.slow
@pytest.mark.parametrize(
    "architecture, key_format, expected",
    [
        ("MixtralForCausalLM", "model", ("fused-checkpoint", "qwen3_moe/model_bf16.py")),
        ("Qwen2MoeForCausalLM", "model", ("add-qkv-bias", "qwen3_moe/model_bf16.py:385:22")),
        (
            "OlmoeForCausalLM",
            "saved",
            (
                "norm-topk-prob",
                "model_bf16.py:1072:16",
                "NF.moe_block_tkg on the path if use_all_experts",
                "NF.moe_block_tkg on the path not (if use_all_experts)",
                "model_bf16.py:1138:29",
            ),
        ),
    ],
)
def test_moe_ports_from_the_real_qwen3_moe_refuse_naming_the_site(
    architecture, key_format, expected, tmp_path
):
    failure = _refusal(architecture, key_format, tmp_path)
    for text in expected:
        assert text in failure, failure


@pytest.mark.slow
def test_fused_experts_are_refused_where_the_real_experts_load_per_expert_keys(tmp_path):
    """A Qwen3-MoE checkpoint in transformers 5's module layout stores each layer's experts'
    gate and up fused (``mlp.experts.gate_up_proj``) and its dense layer's apart. The plan's
    checkpoint.gate_up is fused; fused-checkpoint edited the dense layer's NF.mlp alone and left
    the real load_weights' per-expert expert keys, and the written port failed at load. It is
    refused now, naming the experts' mapping."""
    failure = _refusal("Qwen3MoeForCausalLM", "model", tmp_path, {"norm_topk_prob": True})
    assert "fused-checkpoint" in failure and "per-expert keys" in failure, failure
    assert 'mappings[f"{layer_prefix}.mlp.experts.gate_up_proj_weight"]' in failure, failure


@pytest.mark.slow
def test_a_qwen3_moe_port_under_another_name_validates_fp32_by_the_bf16_gates(tmp_path):
    """A tiny Qwen3-MoE (tensors named as the hub stores them, per expert; its
    top-k renormalized) ported from the real qwen3_moe as ``tiny_q3m``. Its
    config-written-names repair ran after rename-classes and found no
    ``TinyQ3mConfig`` in transformers, so the port kept 128 experts and failed
    at build; the repairs run first now. Its fp32 run fails float32's
    tolerances at the first MoE layer by design (the real ``NF.moe_cte`` call
    passes ``compute_dtype=nl.bfloat16``) and is judged by the bf16 gates from
    there, naming that call."""
    from autoport_cst.apply import build_port, load_reference, write_port
    from autoport_cst.plan import from_research
    from autoport_cst.research import choose_reference, research
    from autoport_cst.validate import build_tiny_checkpoint, validate_model

    checkpoint = tmp_path / "checkpoint"
    build_tiny_checkpoint(
        "Qwen3MoeForCausalLM", checkpoint, seed=0, dimensions={"vocab_size": 512}, key_format="saved"
    )
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    (checkpoint / "config.json").write_text(json.dumps({**config, "norm_topk_prob": True}), encoding="utf-8")
    found = research(str(checkpoint))
    ref = str(REAL / "qwen3_moe")
    choice = choose_reference(found.spec, "port", found.architecture, [ref], found)
    plan = from_research(found, "port", choice.chosen, "real-code test")
    plan = replace(plan, name="tiny_q3m", class_prefix="TinyQ3m")
    result = build_port(plan, load_reference(ref))
    assert result.ok, result.failure
    steps = [step.codemod for step in result.steps]
    assert steps.index("config-written-names") < steps.index("rename-classes")
    write_port(tmp_path / "out", result.files, result.package_dir, force=False)
    package = tmp_path / "out" / result.package_dir
    report = validate_model(
        package, checkpoint, dtype="fp32", steps=4, config_variants=False, parallel_layouts=False
    )
    assert report.equivalent, report.summary()
    assert report.precision is not None and report.precision["bf16_gates"]["equivalent"]
    assert [call["kernel"] for call in report.precision["narrowed"]] == ["NF.moe_cte"]
    assert "layers.1.mlp" in report.precision["fp32"]["first_diverging"]
