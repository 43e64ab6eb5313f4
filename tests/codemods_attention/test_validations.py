"""End-to-end validation of the attention and RoPE codemods: each plan is
applied to a reference, and the port must match the transformers architecture
it targets on a tiny random checkpoint, in fp32 and bf16 (TP=1), and at TP=2
for at least one architecture per codemod (the rest of the TP=2 matrix is
behind ``--run-slow``, as are the follow-ups of a passing fp32 run for the
cases not in ``FULLY_VALIDATED``).

Checkpoint configs are chosen so that each feature changes the outputs: a
sliding window shorter than the prompts (8, 12 and 20 tokens), a NoPE layer,
a softcap and an attention scale that bite on a 16-wide head, and so on. The
controls at the end show that the llama3 reference, without the codemods,
does not validate on these checkpoints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from autoport_cst.validate import validate_model
from tests.validation_depth import follow_up_options, validates_fully

from .conftest import ROOT

# the fp32 and bf16 (and TP=2, control) validations of a case share its transformers run
pytestmark = pytest.mark.usefixtures("shared_reference_runs")

EXAMPLES = ROOT / "examples"
STEPS = 8


def example(name: str) -> dict:
    return json.loads((EXAMPLES / f"{name}.plan.json").read_text(encoding="utf-8"))


def llama_with_rope(variant: str) -> dict:
    return {
        "version": 1,
        "name": f"llama_{variant}",
        "class_prefix": "Llama",
        "architecture": "LlamaForCausalLM",
        "reference": "llama3",
        "spec": {"rope": {"type": variant}},
    }


QWEN2_SWA = {
    "version": 1,
    "name": "qwen2_swa",
    "class_prefix": "Qwen2",
    "architecture": "Qwen2ForCausalLM",
    "reference": "llama3",
    "spec": {"attention": {"qkv_bias": True, "sliding_window": "per_layer"}},
}

STABLELM_QKV_BIAS = {**example("stablelm"), "name": "stablelm_bias"}
STABLELM_QKV_BIAS["spec"] = {**STABLELM_QKV_BIAS["spec"], "attention": {"qkv_bias": True}}

# tiny head dimension is 16 (hidden 64, 4 heads): 8 frequencies
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 4.0],
    "long_factor": [1.0, 1.5, 2.2, 3.0, 4.5, 6.0, 8.0, 10.0],
    "original_max_position_embeddings": 256,
    "rope_theta": 10000.0,
}


def rope_config(parameters: dict) -> dict:
    return {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "rope_parameters": parameters}


@dataclass(frozen=True)
class Case:
    id: str
    plan: dict | None  # None: validate the reference package itself
    checkpoint: dict
    codemods: tuple[str, ...]
    reference: str | None = None
    tp2: str = "slow"  # "default": TP=2 in the default run; "slow": with --run-slow; "no"
    seed: int = 0
    extra: dict = field(default_factory=dict)


CASES = [
    Case("mistral", example("mistral"), {"model_type": "mistral", "sliding_window": 6}, ("sliding-window",)),
    Case(
        "qwen2-sliding-layers",
        QWEN2_SWA,
        {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1},
        ("sliding-window", "add-qkv-bias"),
    ),
    Case(
        "qwen3",
        example("qwen3"),
        {"model_type": "qwen3", "use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1},
        ("qk-norm", "sliding-window"),
    ),
    Case(
        "olmo2",
        example("olmo2"),
        {"model_type": "olmo2"},
        ("qk-norm", "norm-placement"),
        tp2="default",
    ),
    Case(
        "smollm3",
        example("smollm3"),
        {"model_type": "smollm3", "num_hidden_layers": 2, "no_rope_layers": [1, 0]},
        ("nope-layers",),
    ),
    Case("stablelm", example("stablelm"), {"model_type": "stablelm"}, ("partial-rotary", "swap-norm")),
    Case(
        "stablelm-qkv-bias",
        STABLELM_QKV_BIAS,
        {"model_type": "stablelm", "use_qkv_bias": True},
        ("partial-rotary", "add-qkv-bias", "swap-norm"),
    ),
    Case("helium", example("helium"), {"model_type": "helium"}, ("interleaved-rope",)),
    Case(
        "glm",
        example("glm"),
        {"model_type": "glm"},
        ("partial-rotary", "interleaved-rope", "add-qkv-bias", "fused-checkpoint"),
        tp2="default",
    ),
    Case(
        "rope-linear",
        llama_with_rope("linear"),
        rope_config({"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}),
        ("rope-scaling",),
        tp2="no",
    ),
    Case(
        "rope-dynamic",
        llama_with_rope("dynamic"),
        rope_config({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
        ("rope-scaling",),
        tp2="no",
    ),
    Case(
        "rope-yarn",
        llama_with_rope("yarn"),
        rope_config(
            {
                "rope_type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 16,
                "beta_slow": 1,
                "rope_theta": 10000.0,
            }
        ),
        ("rope-scaling",),
    ),
    Case("rope-longrope", llama_with_rope("longrope"), rope_config(LONGROPE), ("rope-scaling",), tp2="no"),
    Case(
        "rope-none",
        {
            **llama_with_rope("none"),
            "class_prefix": "SmolLM3",
            "architecture": "SmolLM3ForCausalLM",
            "spec": {"rope": {"type": "none"}, "embedding": {"tied": True}},
        },
        {"model_type": "smollm3", "num_hidden_layers": 2, "no_rope_layers": [0, 0]},
        ("rope-scaling",),
        tp2="no",
    ),
    Case(
        "granite",
        example("granite"),
        {
            "model_type": "granite",
            "attention_multiplier": 0.03,
            "embedding_multiplier": 6.0,
            "residual_multiplier": 0.5,
            "logits_scaling": 4.0,
        },
        ("attention-scale", "embedding-multiplier", "residual-multiplier", "logits-divisor"),
    ),
    Case(
        "granite-swa",
        example("granite_swa"),
        {
            "model_type": "granite_swa",
            "num_hidden_layers": 2,
            "sliding_window": 6,
            "attention_multiplier": 0.2,
            "embedding_multiplier": 6.0,
            "residual_multiplier": 0.5,
            "logits_scaling": 4.0,
        },
        ("attention-sinks", "attention-scale", "sliding-window"),
        # slow: in the default run its fp32 validation (FULLY_VALIDATED) already
        # runs the TP=2 layout among its follow-ups
        tp2="slow",
    ),
    Case(
        "vaultgemma",
        example("vaultgemma"),
        {
            "model_type": "vaultgemma",
            "num_hidden_layers": 2,
            "sliding_window": 6,
            "query_pre_attn_scalar": 25,
            "attn_logit_softcapping": 1.5,
            "final_logit_softcapping": 5.0,
        },
        ("attention-softcap", "attention-scale", "sliding-window", "norm-offset", "embedding-scale"),
    ),
    Case(
        "gemma2",
        example("gemma2"),
        {
            "model_type": "gemma2",
            "num_hidden_layers": 2,
            "sliding_window": 6,
            "query_pre_attn_scalar": 25,
            "attn_logit_softcapping": 1.5,
            "final_logit_softcapping": 5.0,
        },
        ("attention-softcap", "attention-scale", "sliding-window", "norm-placement", "norm-offset"),
    ),
    # the reference packages themselves
    Case("qwen3-reference", None, {"model_type": "qwen3"}, (), reference="qwen3"),
    Case(
        "qwen3-reference-sliding-yarn",
        None,
        {
            "model_type": "qwen3",
            "hidden_size": 64,
            "num_attention_heads": 4,
            "use_sliding_window": True,
            "sliding_window": 5,
            "max_window_layers": 1,
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "rope_theta": 1000000.0,
            },
        },
        (),
        reference="qwen3",
        seed=1,
    ),
    Case(
        "smollm3-reference",
        None,
        {"model_type": "smollm3", "num_hidden_layers": 2, "no_rope_layers": [1, 0]},
        (),
        reference="smollm3",
    ),
    Case(
        "smollm3-reference-sliding",
        None,
        {
            "model_type": "smollm3",
            "num_hidden_layers": 2,
            "no_rope_layers": [1, 0],
            "use_sliding_window": True,
            "sliding_window": 5,
        },
        (),
        reference="smollm3",
    ),
    Case("smollm3-reference-on-llama", None, {"model_type": "llama"}, (), reference="smollm3"),
    # ports that start from the new references
    Case(
        "mistral-from-qwen3",
        {
            "version": 1,
            "name": "mistral_from_qwen3",
            "class_prefix": "Mistral",
            "architecture": "MistralForCausalLM",
            "reference": "qwen3",
            "spec": {"attention": {"qk_norm": "none", "sliding_window": "all"}},
        },
        {"model_type": "mistral", "sliding_window": 6},
        ("sliding-window", "remove-qk-norm"),
        tp2="no",
    ),
    Case(
        "qwen2-from-qwen3",
        {
            "version": 1,
            "name": "qwen2_from_qwen3",
            "class_prefix": "Qwen2",
            "architecture": "Qwen2ForCausalLM",
            "reference": "qwen3",
            "spec": {"attention": {"qkv_bias": True, "qk_norm": "none", "sliding_window": "per_layer"}},
        },
        {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1},
        ("add-qkv-bias", "remove-qk-norm"),
        tp2="no",
    ),
]


@pytest.fixture(scope="module")
def package_of(port_builder):
    def get(case: Case) -> Path:
        if case.plan is None:
            return ROOT / "reference_models" / case.reference
        return port_builder(case.plan)

    return get


@pytest.fixture(scope="module")
def checkpoint_of(tiny_checkpoint):
    def get(case: Case) -> Path:
        return tiny_checkpoint(case.checkpoint, seed=case.seed)

    return get


def test_cases_cover_every_attention_codemod():
    mine = {
        "sliding-window",
        "qk-norm",
        "partial-rotary",
        "interleaved-rope",
        "rope-scaling",
        "nope-layers",
        "attention-scale",
        "attention-softcap",
        "attention-sinks",
    }
    covered = {c for case in CASES for c in case.codemods}
    assert mine <= covered
    with_tp2 = {c for case in CASES if case.tp2 != "no" for c in case.codemods}
    assert mine <= with_tp2


# the cases validated with the follow-ups of a passing fp32 run (config variants, FP8,
# parallel layouts) in the default suite, one per reference; every case with --run-slow
# (tests/validation_depth.py)
FULLY_VALIDATED = frozenset({"granite-swa", "qwen3-reference-sliding-yarn", "smollm3-reference-sliding"})


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_port_validates(case, dtype, package_of, checkpoint_of, request):
    follow_ups = follow_up_options(validates_fully(request.config, case.id, FULLY_VALIDATED))
    report = validate_model(package_of(case), checkpoint_of(case), dtype=dtype, steps=STEPS, **follow_ups)
    assert report.equivalent, report.summary()


def _tp2_params():
    params = []
    for case in CASES:
        if case.tp2 == "no":
            continue
        marks = [pytest.mark.slow] if case.tp2 == "slow" else []
        params.append(pytest.param(case, id=case.id, marks=marks))
    return params


@pytest.mark.parametrize("case", _tp2_params())
def test_port_validates_at_tp2(case, package_of, checkpoint_of):
    report = validate_model(package_of(case), checkpoint_of(case), dtype="fp32", steps=4, tp=2)
    assert report.equivalent, report.summary()


# -- controls: without the codemods, the reference does not validate ----------------

CONTROLS = ["mistral", "qwen2-sliding-layers", "qwen3", "smollm3", "helium", "rope-yarn"]


@pytest.mark.parametrize("case_id", CONTROLS)
def test_llama3_without_the_codemods_diverges(case_id, checkpoint_of):
    case = next(c for c in CASES if c.id == case_id)
    report = validate_model(ROOT / "reference_models" / "llama3", checkpoint_of(case), dtype="fp32", steps=4)
    assert not report.equivalent
    if report.first_diverging is not None:
        assert (
            "attention" in report.first_diverging.component or "embedding" in report.first_diverging.component
        )
    else:  # a RoPE type the reference refuses: the port fails to build, saying why
        assert report.failure is not None and "rope_type" in report.failure.message


@pytest.mark.parametrize(
    "case_id, section, feature, absent",
    [
        ("granite-swa", "attention", "sinks", False),
        ("granite-swa", "attention", "scale", None),
        ("vaultgemma", "attention", "softcap", None),
        ("olmo2", "attention", "qk_norm", "none"),
        ("stablelm", "rope", "partial_rotary_factor", 1.0),
    ],
)
def test_the_same_port_without_one_feature_diverges(
    case_id, section, feature, absent, port_builder, checkpoint_of
):
    case = next(c for c in CASES if c.id == case_id)
    plan = json.loads(json.dumps(case.plan))
    plan["name"] = f"{plan['name']}_without_{feature}"
    plan["spec"][section][feature] = absent
    if feature == "scale":  # and the config field it is read from
        plan["spec"][section].pop("scale_key", None)
    report = validate_model(port_builder(plan), checkpoint_of(case), dtype="fp32", steps=4)
    assert not report.equivalent
    assert report.first_diverging is not None and "attention" in report.first_diverging.component
