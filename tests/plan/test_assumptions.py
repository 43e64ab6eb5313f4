"""What a port assumes about the configs it is used with: each change the
research saw when it varied a config field, judged against the port."""

from __future__ import annotations

import dataclasses

from autoport_cst.plan.assumptions import config_assumptions
from autoport_cst.research.config_dependence import ConfigDependence, FieldProbe, SpecChange
from autoport_cst.spec import ArchSpec

# Gemma 2 planned on query_pre_attn_scalar == head_dim: the scale read from the field
GEMMA2 = ArchSpec(attention=dataclasses.replace(ArchSpec().attention, softcap=50.0))
READ_SCALE = dataclasses.replace(
    GEMMA2,
    attention=dataclasses.replace(
        GEMMA2.attention, scale_key="query_pre_attn_scalar", scale_form="inverse_sqrt"
    ),
)


def probe(field, value, varied, *changes, unknown=(), given=(), error=None):
    return FieldProbe(
        field,
        value,
        varied,
        default=value,
        changes=tuple(SpecChange(*c) for c in changes),
        unknown=unknown,
        given=given,
        error=error,
    )


def judge(*probes, spec=GEMMA2, config_driven=None):
    return config_assumptions(ConfigDependence((), probes), spec, config_driven or {})


QPAS = probe("query_pre_attn_scalar", 16, 32, ("attention.scale", "optional", None, 32**-0.5))


def test_a_scale_the_port_computes_from_its_field_follows_the_config():
    found = judge(QPAS, spec=READ_SCALE)
    assert found.runtime == ("query_pre_attn_scalar",) and not found.guards


def test_a_scale_baked_in_as_head_dim_is_guarded_naming_both_values():
    # the port of the issue: planned where the field equals head_dim, no scale step
    (guard,) = judge(QPAS).guards
    assert (guard.field, guard.value, guard.varied, guard.fixes) == (
        "query_pre_attn_scalar",
        16,
        32,
        ("attention.scale",),
    )
    assert judge(QPAS).step() == {
        "codemod": "config-guards",
        "params": {"assumed": [guard.params()]},
    }


def test_values_follow_the_field_that_holds_them():
    eps = probe("rms_norm_eps", 1e-6, 2e-6, ("norm.eps", "value", 1e-6, 2e-6))
    theta = probe(
        "rope_parameters.rope_theta",
        1e4,
        2e4,
        ("rope.parameters", "value", {"rope_theta": 1e4}, {"rope_theta": 2e4}),
    )
    window = probe(
        "use_bidirectional_attention", False, True, ("attention.sliding_window_size", "value", 6, 4)
    )
    found = judge(eps, theta, window)
    assert found.runtime == ("rms_norm_eps", "rope_parameters.rope_theta")
    # the window computed from another field than the one the port reads
    assert [g.field for g in found.guards] == ["use_bidirectional_attention"]


def test_sizes_are_read_at_run_time_and_not_varied():
    hidden = probe(
        "hidden_size", 64, 128, ("hidden_size", "value", 64, 128), ("attention.head_dim", "value", 16, 32)
    )
    found = judge(hidden)
    assert found.sizes == ("hidden_size",) and not found.runtime and not found.guards


def test_optional_fields_follow_when_the_port_has_them():
    softcap = probe("attn_logit_softcapping", 50.0, 100.0, ("attention.softcap", "optional", 50.0, 100.0))
    final = probe("final_logit_softcapping", None, 0.5, ("lm_head.softcap", "optional", None, 0.5))
    found = judge(softcap, final)
    assert found.runtime == ("attn_logit_softcapping",)
    assert [(g.field, g.value, g.varied) for g in found.guards] == [("final_logit_softcapping", None, 0.5)]


def test_features_follow_only_when_the_reference_reads_them():
    bias = probe("attention_bias", False, True, ("attention.qkv_bias", "feature", False, True))
    tied = probe("tie_word_embeddings", True, False, ("embedding.tied", "feature", True, False))
    found = judge(bias, tied, config_driven={"embedding.tied": [False, True]})
    assert found.runtime == ("tie_word_embeddings",)
    assert [(g.field, g.fixes) for g in found.guards] == [("attention_bias", ("attention.qkv_bias",))]


