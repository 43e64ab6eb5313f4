"""Config fields the modeling code reads, and the plan decisions that depend
on them: a port is for an architecture, not for the one config it was
planned on."""

from __future__ import annotations


def test_a_default_scale_computed_from_a_config_field_keeps_the_field(tiny):
    # the tiny Gemma 2 has query_pre_attn_scalar == head_dim: the scale equals
    # head_dim ** -0.5 here, but the code computes it from the field
    found = tiny.research("gemma2")
    attention = found.spec.attention
    assert attention.scale is None
    assert (attention.scale_key, attention.scale_form) == ("query_pre_attn_scalar", "inverse_sqrt")


def test_a_scale_computed_from_the_head_size_names_no_field(tiny):
    attention = tiny.research("llama").spec.attention
    assert (attention.scale, attention.scale_key) == (None, None)


def test_the_code_analysis_lists_the_config_fields_it_read(tiny):
    from autoport_cst.research.code_analysis import analyze_code
    from autoport_cst.research.config_analysis import analyze_config, read_config, resolve_config
    from autoport_cst.research.sources import locate_modeling_source

    path = tiny.directory("gemma2") / "config.json"
    raw = read_config(path)
    resolved = resolve_config(raw, str(path))
    cfg = analyze_config(raw, resolved, str(path))
    code = analyze_code(locate_modeling_source("gemma2", str(path)), resolved, cfg.architecture, cfg.dims)
    assert {"query_pre_attn_scalar", "hidden_activation", "rms_norm_eps", "attn_logit_softcapping"} <= set(
        code.config_reads
    )
    assert "vocab_size" in code.config_reads
