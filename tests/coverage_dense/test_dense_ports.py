"""Dense near-Llama architectures that `autoport_cst.port.port` ports and
validates with no hand edits, from a tiny checkpoint of the transformers
architecture: the research derives the spec (checkpoint key names, fused
per-head QKV, attention scale key and form, logit multipliers) and the
composer realizes it. Each port is validated at TP=1 in fp32 and bf16 (the
validation's follow-ups: ``FULLY_VALIDATED``, every port with --run-slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoport_cst.port import port
from autoport_cst.validate import build_tiny_checkpoint
from tests.validation_depth import feature_depth, port_at_depth, port_depth

pytest.importorskip("transformers")

# architecture -> what the port must realize (spec fields checked on the plan, codemods in the steps)
PORTS = {
    "GPTNeoXForCausalLM": {
        "steps": {"checkpoint-keys", "fused-checkpoint", "parallel-residual"},
        "spec": {("checkpoint", "qkv"): "fused_per_head"},
        "key_map": {"model": "gpt_neox", "self_attn.qkv_proj": "attention.query_key_value"},
    },
    "PhiForCausalLM": {
        "steps": {"checkpoint-keys", "parallel-residual", "lm-head-bias"},
        "key_map": {
            "self_attn.o_proj": "self_attn.dense",
            "mlp.up_proj": "mlp.fc1",
            "model.norm": "model.final_layernorm",
        },
    },
    "Glm4ForCausalLM": {
        "steps": {"checkpoint-keys", "norm-placement"},
        "key_map": {
            "pre_feedforward_layernorm": "post_attention_layernorm",
            "post_attention_layernorm": "post_self_attn_layernorm",
        },
    },
    "HyperCLOVAXForCausalLM": {
        "steps": {"checkpoint-keys", "norm-placement", "attention-scale"},
        "spec": {
            ("attention", "scale_key"): "attention_multiplier",
            ("attention", "scale_form"): "multiplier",
        },
    },
    "VaultGemmaForCausalLM": {
        "steps": {"checkpoint-keys", "attention-scale"},
        "spec": {
            ("attention", "scale_key"): "query_pre_attn_scalar",
            ("attention", "scale_form"): "inverse_sqrt",
        },
        "key_map": {"post_attention_layernorm": "pre_feedforward_layernorm"},
    },
    "Gemma2ForCausalLM": {
        "steps": {"attention-scale", "norm-placement"},
        "spec": {
            ("attention", "scale_key"): "query_pre_attn_scalar",
            ("attention", "scale_form"): "inverse_sqrt",
        },
    },
    # RoPE per attention layer type (sliding: base 1e4, full: 1e6); the tiny config's layers are all sliding
    "Gemma3ForCausalLM": {
        "steps": {
            "rope-layer-parameters",
            "attention-scale",
            "norm-placement",
            "norm-offset",
            "embedding-scale",
        },
        "spec": {
            ("attention", "scale_key"): "query_pre_attn_scalar",
            ("rope", "layer_parameters"): {
                "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
            },
        },
    },
    "CohereForCausalLM": {
        "steps": {"logits-divisor", "parallel-residual"},
        "spec": {("lm_head", "logits_key"): "logit_scale", ("lm_head", "logits_form"): "multiplier"},
    },
    "CwmForCausalLM": {"steps": set()},
    # per-head q/k norms applied to the rotated queries and keys
    "HunYuanDenseV1ForCausalLM": {
        "steps": {"qk-norm-position", "checkpoint-keys"},
        "spec": {("attention", "qk_norm"): "per_head", ("attention", "qk_norm_position"): "after_rope"},
        "key_map": {
            "self_attn.q_norm": "self_attn.query_layernorm",
            "self_attn.k_norm": "self_attn.key_layernorm",
        },
    },
    "OlmoForCausalLM": {"steps": {"swap-norm", "norm-affine"}, "spec": {("norm", "affine"): False}},
    "Jais2ForCausalLM": {"steps": {"mlp-activation"}},  # starcoder2's c_fc/c_proj keys translated back
}


# Ports that the tiny checkpoints with every kind of layer (issue 15) show wrong;
# strict: the day they validate, the mark must go.
KNOWN_WRONG: dict[str, str] = {}


def _ports() -> list:
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[name]))
        if name in KNOWN_WRONG
        else name
        for name in sorted(PORTS)
    ]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("coverage-dense")


def snake(architecture: str) -> str:
    return "port_" + "".join(c for c in architecture.removesuffix("ForCausalLM").lower() if c.isalnum())


# validated with the follow-ups of the validation (config variants, FP8, parallel layouts)
# on the planned config in the default suite: a fused per-head QKV sharded across ranks;
# every architecture, on the varied config too, with --run-slow (tests/validation_depth.py)
FULLY_VALIDATED = frozenset({"GPTNeoXForCausalLM"})


@pytest.mark.parametrize("architecture", _ports())
def test_port_validates(architecture, workdir, request):
    source = workdir / f"{architecture}-src"
    build_tiny_checkpoint(architecture, source, seed=0)
    depth = port_depth(request.config, architecture, FULLY_VALIDATED)
    outcome = port_at_depth(depth, str(source), snake(architecture), workdir / "out", force=True, steps=8)
    failures = "; ".join(f"tp{r.tp} {r.dtype}: {r.first_diverging}" for r in outcome.runs if not r.equivalent)
    assert outcome.validated, failures
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16")]
    expected = PORTS[architecture]
    assert expected["steps"] <= set(outcome.steps), outcome.steps
    from autoport_cst.plan import parse_plan

    plan = parse_plan(json.loads(outcome.plan_path.read_text(encoding="utf-8")), str(outcome.plan_path))
    for (section, name), value in expected.get("spec", {}).items():
        assert getattr(getattr(plan.spec, section), name) == value
    key_map = plan.spec.checkpoint.key_map or {}
    for canonical, stored in expected.get("key_map", {}).items():
        assert key_map.get(canonical) == stored, key_map


@pytest.mark.slow
@pytest.mark.parametrize(
    "architecture", ["GPTNeoXForCausalLM", "Glm4ForCausalLM", "CohereForCausalLM", "Gemma3ForCausalLM"]
)
def test_port_validates_on_two_ranks(architecture, workdir):
    source = workdir / f"{architecture}-src2"
    build_tiny_checkpoint(architecture, source, seed=1)
    outcome = port(str(source), snake(architecture) + "_tp2", workdir / "out2", tp=2, force=True, steps=8)
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]


def test_gemma3_with_both_layer_types_validates(workdir, request):
    """Gemma 3 as its larger checkpoints set RoPE: sliding layers with the
    default RoPE at base 1e4, full-attention layers with linear scaling (factor
    8) at base 1e6 (the tiny config of the corpus has sliding layers only)."""
    source = workdir / "gemma3-mixed-src"
    # two layers, one of each type (the default tiny Gemma 3 has six: five sliding, one full)
    build_tiny_checkpoint("Gemma3ForCausalLM", source, seed=0, dimensions={"num_hidden_layers": 2})
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    config["layer_types"] = ["sliding_attention", "full_attention"]
    config["rope_parameters"]["full_attention"] = {
        "rope_theta": 1000000.0,
        "rope_type": "linear",
        "factor": 8.0,
    }
    (source / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    outcome = port_at_depth(
        feature_depth(request.config), str(source), "port_gemma3_mixed", workdir / "out", force=True, steps=8
    )
    assert outcome.validated, [(r.dtype, r.first_diverging) for r in outcome.runs]
    assert {"rope-layer-parameters", "rope-scaling"} <= set(outcome.steps)
    plan = json.loads(outcome.plan_path.read_text(encoding="utf-8"))
    assert plan["spec"]["rope"]["type"] == "linear"
    assert plan["spec"]["attention"]["layer_types"] == ["sliding_attention", "full_attention"]


def test_granite_with_its_multipliers_validates(workdir, request):
    """Granite's four multipliers as a real checkpoint sets them (the tiny
    checkpoint of the corpus leaves them at 1.0): the scale and the logits
    divisor come from the config fields the code reads."""
    from tests.research.tiny_models import build

    source = build("granite", workdir / "granite-src")
    outcome = port_at_depth(
        feature_depth(request.config),
        str(source),
        "port_granite_multipliers",
        workdir / "out",
        force=True,
        steps=8,
    )
    assert outcome.validated, [(r.dtype, r.first_diverging) for r in outcome.runs]
    assert {"attention-scale", "logits-divisor", "embedding-multiplier", "residual-multiplier"} <= set(
        outcome.steps
    )
    plan = json.loads(outcome.plan_path.read_text(encoding="utf-8"))
    assert plan["spec"]["attention"]["scale_key"] == "attention_multiplier"
    assert plan["spec"]["lm_head"]["logits_key"] == "logits_scaling"
