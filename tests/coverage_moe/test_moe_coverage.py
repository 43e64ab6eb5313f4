"""Mixture-of-experts architectures that ``autoport-cst port`` ports with no
hand edit, from a tiny checkpoint of each (research -> reference -> codemods
-> CPU validation against transformers), and the ones the planner refuses,
with the feature it names.

| architecture | what its port needs besides the qwen3_moe reference |
|---|---|
| Glm4MoeForCausalLM | dense layer 0, partial rotary, no QK-norm, sigmoid router, routing bias (a buffer), routed scaling, one shared expert; group-limited routing that keeps every group |
| SolarOpenForCausalLM | no QK-norm, sigmoid router, routing bias, routed scaling, shared expert |
| HYV3ForCausalLM | dense layer 0 (mlp_layer_types), sigmoid router, routing bias held by the MoE block, router_scaling_factor, shared expert |
| Ernie4_5_MoeForCausalLM | dense layer 0 (moe_layer_start_index), interleaved RoPE, no QK-norm, routing bias in moe_statics ([1, E]), shared experts |
| GraniteMoeForCausalLM, GraniteMoeSharedForCausalLM | router under block_sparse_moe, attention scale, embedding/residual multipliers, logits divisor |
| GraniteMoeSWAForCausalLM | the same with sliding window and attention sinks |
| AriaTextForCausalLM | experts stored [in, out], two shared experts' width, router under mlp.router |
| Dots1ForCausalLM | dense layer 0, sigmoid router, routing bias, routed scaling, shared expert |
| MiniMaxM2ForCausalLM | full-width q/k norms in place of the per-head ones, sigmoid router, routing bias |
| OlmoeForCausalLM | full-width q/k norms in place of the per-head ones |
| HunYuanMoEV1ForCausalLM | per-head q/k norms applied after RoPE, shared expert |

Besides these, a port takes the identity steps, ``config-guards`` (a guard:
the port refuses configs its research did not plan for), checkpoint key
renames, and ``float32-router`` when the researched spec's router dtype is
not the one the reference declares (``tests/moe/spec_steps.py``).

Every port validates in float32 at TP=1, but those in ``KNOWN_WRONG`` (named, strict xfail). In bf16 a port either validates or
fails only on routing near-ties (``ties.py``): with those tokens left out it
keeps the gate. TP=2 runs for GLM-4-MoE here and for every architecture in
the slow test. The validation's follow-ups (declared config variants, FP8,
parallel layouts) run for GLM-4-MoE by default and for every architecture
with --run-slow (``conftest.FULLY_VALIDATED``, tests/validation_depth.py).
"""

from __future__ import annotations

import pytest

from autoport_cst.errors import UnrealizableDiffError
from tests.moe.spec_steps import IDENTITY_AND_GUARDS, declared_steps

from .conftest import CONFIGS, REFUSALS, build
from .ties import bf16_failure_is_a_routing_tie

STEPS = 8

EXPECTED_STEPS = {
    "Glm4MoeForCausalLM": {
        "dense-layers",
        "partial-rotary",
        "remove-qk-norm",
        "routed-scaling",
        "router-activation",
        "routing-bias",
        "shared-experts",
    },
    "SolarOpenForCausalLM": {
        "remove-qk-norm",
        "routed-scaling",
        "router-activation",
        "routing-bias",
        "shared-experts",
    },
    "HYV3ForCausalLM": {
        "dense-layers",
        "routed-scaling",
        "router-activation",
        "routing-bias",
        "shared-experts",
    },
    "Ernie4_5_MoeForCausalLM": {
        "dense-layers",
        "interleaved-rope",
        "remove-qk-norm",
        "routing-bias",
        "shared-experts",
    },
    "GraniteMoeForCausalLM": {
        "attention-scale",
        "embedding-multiplier",
        "logits-divisor",
        "remove-qk-norm",
        "residual-multiplier",
    },
    "GraniteMoeSharedForCausalLM": {
        "attention-scale",
        "embedding-multiplier",
        "logits-divisor",
        "remove-qk-norm",
        "residual-multiplier",
    },
    "GraniteMoeSWAForCausalLM": {"attention-scale", "attention-sinks", "remove-qk-norm", "sliding-window"},
    "AriaTextForCausalLM": {"remove-qk-norm", "shared-experts"},
    "MiniMaxM2ForCausalLM": {"qk-norm", "router-activation", "routing-bias"},
    "OlmoeForCausalLM": {"qk-norm"},
    "HunYuanMoEV1ForCausalLM": {"qk-norm-position", "shared-experts"},
    "Dots1ForCausalLM": {
        "dense-layers",
        "routed-scaling",
        "router-activation",
        "routing-bias",
        "shared-experts",
    },
}
# identity steps and guards (config-guards) that any port may take
ALWAYS = IDENTITY_AND_GUARDS
# codemods of other features a port may also take (checkpoint key renames, either key format)
MAY = {"checkpoint-keys", "key-formats"}


# Ports that the tiny checkpoints with every kind of layer show wrong (as
# tests/coverage_dense's KNOWN_WRONG); strict: the day they validate, the mark must go.
KNOWN_WRONG: dict[str, str] = {}


