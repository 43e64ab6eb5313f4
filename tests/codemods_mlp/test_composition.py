"""The composer picks these codemods from the architecture diff of the
example plans, with the parameters the target spec implies, and refuses the
directions they do not implement."""

from __future__ import annotations

import pytest

from autoport_cst.apply import compose, load_reference
from autoport_cst.errors import UnrealizableDiffError
from autoport_cst.plan import load_plan, parse_plan
from autoport_cst.transform.library import get_codemod

from .conftest import EXAMPLES, plan_dict

EXPECTED = {
    "gemma": {"embedding-scale", "mlp-activation", "norm-offset"},
    "gemma2": {"embedding-scale", "mlp-activation", "norm-offset", "norm-placement", "logit-softcap"},
    "phi3": {"fused-checkpoint"},
    "starcoder2": {"mlp-activation", "mlp-kind", "mlp-bias", "checkpoint-keys", "swap-norm", "add-qkv-bias"},
    "gpt_neox": {"mlp-activation", "parallel-residual", "fused-checkpoint", "checkpoint-keys", "swap-norm"},
    "phi": {"parallel-residual", "lm-head-bias", "checkpoint-keys", "swap-norm"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_plans_compose(name):
    plan = load_plan(EXAMPLES / f"{name}.plan.json")
    composition = compose(plan, load_reference(plan.reference))
    ids = [s.id for s in composition.steps]
    assert EXPECTED[name] <= set(ids), ids
    if "checkpoint-keys" in ids:  # after every step that writes mapping entries
        after = get_codemod("checkpoint-keys").AFTER
        assert not [i for i in ids[ids.index("checkpoint-keys") :] if i in after]


def test_parameters_follow_the_target_spec():
    plan = load_plan(EXAMPLES / "gemma2.plan.json")
    steps = {s.id: s.params_json() for s in compose(plan, load_reference("llama3")).steps}
    assert steps["norm-placement"]["placement"] == "sandwich"
    assert steps["mlp-activation"] == {"activation": "gelu_tanh"}
    assert steps["logit-softcap"] == {"config_key": "final_logit_softcapping"}
    phi3 = compose(load_plan(EXAMPLES / "phi3.plan.json"), load_reference("llama3"))
    fused = next(s for s in phi3.steps if s.id == "fused-checkpoint").params_json()
    assert fused["qkv"] and fused["gate_up"] and fused["qkv_layout"] == "concatenated"


@pytest.mark.parametrize(
    "reference, spec, field",
    [
        # a plain MLP has no gate weights to load
        ("starcoder2", {"mlp": {"kind": "gated", "activation": "gelu_tanh", "bias": True}}, "mlp.kind"),
        # removing biases, un-offsetting a norm, un-fusing: not implemented
        ("starcoder2", {"mlp": {"kind": "plain", "activation": "gelu_tanh", "bias": False}}, "mlp.bias"),
    ],
)
def test_unimplemented_directions_are_refused(reference, spec, field):
    base = {
        "norm": {"kind": "layernorm", "bias": True, "eps_key": "norm_epsilon"},
        "attention": {"qkv_bias": True, "o_bias": True, "sliding_window": "all"},
        "rope": {"type": "default"},
        "mlp": {"kind": "plain", "activation": "gelu_tanh", "bias": True},
        "embedding": {"tied": True},
    }
    base.update(spec)
    plan = parse_plan(plan_dict("demo", "DemoForCausalLM", base, reference=reference))
    with pytest.raises(UnrealizableDiffError) as info:
        compose(plan, load_reference(reference))
    assert field in info.value.fields
