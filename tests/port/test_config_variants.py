"""A port is for its architecture, not for the one config it was planned on.

The issue's case: a tiny Gemma 2 config with query_pre_attn_scalar ==
head_dim, where the attention scale equals head_dim ** -0.5. The port must
read the field (and validate on a config where it is 32), and refuse by name
the configs its code does not follow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from autoport_cst.port import port  # noqa: E402
from autoport_cst.validate import build_tiny_checkpoint, validate_model  # noqa: E402


@pytest.fixture(scope="module")
def gemma2_port(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma2-variants")
    source = root / "planned"
    build_tiny_checkpoint("Gemma2ForCausalLM", source, dimensions={"query_pre_attn_scalar": 16})
    assert json.loads((source / "config.json").read_text())["head_dim"] == 16
    return root, port(str(source), "gemma2_eq", root / "out", steps=8)


@pytest.mark.slow
def test_the_port_reads_query_pre_attn_scalar_and_validates_beyond_its_config(gemma2_port):
    root, outcome = gemma2_port
    assert outcome.validated, [r.summary for r in [*outcome.runs, *outcome.variant_runs]]
    assert "attention-scale" in outcome.steps
    # validated again with the field varied away from head_dim (and every field the port reads)
    assert outcome.variant["query_pre_attn_scalar"] == [16, 32]
    assert "head_dim" not in outcome.variant
    assert [r.equivalent for r in outcome.variant_runs] == [True]
    # a Gemma-2-9B-like config: the field differs from the head size
    other = root / "qpas32"
    build_tiny_checkpoint("Gemma2ForCausalLM", other, seed=3, dimensions={"query_pre_attn_scalar": 32})
    report = validate_model(outcome.package_dir, other, tp=1, dtype="fp32", steps=8, seed=3)
    assert report.equivalent, report.summary()


@pytest.mark.slow
def test_the_port_refuses_by_name_what_its_code_fixes(gemma2_port):
    _, outcome = gemma2_port
    refused = {g.field: g for g in outcome.guards}
    assert set(refused) == {"attention_bias", "hidden_activation"}
    assert all(g.refused for g in outcome.guards)
    message = refused["attention_bias"].message
    assert "attention_bias is True" in message and "attention_bias = False" in message
    plan = json.loads(Path(outcome.plan_path).read_text())
    (step,) = [s for s in plan["steps"] if s["codemod"] == "config-guards"]
    assert [a["field"] for a in step["params"]["assumed"]] == ["attention_bias", "hidden_activation"]


def test_a_varied_field_the_port_refuses_by_name_while_building_is_a_refusal():
    from types import SimpleNamespace

    from autoport_cst.port_variants import _refused_field

    changed = {"swiglu_alpha": (1.702, 3.404), "rope_parameters.rope_theta": (1e4, 2e4)}

    def failed(stage, message):
        return SimpleNamespace(failure=SimpleNamespace(stage=stage, message=message))

    own_check = (
        "ValueError: GptOssForCausalLM: swiglu_alpha 3.404 is not supported; the kernels compute 1.702"
    )
    assert _refused_field(failed("build", own_check), changed) == "swiglu_alpha"
    assert _refused_field(failed("build", "ValueError: rope_theta 20000.0 is not supported"), changed) == (
        "rope_parameters.rope_theta"
    )
    # a crash, another stage, or a message that names no varied value is no refusal
    assert _refused_field(failed("build", "TypeError: swiglu_alpha 3.404"), changed) is None
    assert _refused_field(failed("load", "ValueError: swiglu_alpha 3.404"), changed) is None
    assert _refused_field(failed("build", "ValueError: swiglu_alpha is odd"), changed) is None
    assert _refused_field(SimpleNamespace(failure=None), changed) is None


def test_a_guard_check_needs_the_field_and_both_values_named():
    from autoport_cst.plan.assumptions import Guard
    from autoport_cst.validate.variants import _check

    def factory_raising(message):
        class Factory:
            @staticmethod
            def from_configs(config, neuron_config):
                raise ValueError(message)

        return Factory

    bias = Guard("attention_bias", False, False, ("attention.qkv_bias",), True)
    named = "config field attention_bias is True, but this port was made for attention_bias = False"
    assert _check(factory_raising(named), {"model_type": "llama"}, bias).refused
    assert not _check(factory_raising("attention_bias is odd"), {"model_type": "llama"}, bias).refused
    types = Guard(
        "layer_types",
        ["full_attention"],
        None,
        ("attention.sliding_window",),
        ["sliding_attention"],
        allowed=("full_attention",),
    )
    listed = "config field layer_types holds 'sliding_attention', but ... entries in ['full_attention']"
    assert _check(factory_raising(listed), {"model_type": "llama"}, types).refused

    class Builds:
        @staticmethod
        def from_configs(config, neuron_config):
            return object()

    check = _check(Builds, {"model_type": "llama"}, bias)
    assert not check.refused and check.message == "the port built the model"


def test_port_says_what_the_checks_beyond_the_planned_config_found():
    from types import SimpleNamespace

    from autoport_cst.port import PortOutcome
    from autoport_cst.port_variants import config_check_lines
    from autoport_cst.validate.variants import GuardCheck
    from autoport_cst.validation_runs import ValidationRun

    outcome = PortOutcome("gemma2", "Gemma2ForCausalLM", runs=[SimpleNamespace(equivalent=True)])
    outcome.variant = {"query_pre_attn_scalar": [16, 32]}
    outcome.variant_runs = [ValidationRun(1, "fp32", False, "rel_error 0.3", "layers.0.attention", None, 1.0)]
    outcome.guards = [
        GuardCheck("attention_bias", True, False, True, "config field attention_bias is True, ...")
    ]
    variant, guard = config_check_lines(outcome)
    assert "query_pre_attn_scalar 16 -> 32" in variant and "NOT equivalent: rel_error 0.3" in variant
    assert guard == "config guard: attention_bias = True (made for False): refused"
    assert not outcome.validated  # the variant run counts
    assert outcome.to_dict()["variant"] == {"query_pre_attn_scalar": [16, 32]}
