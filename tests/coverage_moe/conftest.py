"""Fixtures of the MoE coverage tests: tiny checkpoints of mixture-of-experts
architectures built from their transformers config class (with overrides
where the class defaults would hide a feature, such as a routed scaling factor
of 1.0), each built once per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# architecture -> config overrides. The defaults of these config classes
# exercise each feature except where noted.
CONFIGS: dict[str, dict] = {
    # first layer dense (first_k_dense_replace 1), sigmoid router with a
    # selection-only bias, one ungated shared expert; a routed scaling factor
    # other than 1 so that it is ported, and group-limited routing that keeps
    # every group (a no-op the research must recognize)
    "Glm4MoeForCausalLM": {
        "routed_scaling_factor": 2.5,
        "n_group": 2,
        "topk_group": 2,
        "n_routed_experts": 8,
    },
    # Solar Open: GLM-4-MoE-like routing without dense layers
    "SolarOpenForCausalLM": {"routed_scaling_factor": 1.5},
    # Hunyuan v3: dense layer 0 (mlp_layer_types), routing bias held by the
    # MoE block, router_scaling_factor 2.826 by default
    "HYV3ForCausalLM": {},
    # ERNIE-4.5-MoE: softmax router whose bias lives in a moe_statics
    # submodule ([1, E]), dense layer 0 (moe_layer_start_index 1), interleaved RoPE
    "Ernie4_5_MoeForCausalLM": {},
    # Granite MoE: router under block_sparse_moe.router; the multipliers
    # other than 1 so that they are ported
    "GraniteMoeForCausalLM": {
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.015625,
        "logits_scaling": 8.0,
    },
    "GraniteMoeSharedForCausalLM": {
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.015625,
        "logits_scaling": 8.0,
    },
    "GraniteMoeSWAForCausalLM": {},
    # Aria's text model: experts stored [in, out], two shared experts' width
    "AriaTextForCausalLM": {},
    # MiniMax-M2: full-width q/k norms (qk-norm replaces the reference's
    # per-head ones), sigmoid router with a selection-only bias
    "MiniMaxM2ForCausalLM": {},
    # OLMoE: full-width q/k norms on Mixtral-like routing
    "OlmoeForCausalLM": {},
    # HunYuan MoE v1: per-head q/k norms after RoPE, a shared expert
    "HunYuanMoEV1ForCausalLM": {},
    # dots.llm1: its config class has no expert counts by default
    "Dots1ForCausalLM": {
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5,
        "n_group": 1,
        "topk_group": 1,
    },
}

# architectures the planner must refuse, with the config overrides that make
# the tiny model show the feature, and the feature the refusal names
REFUSALS: dict[str, tuple[str, dict, str]] = {
    # JetMoe: experts whose input and output projections are separate modules run by the
    # MoE block with its activation between them (and mixture-of-attention heads)
    "jetmoe": ("JetMoeForCausalLM", {}, "split_expert_projections"),
    # (EXAONE MoE, once refused for its layers without RoPE chosen by layer_types, ports since
    # rope.nope_rule: tests/coverage_dense/test_nope_layer_types.py)
}


def build(tmp_path_factory, architecture: str, overrides: dict, name: str) -> Path:
    """A tiny random checkpoint of ``architecture`` with ``overrides`` applied
    to its config class defaults first."""
    import transformers

    from autoport_cst.validate import build_tiny_checkpoint

    directory = tmp_path_factory.mktemp(name)
    if not overrides:
        build_tiny_checkpoint(architecture, directory, seed=0)
        return directory
    config = getattr(transformers, architecture).config_class(**overrides).to_dict()
    config["architectures"] = [architecture]
    config_dir = tmp_path_factory.mktemp(f"{name}-config")
    (config_dir / "config.json").write_text(json.dumps(config), encoding="utf-8")
    build_tiny_checkpoint(config_dir / "config.json", directory, seed=0)
    return directory


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory):
    """``tiny_moe(architecture)`` -> its tiny checkpoint (built once)."""
    built: dict[str, Path] = {}

    def make(architecture: str) -> Path:
        if architecture not in built:
            built[architecture] = build(
                tmp_path_factory, architecture, CONFIGS[architecture], f"src-{architecture}"
            )
        return built[architecture]

    return make


# the architectures validated with their follow-ups (config variants, FP8, parallel
# layouts) on the planned config in the default suite, at TP=1 (the --tp 2 port
# repeats them); the others, and every TP size, with --run-slow
# (tests/validation_depth.py)
FULLY_VALIDATED = frozenset({"Glm4MoeForCausalLM"})


@pytest.fixture(scope="session")
def ported(tmp_path_factory, tiny_moe, request):
    """``ported(architecture, tp=1)`` -> the PortOutcome of ``autoport_cst.port.port``
    on its tiny checkpoint (built once per TP size), validated in full for
    ``FULLY_VALIDATED`` at TP=1, the follow-ups on the planned config only
    (every port in full with --run-slow: tests/validation_depth.py)."""
    from tests.validation_depth import port_at_depth, port_depth

    done: dict[tuple[str, int], object] = {}

    def make(architecture: str, tp: int = 1):
        key = (architecture, tp)
        if key not in done:
            name = "cov_" + "".join(c if c.isalnum() else "_" for c in architecture.lower())
            out = tmp_path_factory.mktemp(f"out-{architecture}-tp{tp}")
            depth = port_depth(request.config, architecture, FULLY_VALIDATED if tp == 1 else ())
            done[key] = port_at_depth(
                depth, str(tiny_moe(architecture)), name, out, tp=tp, steps=8, force=True
            )
        return done[key]

    return make
