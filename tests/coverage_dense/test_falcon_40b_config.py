"""Falcon-40B as its config.json is published: the new decoder architecture
with neither ``ffn_hidden_size`` nor ``num_ln_in_parallel_attn``, which
transformers fills in (4 x ``hidden_size`` in the config class; 2 in the
decoder layer's ``__init__``, which sets it on the config object).

Before: research read the forward with the field None (one norm before the
attention, none before the MLP: refused as a mixed norm placement), the tiny
checkpoint kept the full-size MLP width (8.4 M parameters: refused) and its
config.json the 2 the layer had set, which the port's guard (planned on None)
refused at build. And a port planned on the published config (the field
None) refused a config that states the 2 (any ``save_pretrained`` of the
loaded model): the guard now takes the value the layers set as the same
model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autoport_cst.validate import build_tiny_checkpoint

FALCON_40B = {
    "alibi": False,
    "apply_residual_connection_post_layernorm": False,
    "architectures": ["FalconForCausalLM"],
    "attention_dropout": 0.0,
    "bias": False,
    "bos_token_id": 11,
    "eos_token_id": 11,
    "hidden_dropout": 0.0,
    "hidden_size": 8192,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "falcon",
    "new_decoder_architecture": True,
    "num_attention_heads": 128,
    "num_hidden_layers": 60,
    "num_kv_heads": 8,
    "parallel_attn": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 65024,
}


@pytest.fixture
def falcon_40b(tmp_path: Path) -> Path:
    pytest.importorskip("transformers")
    source = tmp_path / "falcon-40b"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(FALCON_40B), encoding="utf-8")
    return source


def test_the_tiny_checkpoint_derives_the_mlp_width_and_keeps_the_config_as_given(falcon_40b, tmp_path):
    tiny = build_tiny_checkpoint(str(falcon_40b), tmp_path / "tiny", seed=0)
    written = json.loads((tmp_path / "tiny" / "config.json").read_text(encoding="utf-8"))
    assert written["ffn_hidden_size"] == 4 * written["hidden_size"]
    assert written.get("num_ln_in_parallel_attn") is None
    assert tiny.num_parameters < 1_000_000


def test_research_reads_the_two_norms_the_layer_sets(falcon_40b):
    from autoport_cst.research import research

    spec = research(str(falcon_40b)).spec
    assert (spec.norm.placement, spec.residual.parallel) == ("pre", "separate_norms")
    assert spec.checkpoint.qkv == "fused_kv_groups"


def test_the_guard_takes_the_value_the_layers_set_as_the_planned_none(falcon_40b):
    """Research builds the model (meta device) and reads the 2 its layers set
    where the config holds None; the guard the plan writes accepts None, a
    missing field and 2, and still refuses 1 (one norm: another model)."""
    from autoport_cst.codemods.config_guards import ConfigGuards

    from autoport_cst.plan.plan_file import assumptions_of
    from autoport_cst.research import research

    step = assumptions_of(research(str(falcon_40b)), "llama3").step()
    assumed = {entry["field"]: entry for entry in step["params"]["assumed"]}
    assert assumed["num_ln_in_parallel_attn"]["value"] is None
    assert assumed["num_ln_in_parallel_attn"]["also"] == [2]
    assert assumed["new_decoder_architecture"]["value"] is True  # what the 2 depends on is guarded too
    assert "also" not in assumed["parallel_attn"]  # set by no layer: nothing else accepted

    codemod = ConfigGuards(ConfigGuards.parse_params(step["params"]))  # the plan's step, as apply reads it
    namespace: dict = {}
    exec(codemod._function(), namespace)  # noqa: S102 - the generated guard itself is under test
    check = namespace["check_assumed_config"]
    planned = {k: FALCON_40B.get(k, entry["default"]) for k, entry in assumed.items()}
    for value in (None, 2):
        check({**planned, "num_ln_in_parallel_attn": value})
    check({k: v for k, v in planned.items() if k != "num_ln_in_parallel_attn"})
    with pytest.raises(ValueError, match="num_ln_in_parallel_attn is 1, but this port was made for"):
        check({**planned, "num_ln_in_parallel_attn": 1})


@pytest.mark.slow
def test_the_published_config_ports_and_validates(falcon_40b, tmp_path):
    from autoport_cst.port import port

    outcome = port(str(falcon_40b), "falcon_40b", tmp_path / "ports", tp=2, steps=8)
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    # the same checkpoint with the 2 the layers set stated, as save_pretrained writes it: the same model
    from autoport_cst.validate import validate_model

    assert outcome.checkpoint_dir is not None and outcome.package_dir is not None
    stated = tmp_path / "stated"
    shutil.copytree(outcome.checkpoint_dir, stated)
    config = json.loads((stated / "config.json").read_text(encoding="utf-8"))
    (stated / "config.json").write_text(
        json.dumps({**config, "num_ln_in_parallel_attn": 2}), encoding="utf-8"
    )
    report = validate_model(outcome.package_dir, stated, steps=4)
    assert report.equivalent, report.summary()
