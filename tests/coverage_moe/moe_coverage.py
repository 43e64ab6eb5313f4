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

The ports are tested by kind over ``test_moe_ports_*.py`` (sigmoid routers
with a routing bias, the Granite MoE family, the others: ``GROUPS``) so that
the suite's ``--dist loadfile`` can share them out between its workers; the
research and refusal tests are in ``test_moe_research_and_refusals.py``. This
module holds what they share.
"""

from __future__ import annotations

import pytest

from tests.moe.spec_steps import IDENTITY_AND_GUARDS, declared_steps

from .conftest import CONFIGS
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

# the test file of each architecture's port (test_moe_ports_<group>.py)
GROUPS: dict[str, list[str]] = {
    # sigmoid routers with a selection-only routing bias
    "sigmoid_routers": [
        "Dots1ForCausalLM",
        "Glm4MoeForCausalLM",
        "HYV3ForCausalLM",
        "MiniMaxM2ForCausalLM",
        "SolarOpenForCausalLM",
    ],
    # router under block_sparse_moe, the multipliers and divisor
    "granite": ["GraniteMoeForCausalLM", "GraniteMoeSWAForCausalLM", "GraniteMoeSharedForCausalLM"],
    # softmax routers: q/k norms, shared experts, interleaved RoPE, experts stored [in, out]
    "softmax_routers": [
        "AriaTextForCausalLM",
        "Ernie4_5_MoeForCausalLM",
        "HunYuanMoEV1ForCausalLM",
        "OlmoeForCausalLM",
    ],
}
assert sorted(a for names in GROUPS.values() for a in names) == sorted(CONFIGS), "an architecture in no group"


def architectures(group: str, known_wrong: dict[str, str] = KNOWN_WRONG) -> list:
    """The architectures of ``group`` (``GROUPS``) as parameters, those in
    ``known_wrong`` as strict xfails."""
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=known_wrong[name]))
        if name in known_wrong
        else name
        for name in GROUPS[group]
    ]


def check_port_validates(ported, tiny_moe, architecture: str) -> None:
    """The port of ``architecture``'s tiny checkpoint takes its expected steps
    from qwen3_moe and validates in fp32, and in bf16 but for routing near-ties."""
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


def check_validates_on_two_ranks(ported, architecture: str) -> None:
    outcome = ported(architecture, tp=2)
    tp2 = [run for run in outcome.runs if run.tp == 2]
    assert tp2 and all(run.equivalent for run in tp2), [run.summary for run in tp2]
