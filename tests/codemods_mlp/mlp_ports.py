"""End-to-end: ports that use the MLP, norm, residual, embedding, LM-head and
checkpoint codemods validate against the transformers architectures that
need them (same tiny random weights, prefill and paged decode, fp32 and bf16
at TP=1, and TP=2 for at least one port per codemod).

Each case names the codemods it exercises. TP=2 runs start two rank
processes (about 10 s each on a small machine); the ones that only repeat a
codemod already covered at TP=2 are marked slow, as are the follow-ups of a
passing fp32 run (config variants, FP8, parallel layouts) of the cases not in
``FULLY_VALIDATED``.

The cases are tested by group over ``test_ports_*.py`` (``GROUPS``) so that
the suite's ``--dist loadfile`` can share them out between its workers; this
module holds what they share. Each group's file shares its checkpoints'
transformers runs (``shared_reference_runs``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autoport_cst.validate import validate_model
from tests.validation_depth import follow_up_options, validates_fully

from .conftest import ROOT, plan_dict

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

_TP1 = [pytest.param(case, dtype, id=f"{case}-tp1-{dtype}") for case in CASES for dtype in ("fp32", "bf16")]
_TP2 = [
    pytest.param("gemma2", "bf16", id="gemma2-tp2-bf16"),
    pytest.param("granite", "bf16", id="granite-tp2-bf16"),
    pytest.param("phi3", "bf16", id="phi3-tp2-bf16"),
    pytest.param("starcoder2", "bf16", id="starcoder2-tp2-bf16"),
    # slow: the TP=2 layout runs among the follow-ups of the same port on the same checkpoint
    # in tests/coverage_dense/test_dense_ports.py::test_port_validates[GPTNeoXForCausalLM]
    pytest.param("gpt_neox", "fp32", id="gpt_neox-tp2-fp32", marks=pytest.mark.slow),
    pytest.param("phi", "bf16", id="phi-tp2-bf16"),
    pytest.param("gemma", "bf16", id="gemma-tp2-bf16", marks=pytest.mark.slow),
    pytest.param("olmo2", "bf16", id="olmo2-tp2-bf16", marks=pytest.mark.slow),
    pytest.param("starcoder2-reference", "bf16", id="starcoder2-reference-tp2-bf16", marks=pytest.mark.slow),
    pytest.param("relu2", "fp32", id="relu2-tp2-fp32", marks=pytest.mark.slow),
    pytest.param("phi3", "fp32", id="phi3-tp2-fp32", marks=pytest.mark.slow),
    pytest.param("granite", "fp32", id="granite-tp2-fp32", marks=pytest.mark.slow),
]


def package(case: str, ports) -> Path:
    plan = CASES[case][0]
    return plan if isinstance(plan, Path) else ports.build(plan)


def checkpoint(case: str, checkpoints) -> Path:
    architecture, overrides = CASES[case][1]
    return checkpoints.get(architecture, **overrides)


# the cases validated with the follow-ups of a passing fp32 run (config variants, FP8,
# parallel layouts) in the default suite; every case with --run-slow
# (tests/validation_depth.py). Not gpt_neox: its follow-ups run in the default suite in
# tests/coverage_dense/test_dense_ports.py::test_port_validates[GPTNeoXForCausalLM], a port
# from the same reference (starcoder2) with the same codemods (and config guards) on the
# same checkpoint (GPT-NeoX's tiny default config, seed 0)
FULLY_VALIDATED = frozenset({"starcoder2-reference"})


# the test file of each case (test_ports_<group>.py)
GROUPS: dict[str, list[str]] = {
    # norm offset and placement, embedding scale and multipliers, softcap, logits divisor
    "norms_and_scales": ["gemma", "gemma2", "granite", "olmo2"],
    # parallel residuals, fused checkpoints, LM-head bias
    "parallel_and_fused": ["gpt_neox", "phi", "phi3"],
    # MLP kind, bias and activations, checkpoint keys, the starcoder2 reference
    "starcoder2": ["quick_gelu", "relu2", "starcoder2", "starcoder2-reference"],
}
assert sorted(c for cases in GROUPS.values() for c in cases) == sorted(CASES), "a case in no group"

# case -> the component where validation fails without its codemods
WITHOUT_THE_CODEMODS = {
    "gemma": "embedding",  # embeddings not scaled
    # no embedding multiplier: the first norm's input is 12 times too small (RMSNorm hides most of it)
    "granite": "layers.0.input_norm",
    "starcoder2-reference": "layers.0.attention",  # sliding window ignored (llama-derived port below)
}


def tp1_params(group: str) -> list:
    return [p for p in _TP1 if p.values[0] in GROUPS[group]]


def tp2_params(group: str) -> list:
    return [p for p in _TP2 if p.values[0] in GROUPS[group]]


def without_params(group: str) -> list:
    return [(case, where) for case, where in WITHOUT_THE_CODEMODS.items() if case in GROUPS[group]]


def check_validates_at_tp1(case: str, dtype: str, ports, checkpoints, config: pytest.Config) -> None:
    follow_ups = follow_up_options(validates_fully(config, case, FULLY_VALIDATED))
    report = validate_model(
        package(case, ports), checkpoint(case, checkpoints), tp=1, dtype=dtype, **follow_ups
    )
    assert report.equivalent, report.summary()


def check_validates_at_tp2(case: str, dtype: str, ports, checkpoints) -> None:
    report = validate_model(package(case, ports), checkpoint(case, checkpoints), tp=2, dtype=dtype)
    assert report.equivalent, report.summary()


def check_fails_without_the_codemods(case: str, where: str, ports, checkpoints) -> None:
    """The checkpoints exercise the features: without the codemods, validation fails."""
    if case == "starcoder2-reference":
        built = ports.build("starcoder2")  # same architecture, no sliding window
    else:
        built = ROOT / "reference_models" / "llama3"
    report = validate_model(built, checkpoint(case, checkpoints), tp=1, dtype="fp32", steps=4)
    assert not report.equivalent
    assert where in str(report.first_diverging), report.summary()