def test_what_the_research_cannot_classify_any_more_is_guarded():
    act = probe(
        "hidden_activation",
        "gelu_pytorch_tanh",
        "gelu_pytorch_tanh_varied",
        ("mlp.activation", "feature", "gelu_tanh", "silu"),
        ("unsupported", "optional", None, ("mlp.activation: ...",)),
        unknown=("mlp.activation",),
    )
    (guard,) = judge(act).guards
    assert guard.fixes == ("mlp.activation",)


def test_per_layer_types_are_guarded_by_their_entries():
    full = ["full_attention", "full_attention"]
    sliding = probe(
        "layer_types",
        full,
        ["full_attention", "sliding_attention"],
        ("attention.sliding_window", "feature", "none", "per_layer"),
    )
    chunked = probe(
        "layer_types",
        full,
        ["full_attention", "chunked_attention"],
        ("attention.layer_types", "value", tuple(full), ("full_attention", "chunked_attention")),
    )
    (guard,) = judge(sliding, chunked).guards
    assert guard.allowed == ("full_attention", "chunked_attention")
    assert guard.refused_entry() == "sliding_attention"
    assert guard.params()["allowed"] == ["full_attention", "chunked_attention"]
    # absent, the config class derives the list: no default to compare with
    assert guard.default is None
    from autoport_cst.transform.library import get_codemod

    step = judge(sliding, chunked).step()
    get_codemod(step["codemod"]).parse_params(step["params"])  # a valid plan step


def test_a_field_read_only_under_another_variation_is_charged_to_that_field():
    full = ["full_attention", "full_attention"]
    varied = ["full_attention", "sliding_attention"]
    types = probe("layer_types", full, varied, ("attention.layer_types", "value", tuple(full), tuple(varied)))
    window = probe(
        "sliding_window",
        None,
        4,
        ("attention.sliding_window", "feature", "none", "per_layer"),
        given=(("layer_types", full, varied),),
    )
    (guard,) = judge(types, window).guards
    assert (guard.field, guard.allowed, guard.fixes) == (
        "layer_types",
        ("full_attention",),
        ("attention.sliding_window",),
    )


def test_unchanged_and_unresearched_fields_are_listed_apart():
    dropout = probe("attention_dropout", 0.0, 0.5)
    layers = probe("num_hidden_layers", 2, 4, error="ValueError: layer_types")
    found = judge(dropout, layers)
    assert found.unseen == ("attention_dropout",)
    assert found.inconclusive == (("num_hidden_layers", "ValueError: layer_types"),)
    assert found.step() is None


def test_two_fields_the_model_needs_equal_are_guarded_by_the_relation():
    # Falcon without multi-query: either head count varied alone is unsupported,
    # both varied together only change sizes the port reads at run time
    unsupported = ("unsupported", "value", [], ["qkv_head_groups"])
    heads = probe("num_attention_heads", 4, 8, unsupported)
    kv = probe("num_kv_heads", 4, 8, unsupported)
    joint = dataclasses.replace(
        probe(
            "num_kv_heads",
            4,
            8,
            ("attention.num_heads", "value", 4, 8),
            ("attention.num_kv_heads", "value", 4, 8),
        ),
        together="num_attention_heads",
    )
    found = judge(heads, kv, joint)
    (guard,) = found.guards
    assert (guard.field, guard.same_as, guard.value, guard.refused_entry()) == (
        "num_kv_heads",
        "num_attention_heads",
        4,
        8,
    )
    assert guard.params()["same_as"] == "num_attention_heads" and guard.fixes == ("unsupported",)
    assert found.sizes == ("num_attention_heads", "num_kv_heads")


def test_a_relation_the_port_does_not_follow_keeps_the_value_guards():
    unsupported = ("unsupported", "value", [], ["qkv_head_groups"])
    heads = probe("num_attention_heads", 4, 8, unsupported)
    kv = probe("num_kv_heads", 4, 8, unsupported)
    joint = dataclasses.replace(
        probe("num_kv_heads", 4, 8, ("attention.multi_query_key", "feature", None, "x")),
        together="num_attention_heads",
    )
    found = judge(heads, kv, joint)
    assert [(g.field, g.same_as) for g in found.guards][:2] == [
        ("num_attention_heads", None),
        ("num_kv_heads", None),
    ]
