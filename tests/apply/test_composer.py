"""The composer: codemods chosen and ordered from the architecture diff."""

from __future__ import annotations

import dataclasses

import pytest

from autoport_cst.apply import compose, load_reference
from autoport_cst.apply.composer import Step, order_steps
from autoport_cst.errors import MultiInputError, UnrealizableDiffError
from autoport_cst.plan import parse_plan
from autoport_cst.transform.library import get_codemod


@pytest.fixture(scope="module")
def llama3():
    return load_reference("llama3")


def plan(**spec):
    return parse_plan(
        {"version": 1, "name": "demo", "architecture": "DemoForCausalLM", "reference": "llama3", "spec": spec}
    )


def ids(composition):
    return [s.id for s in composition.steps]


def test_same_architecture_only_renames(llama3):
    composition = compose(plan(rope={"type": "llama3"}), llama3)
    assert ids(composition) == ["rename-classes"]
    assert composition.diffs == ()


def test_same_prefix_needs_no_rename(llama3):
    data = {
        "version": 1,
        "name": "llama",
        "architecture": "LlamaForCausalLM",
        "spec": {"rope": {"type": "llama3"}},
    }
    assert ids(compose(parse_plan(data), llama3)) == []


def test_qkv_bias_and_layernorm(llama3):
    composition = compose(
        plan(
            attention={"qkv_bias": True, "o_bias": True},
            norm={"kind": "layernorm", "bias": True, "eps_key": "layer_norm_eps"},
        ),
        llama3,
    )
    assert ids(composition) == ["rename-classes", "add-qkv-bias", "swap-norm"]
    steps = {s.id: s for s in composition.steps}
    assert steps["add-qkv-bias"].params.qkv and steps["add-qkv-bias"].params.o
    assert steps["add-qkv-bias"].realizes == ("attention.qkv_bias", "attention.o_bias")
    assert steps["swap-norm"].params.kind == "layernorm"
    assert steps["swap-norm"].realizes == ("norm.kind", "norm.bias", "norm.eps_key")


def test_config_driven_features_need_no_codemod(llama3):
    composition = compose(plan(rope={"type": "default"}, embedding={"tied": True}), llama3)
    assert ids(composition) == ["rename-classes"]
    assert [d.path for d in composition.by_config] == ["rope.type", "embedding.tied"]


def test_values_are_read_from_the_config(llama3):
    composition = compose(plan(hidden_size=64, attention={"num_heads": 4}, rope={"type": "llama3"}), llama3)
    assert ids(composition) == ["rename-classes"]


def test_unrealizable_fields_are_all_listed(llama3):
    """No codemod turns a dense reference into a mixture of experts, nor
    removes a norm's (1 + weight) offset."""
    reference = dataclasses.replace(
        llama3,
        manifest=dataclasses.replace(
            llama3.manifest,
            spec=dataclasses.replace(
                llama3.spec, norm=dataclasses.replace(llama3.spec.norm, unit_offset=True)
            ),
        ),
    )
    with pytest.raises(UnrealizableDiffError) as info:
        compose(plan(moe={"num_experts": 4, "top_k": 2}, rope={"type": "llama3"}), reference)
    assert info.value.fields == ["norm.unit_offset", "moe"]
    assert "no codemod realizes 2 field(s)" in str(info.value)


def test_removing_a_bias_is_not_realized_by_add_qkv_bias(llama3):
    reference = dataclasses.replace(
        llama3,
        manifest=dataclasses.replace(
            llama3.manifest,
            spec=dataclasses.replace(
                llama3.spec, attention=dataclasses.replace(llama3.spec.attention, qkv_bias=True)
            ),
        ),
    )
    with pytest.raises(UnrealizableDiffError) as info:
        compose(plan(rope={"type": "llama3"}), reference)
    assert info.value.fields == ["attention.qkv_bias"]


def test_explicit_steps_take_precedence(llama3):
    data = {
        "version": 1,
        "name": "demo",
        "architecture": "DemoForCausalLM",
        "spec": {"attention": {"qkv_bias": True}},
        "steps": [
            {"codemod": "add-qkv-bias", "params": {"qkv": True, "o": True}},
            {"codemod": "lazy-rope"},
        ],
    }
    composition = compose(parse_plan(data), llama3)
    assert ids(composition) == ["rename-classes", "add-qkv-bias", "lazy-rope"]
    explicit = composition.steps[1]
    assert explicit.origin == "plan" and explicit.params.o is True


def test_explicit_step_errors_have_json_paths(llama3):
    data = {
        "version": 1,
        "name": "demo",
        "architecture": "DemoForCausalLM",
        "steps": [{"codemod": "no-such-codemod"}, {"codemod": "swap-norm", "params": {"kind": "batch"}}],
    }
    with pytest.raises(MultiInputError) as info:
        compose(parse_plan(data), llama3, "demo.plan.json")
    assert [e.position.json_path for e in info.value.errors] == [
        "$.steps[0].codemod",
        "$.steps[1].params.kind",
    ]


def test_order_follows_after_constraints_then_id():
    unsqueeze, add_bias, rename = (
        get_codemod(i) for i in ("unsqueeze-decode-biases", "add-qkv-bias", "rename-classes")
    )
    steps = [
        Step(add_bias, add_bias.Params(), "plan"),
        Step(unsqueeze, unsqueeze.Params(), "plan"),
        Step(rename, rename.Params(), "identity"),
    ]
    assert [s.id for s in order_steps(steps)] == ["rename-classes", "unsqueeze-decode-biases", "add-qkv-bias"]


def test_composition_is_deterministic(llama3):
    p = plan(attention={"qkv_bias": True}, norm={"kind": "layernorm", "bias": True})
    first = [(s.id, s.params_json()) for s in compose(p, llama3).steps]
    for _ in range(5):
        assert [(s.id, s.params_json()) for s in compose(p, llama3).steps] == first
