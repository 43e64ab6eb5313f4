"""End-to-end: ports that use the MLP, norm, residual, embedding, LM-head and
checkpoint codemods validate against the transformers architectures that
need them (same tiny random weights, prefill and paged decode, fp32 and bf16
at TP=1, and TP=2 for at least one port per codemod).

Each case names the codemods it exercises. TP=2 runs start two rank
processes (about 10 s each on a small machine); the ones that only repeat a
codemod already covered at TP=2 are marked slow, as are the follow-ups of a
passing fp32 run (config variants, FP8, parallel layouts) of the cases not in
``FULLY_VALIDATED``."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import ROOT, plan_dict

pytest.importorskip("torch")
pytest.importorskip("transformers")

from autoport_cst.validate import validate_model  # noqa: E402
from tests.validation_depth import follow_up_options, validates_fully  # noqa: E402

# the fp32 and bf16 (and TP=2) validations of a case share its transformers run
pytestmark = pytest.mark.usefixtures("shared_reference_runs")

STARCODER2_REF = ROOT / "reference_models" / "starcoder2"

GRANITE_CONFIG = dict(
    embedding_multiplier=12.0,
    residual_multiplier=0.22,
    logits_scaling=8.0,
    # the attention scale equals head_dim ** -0.5 of the tiny model (16 ** -0.5), so
    # that this case exercises the three other constants only
    attention_multiplier=0.25,
)
GRANITE_PLAN = plan_dict(
    "granite_multipliers",
    "GraniteForCausalLM",
    {
        "rope": {"type": "default"},
        "embedding": {"tied": False, "multiplier": 12.0},
        "residual": {"multiplier": 0.22},
        "lm_head": {"logits_divisor": 8.0},
    },
    prefix="Granite",
)
OLMO2_PLAN = plan_dict(
    "olmo2_post_norm",
    "Olmo2ForCausalLM",
    {
        "norm": {"placement": "post"},
        "attention": {"qk_norm": "full_width"},
        "rope": {"type": "default"},
        "embedding": {"tied": False},
    },
    prefix="Olmo2",
)


def torch_activation_plan(activation: str) -> dict:
    return plan_dict(
        f"starcoder2_{activation}",
        "Starcoder2ForCausalLM",
        {
            "norm": {"kind": "layernorm", "bias": True, "eps_key": "norm_epsilon"},
            "attention": {"qkv_bias": True, "o_bias": True, "sliding_window": "all"},
            "rope": {"type": "default"},
            "mlp": {"kind": "plain", "activation": activation, "bias": True},
            "embedding": {"tied": True},
            "checkpoint": {"key_map": {"mlp.up_proj": "mlp.c_fc", "mlp.down_proj": "mlp.c_proj"}},
        },
        reference="starcoder2",
        prefix="Starcoder2",
    )


# id -> (plan: example name, plan dict or a reference directory; checkpoint (architecture, config overrides))
CASES = {
    # norm-offset, embedding-scale, mlp-activation (gelu_tanh)
    "gemma": ("gemma", ("GemmaForCausalLM", {})),
    # + norm-placement (sandwich), logit-softcap; attention side: scale, softcap, sliding window
    "gemma2": ("gemma2", ("Gemma2ForCausalLM", {"sliding_window": 8})),
    # embedding-multiplier, residual-multiplier, logits-divisor
    "granite": (GRANITE_PLAN, ("GraniteForCausalLM", GRANITE_CONFIG)),
    # fused-checkpoint (concatenated qkv, gate_up)
    "phi3": ("phi3", ("Phi3ForCausalLM", {})),
    # mlp-kind, mlp-activation, mlp-bias, checkpoint-keys (c_fc / c_proj)
    "starcoder2": ("starcoder2", ("Starcoder2ForCausalLM", {})),
    # the reference package, with a sliding window the tiny sequences cross
    "starcoder2-reference": (STARCODER2_REF, ("Starcoder2ForCausalLM", {"sliding_window": 8})),
    # parallel-residual (separate norms), fused-checkpoint (per head), checkpoint-keys, mlp-activation (gelu)
    "gpt_neox": ("gpt_neox", ("GPTNeoXForCausalLM", {})),
    # parallel-residual (shared norm), lm-head-bias, checkpoint-keys
    "phi": ("phi", ("PhiForCausalLM", {})),
    # norm-placement (post); attention side: full-width QK norm
    "olmo2": (OLMO2_PLAN, ("Olmo2ForCausalLM", {})),
    # mlp-activation outside the kernel (torch_mlp)
    "relu2": (torch_activation_plan("relu2"), ("Starcoder2ForCausalLM", {"hidden_act": "relu2"})),
    "quick_gelu": (
        torch_activation_plan("quick_gelu"),
        ("Starcoder2ForCausalLM", {"hidden_act": "quick_gelu"}),
    ),
}

TP1 = [pytest.param(case, dtype, id=f"{case}-tp1-{dtype}") for case in CASES for dtype in ("fp32", "bf16")]
TP2 = [
    pytest.param("gemma2", "bf16", id="gemma2-tp2-bf16"),
    pytest.param("granite", "bf16", id="granite-tp2-bf16"),
    pytest.param("phi3", "bf16", id="phi3-tp2-bf16"),
    pytest.param("starcoder2", "bf16", id="starcoder2-tp2-bf16"),
    # slow: gpt_neox-tp1-fp32 (FULLY_VALIDATED) runs the TP=2 layout among its follow-ups
    pytest.param("gpt_neox", "fp32", id="gpt_neox-tp2-fp32", marks=pytest.mark.slow),
    pytest.param("phi", "bf16", id="phi-tp2-bf16"),
    pytest.param("gemma", "bf16", id="gemma-tp2-bf16", marks=pytest.mark.slow),
    pytest.param("olmo2", "bf16", id="olmo2-tp2-bf16", marks=pytest.mark.slow),
    pytest.param("starcoder2-reference", "bf16", id="starcoder2-reference-tp2-bf16", marks=pytest.mark.slow),
    pytest.param("relu2", "fp32", id="relu2-tp2-fp32", marks=pytest.mark.slow),
    pytest.param("phi3", "fp32", id="phi3-tp2-fp32", marks=pytest.mark.slow),
    pytest.param("granite", "fp32", id="granite-tp2-fp32", marks=pytest.mark.slow),
]


def _package(case: str, ports) -> Path:
    plan = CASES[case][0]
    return plan if isinstance(plan, Path) else ports.build(plan)


def _checkpoint(case: str, checkpoints) -> Path:
    architecture, overrides = CASES[case][1]
    return checkpoints.get(architecture, **overrides)


# the cases validated with the follow-ups of a passing fp32 run (config variants, FP8,
# parallel layouts) in the default suite, one per reference; every case with --run-slow
# (tests/validation_depth.py)
FULLY_VALIDATED = frozenset({"gpt_neox", "starcoder2-reference"})


@pytest.mark.parametrize("case, dtype", TP1)
def test_port_validates_at_tp1(case, dtype, ports, checkpoints, request):
    follow_ups = follow_up_options(validates_fully(request.config, case, FULLY_VALIDATED))
    report = validate_model(
        _package(case, ports), _checkpoint(case, checkpoints), tp=1, dtype=dtype, **follow_ups
    )
    assert report.equivalent, report.summary()


@pytest.mark.parametrize("case, dtype", TP2)
def test_port_validates_at_tp2(case, dtype, ports, checkpoints):
    report = validate_model(_package(case, ports), _checkpoint(case, checkpoints), tp=2, dtype=dtype)
    assert report.equivalent, report.summary()


# -- the checkpoints exercise the features: without the codemods, validation fails -------------


@pytest.mark.parametrize(
    "case, where",
    [
        ("gemma", "embedding"),  # embeddings not scaled
        # no embedding multiplier: the first norm's input is 12 times too small (RMSNorm hides most of it)
        ("granite", "layers.0.input_norm"),
        ("starcoder2-reference", "layers.0.attention"),  # sliding window ignored (llama-derived port below)
    ],
)
def test_without_the_codemods_validation_fails(case, where, ports, checkpoints):
    if case == "starcoder2-reference":
        package = ports.build("starcoder2")  # same architecture, no sliding window
    else:
        package = ROOT / "reference_models" / "llama3"
    report = validate_model(package, _checkpoint(case, checkpoints), tp=1, dtype="fp32", steps=4)
    assert not report.equivalent
    assert where in str(report.first_diverging), report.summary()
