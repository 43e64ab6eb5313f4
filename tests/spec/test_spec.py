"""The architecture spec: diffs name exactly the differing fields, JSON
round trips, and the published schemas agree with the loaders."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
from hypothesis import given
from hypothesis import strategies as st

from autoport_cst.spec import (
    ArchSpec,
    AttentionSpec,
    MoESpec,
    NormSpec,
    diff_specs,
    from_json,
    get_field,
    leaf_fields,
    schema_of,
    to_json,
)

FEATURES_COVERED = [
    "norm.kind",
    "norm.bias",
    "norm.unit_offset",
    "norm.placement",
    "norm.eps",
    "attention.qkv_bias",
    "attention.o_bias",
    "attention.qk_norm",
    "attention.num_heads",
    "attention.num_kv_heads",
    "attention.head_dim",
    "attention.sliding_window",
    "attention.layer_types",
    "attention.softcap",
    "mlp.kind",
    "mlp.activation",
    "mlp.bias",
    "lm_head.bias",
    "rope.type",
    "rope.parameters",
    "rope.partial_rotary_factor",
    "rope.style",
    "embedding.tied",
    "embedding.scale",
    "embedding.multiplier",
    "moe",
    "moe.num_experts",
    "moe.top_k",
    "moe.shared_experts",
    "moe.router_activation",
    "moe.routing_bias",
    "moe.norm_topk_prob",
    "residual.parallel",
    "residual.multiplier",
    "lm_head.softcap",
]


def test_spec_covers_the_field():
    paths = {path for path, _, _ in leaf_fields()}
    assert set(FEATURES_COVERED) <= paths


def test_every_leaf_field_is_documented_and_has_a_role():
    for path, role, doc in leaf_fields():
        assert role in ("feature", "value", "optional"), path
        assert doc, path


def test_identical_specs_have_no_diff():
    assert diff_specs(ArchSpec(), ArchSpec()) == []


def test_diff_names_exactly_the_changed_fields():
    target = dataclasses.replace(
        ArchSpec(),
        norm=NormSpec(kind="layernorm", bias=True),
        attention=AttentionSpec(qkv_bias=True),
    )
    assert [d.path for d in diff_specs(ArchSpec(), target)] == [
        "norm.kind",
        "norm.bias",
        "attention.qkv_bias",
    ]


def test_values_left_open_by_the_reference_never_differ():
    target = dataclasses.replace(ArchSpec(), hidden_size=64, attention=AttentionSpec(num_heads=4))
    assert diff_specs(ArchSpec(), target) == []
    other = dataclasses.replace(ArchSpec(), hidden_size=128)
    [diff] = diff_specs(other, target)
    assert diff.path == "hidden_size" and not diff.needs_code_change


def test_optional_fields_distinguish_presence_from_value():
    with_cap = dataclasses.replace(ArchSpec(), attention=AttentionSpec(softcap=50.0))
    other_cap = dataclasses.replace(ArchSpec(), attention=AttentionSpec(softcap=30.0))
    [presence] = diff_specs(ArchSpec(), with_cap)
    assert presence.needs_code_change
    [value] = diff_specs(with_cap, other_cap)
    assert not value.needs_code_change


def test_moe_section_diff():
    dense, moe = ArchSpec(), dataclasses.replace(ArchSpec(), moe=MoESpec(num_experts=8, top_k=2))
    [diff] = diff_specs(dense, moe)
    assert diff.path == "moe" and diff.needs_code_change
    sigmoid = dataclasses.replace(moe, moe=MoESpec(num_experts=8, top_k=2, router_activation="sigmoid"))
    assert [d.path for d in diff_specs(moe, sigmoid)] == ["moe.router_activation"]


def test_loading_reports_every_error_with_its_path():
    spec, problems = from_json(
        ArchSpec,
        {
            "norm": {"kind": "groupnorm", "bias": "yes"},
            "mlp": {"kind": "gated", "extra": 1},
            "hidden_size": True,
        },
    )
    assert spec is None
    assert {p.json_path for p in problems} == {
        "$.norm.kind",
        "$.norm.bias",
        "$.mlp.extra",
        "$.hidden_size",
    }


def _spec_schema():
    definitions: dict = {}
    root = schema_of(ArchSpec, definitions)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **root, "$defs": definitions}


def test_schema_is_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(_spec_schema())


# -- round trips over generated specs -----------------------------------------


def _leaf_strategy(path: str):
    annotations = {
        "norm.kind": st.sampled_from(["rmsnorm", "layernorm"]),
        "norm.placement": st.sampled_from(["pre", "post", "sandwich"]),
        "attention.qk_norm": st.sampled_from(["none", "per_head", "full_width"]),
        "attention.sliding_window": st.sampled_from(["none", "all", "per_layer"]),
        "rope.type": st.sampled_from(["default", "llama3", "linear", "dynamic", "yarn", "longrope", "none"]),
        "mlp.kind": st.sampled_from(["gated", "plain"]),
        "mlp.activation": st.sampled_from(["silu", "gelu", "gelu_tanh", "relu"]),
    }
    return annotations.get(path)


specs = st.builds(
    lambda norm_kind, bias, qkv, o, rope, mlp, tied, heads, cap, moe: ArchSpec(
        hidden_size=heads * 16,
        norm=NormSpec(kind=norm_kind, bias=bias and norm_kind == "layernorm"),
        attention=AttentionSpec(num_heads=heads, qkv_bias=qkv, o_bias=o, softcap=cap),
        rope=dataclasses.replace(ArchSpec().rope, type=rope),
        mlp=dataclasses.replace(ArchSpec().mlp, kind=mlp),
        embedding=dataclasses.replace(ArchSpec().embedding, tied=tied),
        moe=MoESpec(num_experts=moe, top_k=2) if moe else None,
    ),
    _leaf_strategy("norm.kind"),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    _leaf_strategy("rope.type"),
    _leaf_strategy("mlp.kind"),
    st.booleans(),
    st.integers(1, 64),
    st.one_of(st.none(), st.floats(1, 100)),
    st.one_of(st.just(0), st.integers(2, 64)),
)


@given(specs)
def test_json_round_trip(spec):
    data = json.loads(json.dumps(to_json(spec)))
    loaded, problems = from_json(ArchSpec, data)
    assert problems == [] and loaded == spec
    jsonschema.validate(data, _spec_schema())


@given(specs, specs)
def test_diff_is_exactly_the_differing_leaves(a, b):
    diffs = {d.path for d in diff_specs(a, b)}
    for path, role, _ in leaf_fields():
        if path.startswith("moe.") and (a.moe is None or b.moe is None):
            continue
        va, vb = get_field(a, path), get_field(b, path)
        if path == "moe":
            differs = (va is None) != (vb is None)
        elif role == "value" and (va is None or vb is None):
            differs = False
        else:
            differs = va != vb
        assert (path in diffs) == differs, path