# Ports wrong on a config variant their reference declares (validate runs each
# declared variant after a passing TP=1 fp32 run); strict, as above. The
# variant checkpoint.gate_up="separate" is written as save_pretrained writes it
# (the hub's names: ERNIE's mlp.moe_statics, HY-V3's mlp.router.gate and
# expert_bias, MiniMax-M2's block_sparse_moe and w1/w2/w3 experts); the port
# loads it under those names (key-formats: transformers' conversion mapping).
WRONG_ON_A_VARIANT: dict[str, str] = {}


def _architectures(known_wrong: dict[str, str] = KNOWN_WRONG) -> list:
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=known_wrong[name]))
        if name in known_wrong
        else name
        for name in sorted(CONFIGS)
    ]


@pytest.mark.parametrize("architecture", _architectures(KNOWN_WRONG | WRONG_ON_A_VARIANT))
def test_port_validates(ported, tiny_moe, architecture):
    from autoport_cst.apply.reference import load_reference
    from autoport_cst.research import research

    outcome = ported(architecture)
    spec = research(str(tiny_moe(architecture))).spec
    declared = declared_steps(spec, load_reference(outcome.reference).spec)
    steps = set(outcome.steps) - ALWAYS - MAY
    assert steps == EXPECTED_STEPS[architecture] | declared, outcome.steps
    assert outcome.reference == "qwen3_moe"
    runs = {run.dtype: run for run in outcome.runs}
    assert runs["fp32"].equivalent, runs["fp32"].summary
    if not runs["bf16"].equivalent:
        moe = spec.moe
        bf16_failure_is_a_routing_tie(
            outcome.package_dir, outcome.checkpoint_dir, STEPS, moe.router_activation, moe.top_k
        )


# slow: by default, the TP=2 and EP 2 layouts among the follow-ups of Glm4Moe's TP=1
# port (FULLY_VALIDATED), and `port --tp 2` in tests/port/test_port_cli.py::test_port_at_tp2
@pytest.mark.slow
def test_glm4_moe_validates_on_two_ranks(ported):
    outcome = ported("Glm4MoeForCausalLM", tp=2)
    tp2 = [run for run in outcome.runs if run.tp == 2]
    assert tp2 and all(run.equivalent for run in tp2), [run.summary for run in tp2]


@pytest.mark.slow
@pytest.mark.parametrize("architecture", _architectures())
def test_port_validates_on_two_ranks(ported, architecture):
    outcome = ported(architecture, tp=2)
    tp2 = [run for run in outcome.runs if run.tp == 2]
    assert tp2 and all(run.equivalent for run in tp2), [run.summary for run in tp2]


def test_research_fills_the_moe_fields(tiny_moe):
    from autoport_cst.research import research

    glm = research(str(tiny_moe("Glm4MoeForCausalLM")))
    assert glm.spec.moe.dense_layers == (0,)
    assert glm.spec.moe.routed_scaling_factor == 2.5
    assert glm.spec.moe.routing_bias is True
    assert glm.spec.unsupported is None  # every group kept: no group restriction
    hy = research(str(tiny_moe("HYV3ForCausalLM")))
    assert hy.spec.moe.routed_scaling_factor == pytest.approx(2.826)
    assert hy.spec.moe.dense_layers == (0,) and hy.spec.moe.routing_bias is True
    ernie = research(str(tiny_moe("Ernie4_5_MoeForCausalLM")))
    assert ernie.spec.moe.routing_bias is True and ernie.spec.moe.routed_scaling_factor is None
    assert "moe_statics" in ernie.decision("moe.routing_bias").evidence
    aria = research(str(tiny_moe("AriaTextForCausalLM")))
    assert aria.spec.moe.dense_layers is None and aria.spec.moe.shared_experts == 1


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_named_refusal(tmp_path_factory, case):
    from autoport_cst.port import port
    from autoport_cst.research import research

    architecture, overrides, feature = REFUSALS[case]
    source = build(tmp_path_factory, architecture, overrides, f"refused-{case}")
    spec = research(str(source)).spec
    assert spec.unsupported is not None
    assert any(item.startswith(f"{feature}:") for item in spec.unsupported), spec.unsupported
    with pytest.raises(UnrealizableDiffError) as refused:
        port(str(source), "refused", tmp_path_factory.mktemp(f"refused-out-{case}"))
    assert "unsupported" in refused.value.fields
    assert not (tmp_path_factory.getbasetemp() / "refused" / "vllm_neuron").exists()


def test_group_limited_routing_without_latent_attention_is_refused_by_name(tmp_path_factory):
    """GLM-4-MoE restricting experts to the best groups: research reads the
    group limit (moe.group_limit, sum_top2), which only the deepseek_v3
    reference realizes, and GLM-4-MoE's attention is not latent attention:
    the port is refused naming the field and the codemod's missing site in
    qwen3_moe, nothing written."""
    from autoport_cst.port import port
    from autoport_cst.research import research

    overrides = {"n_group": 2, "topk_group": 1, "n_routed_experts": 8}
    source = build(tmp_path_factory, "Glm4MoeForCausalLM", overrides, "refused-glm4-moe-groups")
    assert research(str(source)).spec.moe.group_limit == "sum_top2"
    out = tmp_path_factory.mktemp("refused-glm4-moe-groups-out")
    with pytest.raises(UnrealizableDiffError) as refused:
        port(str(source), "refused_glm4_groups", out)
    assert "moe.group_limit" in str(refused.value) and "group-limit" in str(refused.value)
    assert not (out / "vllm_neuron").exists()
