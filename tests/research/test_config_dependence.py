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


def test_every_field_the_code_reads_is_varied_and_what_it_changes_recorded(tiny):
    dependence = tiny.research("gemma2").config_dependence
    assert "query_pre_attn_scalar" in dependence.reads
    qpas = dependence.probe("query_pre_attn_scalar")
    assert (qpas.value, qpas.varied) == (16, 32)
    assert [(c.path, c.planned) for c in qpas.changes] == [("attention.scale", None)]
    bias = dependence.probe("attention_bias")
    assert {c.path for c in bias.changes} == {"attention.qkv_bias", "attention.o_bias"}
    eps = dependence.probe("rms_norm_eps")
    assert [(c.path, c.varied) for c in eps.changes] == [("norm.eps", 2e-6)]
    assert dependence.probe("attention_dropout").changes == ()
    skipped = dict(dependence.skipped)
    assert "_attn_implementation" in skipped and "rope_parameters.rope_type" in skipped


def test_the_plan_guards_what_the_port_bakes_in_and_reads_the_rest(tiny):
    from autoport_cst.plan import from_research
    from autoport_cst.plan.plan_file import assumptions_of

    found = tiny.research("gemma2")
    assumptions = assumptions_of(found, "smollm3")
    assert {g.field for g in assumptions.guards} == {"attention_bias", "hidden_activation"}
    assert {"query_pre_attn_scalar", "rms_norm_eps", "attn_logit_softcapping"} <= set(assumptions.runtime)
    assert "hidden_size" in assumptions.sizes
    plan = from_research(found, "gemma2", "smollm3", "test")
    (step,) = plan.steps
    assert step.codemod == "config-guards"
    assert [a["field"] for a in step.params["assumed"]] == ["attention_bias", "hidden_activation"]


def test_a_config_with_many_layers_is_probed_on_fewer(tiny):
    from autoport_cst.research.config_analysis import read_config, resolve_config
    from autoport_cst.research.config_dependence import probe_config, with_field
    from autoport_cst.research.sources import locate_modeling_source

    path = tiny.directory("gemma2") / "config.json"
    raw = with_field(read_config(path), "num_hidden_layers", 12)
    assert len(raw["layer_types"]) == 12  # per-layer lists follow the layer count
    resolved = resolve_config(raw, str(path))
    modeling = locate_modeling_source("gemma2", str(path))
    dependence = probe_config(raw, resolved, str(path), modeling, "Gemma2ForCausalLM", ("attention_bias",))
    assert dependence.layers == 4
    assert {c.path for c in dependence.probe("attention_bias").changes} == {
        "attention.qkv_bias",
        "attention.o_bias",
    }


def test_plan_says_which_config_values_the_port_will_refuse(tiny, tmp_path):
    from click.testing import CliRunner

    from autoport_cst.cli import cli

    out = tmp_path / "gemma2.plan.json"
    result = CliRunner().invoke(
        cli, ["plan", str(tiny.directory("gemma2")), "--name", "gemma2", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert (
        "config guards (the port refuses other values): attention_bias = False, "
        "hidden_activation = 'gelu_pytorch_tanh'" in " ".join(result.output.split())
    )


def test_a_plan_from_a_reference_directory_named_by_its_manifest_is_still_guarded(tiny):
    # port --ref <a port's directory> plans with the manifest's name, which no
    # built-in reference has: nothing counts as read from the config
    from autoport_cst.plan import from_research

    plan = from_research(tiny.research("gemma2"), "gemma2_again", "my_gemma2_port", "test")
    (step,) = plan.steps
    assert {a["field"] for a in step.params["assumed"]} >= {"attention_bias", "hidden_activation"}


def test_a_kv_head_per_query_head_is_a_size_not_a_baked_in_value(tiny):
    """Doubling num_key_value_heads of a model with a KV head per query head
    gives more KV heads than query heads, which no attention computes; it is
    not read as a repeat count the port fixes (before, every such port was
    guarded on its KV head count and refused its own TP layouts that
    replicate KV heads: Nemotron's in the corpus)."""
    from autoport_cst.plan.plan_file import assumptions_of

    found = tiny.research("llama_mha")
    kv = found.config_dependence.probe("num_key_value_heads")
    assert (kv.value, kv.varied) == (4, 8)
    assert [(c.path, c.varied) for c in kv.changes] == [("attention.num_kv_heads", 8)]
    assumptions = assumptions_of(found, "llama3")
    assert "num_key_value_heads" not in {g.field for g in assumptions.guards}
    assert "num_key_value_heads" in assumptions.sizes
