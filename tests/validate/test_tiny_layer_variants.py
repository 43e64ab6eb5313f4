"""Tiny checkpoints instantiate every per-layer variant their config can
express: the layer count grows until each kind of layer of the full-depth
model is there (read from the model transformers builds, not from names)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoport_cst.validate.tiny import build_tiny_checkpoint, resolve_config, shrink_config, tiny_dimensions


def _tiny_config(source):
    import transformers

    config, architecture = resolve_config(source)
    model_class = getattr(transformers, architecture)
    return shrink_config(
        config, architecture, tiny_dimensions(model_class, config, architecture)
    ), model_class


def _layers(config, model_class):
    import torch

    with torch.device("meta"):
        return list(model_class(config).model.layers)


@pytest.mark.parametrize("source", ["exaone4", "cohere2"])
def test_sliding_and_full_attention_layers_are_both_built(tmp_path: Path, source: str) -> None:
    """Their default pattern is three sliding layers then a full one: two
    layers (the old default) were both sliding, and the full-attention layers
    (NoPE on Exaone 4) never ran."""
    built = build_tiny_checkpoint(source, tmp_path / source)
    config = json.loads((built.directory / "config.json").read_text())
    assert config["num_hidden_layers"] == 4
    assert set(config["layer_types"]) == {"sliding_attention", "full_attention"}


def test_nope_layers_are_built() -> None:
    """SmolLM3 skips RoPE on every fourth layer (no_rope_layers)."""
    config, _model_class = _tiny_config("smollm3")
    assert set(config.no_rope_layers) == {0, 1}


def test_dense_layers_before_the_experts_are_built() -> None:
    """DeepSeek-V3's first_k_dense_replace = 3: dense MLPs on layers 0-2,
    experts from layer 3."""
    config, model_class = _tiny_config("deepseek_v3")
    kinds = [type(layer.mlp).__name__ for layer in _layers(config, model_class)]
    assert len(kinds) == 4 and kinds[-1] != kinds[0]


def test_listed_dense_layers_of_a_config_json_are_built(tmp_path: Path) -> None:
    """A Qwen2-MoE config whose mlp_only_layers names layer 5 of 12 (and a
    sparse step of 1): layer 5 must exist and be dense."""
    from transformers import Qwen2MoeConfig

    path = tmp_path / "config.json"
    values = Qwen2MoeConfig(num_hidden_layers=12, mlp_only_layers=[5]).to_dict()
    values["architectures"] = ["Qwen2MoeForCausalLM"]
    path.write_text(json.dumps(values))
    config, model_class = _tiny_config(path)
    kinds = [type(layer.mlp).__name__ for layer in _layers(config, model_class)]
    assert len(kinds) == 6 and kinds[5] == "Qwen2MoeMLP" and kinds[0] != "Qwen2MoeMLP"


def test_per_layer_rope_parameters_follow_their_layer_types() -> None:
    """Gemma 3 rotates sliding and full layers with different bases (one
    full layer in six): both kinds are built."""
    config, _model_class = _tiny_config("gemma3_text")
    assert set(config.layer_types) == {"sliding_attention", "full_attention"}
    assert set(config.rope_parameters) >= set(config.layer_types)


def test_uniform_layers_keep_the_default_depth_and_a_set_depth_is_kept() -> None:
    import transformers

    config, model_class = _tiny_config("llama")
    assert config.num_hidden_layers == 2
    exaone, architecture = resolve_config("exaone4")
    sizes = tiny_dimensions(
        getattr(transformers, architecture), exaone, architecture, {"num_hidden_layers": 2}
    )
    assert sizes == {"num_hidden_layers": 2}


def test_interleaved_dense_and_moe_layers_are_built() -> None:
    """Llama 4's default config makes every layer MoE (interleave_moe_layer_step
    1, moe_layers derived from it) but can express dense layers: the tiny
    model alternates them (step 2, moe_layers derived again for its depth),
    keeps its NoPE layer, and its dense MLP width (intermediate_size_mlp,
    16384 by default) shrinks like intermediate_size."""
    config, model_class = _tiny_config("llama4_text")
    assert config.interleave_moe_layer_step == 2
    assert config.moe_layers == list(range(1, config.num_hidden_layers, 2))
    assert config.intermediate_size_mlp == config.intermediate_size == 128
    layers = _layers(config, model_class)
    kinds = {type(layer.feed_forward).__name__ for layer in layers}
    assert kinds == {"Llama4TextMoe", "Llama4TextMLP"}
    assert {layer.feed_forward.gate_proj.out_features for layer in layers if not layer.is_moe_layer} == {128}
    assert set(config.no_rope_layers) == {0, 1}


def test_a_given_interleave_step_and_an_explicit_moe_layer_list_are_kept(tmp_path: Path) -> None:
    """A step set with the dimensions is taken as given (moe_layers derived for
    it); a config.json listing its MoE layers (not the step's derivation)
    keeps that list."""
    from transformers import Llama4TextConfig

    config, architecture = resolve_config("llama4_text")
    import transformers

    model_class = getattr(transformers, architecture)
    given = {"interleave_moe_layer_step": 1}
    kept = shrink_config(config, architecture, tiny_dimensions(model_class, config, architecture, given))
    assert kept.interleave_moe_layer_step == 1
    assert kept.moe_layers == list(range(kept.num_hidden_layers))
    values = Llama4TextConfig(num_hidden_layers=8, moe_layers=[0, 2]).to_dict()
    values["architectures"] = ["Llama4ForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(values), encoding="utf-8")
    listed, _ = _tiny_config(tmp_path / "config.json")
    assert listed.moe_layers == [0, 2] and listed.interleave_moe_layer_step == 1


@pytest.mark.parametrize("source", ["qwen2_moe", "qwen3_moe"])
def test_sparse_step_dense_and_moe_layers_are_built(source: str) -> None:
    """Qwen2-MoE's and Qwen3-MoE's default configs make every layer MoE
    (decoder_sparse_step 1, no mlp_only_layers) but can express dense layers:
    the tiny model gets a step of 2, a dense layer 0 and an MoE layer 1."""
    config, model_class = _tiny_config(source)
    assert config.decoder_sparse_step == 2 and config.mlp_only_layers == []
    kinds = [type(layer.mlp).__name__ for layer in _layers(config, model_class)]
    assert len(kinds) == 2 and kinds[0].endswith("MLP") and kinds[1].endswith("SparseMoeBlock")


def test_a_given_sparse_step_is_kept() -> None:
    import transformers

    config, architecture = resolve_config("qwen3_moe")
    model_class = getattr(transformers, architecture)
    given = {"decoder_sparse_step": 1}
    kept = shrink_config(config, architecture, tiny_dimensions(model_class, config, architecture, given))
    assert kept.decoder_sparse_step == 1
    kinds = {type(layer.mlp).__name__ for layer in _layers(kept, model_class)}
    assert kinds == {"Qwen3MoeSparseMoeBlock"}
