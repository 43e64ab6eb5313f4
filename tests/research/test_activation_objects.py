"""Older modeling code takes its activation from the objects
transformers.activations defines by name (OpenAI GPT's ``ACT_FNS = {"gelu":
gelu_new, ...}``). Research reads that call as the activation it is, so the
block's ``mlp`` is an MLP and the layers are found; what is left unrealized is
named by what the code computes, not as "no decoder layers found"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")


def _research(tmp_path: Path, model_type: str, architecture: str, **values):
    from transformers import AutoConfig

    from autoport_cst.research import research

    config = AutoConfig.for_model(model_type, **values).to_dict()
    config["architectures"] = [architecture]
    directory = tmp_path / model_type
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return research(str(directory))


def test_openai_gpt_activation_object_makes_its_mlp_an_mlp(tmp_path):
    result = _research(tmp_path, "openai-gpt", "OpenAIGPTLMHeadModel", afn="gelu")
    unsupported = "\n".join(result.spec.unsupported or ())
    assert "code.decoder_layers" not in unsupported
    # ACT_FNS maps the config's "gelu" to transformers' gelu_new, the tanh
    # approximation (the spec's canonical name for it)
    assert result.spec.mlp.activation == "gelu_tanh"
    assert "explicit_attention" in unsupported


def test_a_function_outside_transformers_activations_is_not_an_activation():
    from autoport_cst.research.interp.externals import transformers_activation
    from autoport_cst.research.interp.values import External

    assert transformers_activation(External("transformers.activations.linear_act")).name == "linear"
    assert transformers_activation(External("transformers.activations.get_activation")) is None
    assert transformers_activation(External("mylib.activations.gelu_new")) is None
