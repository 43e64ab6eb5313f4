"""Tiny checkpoints: sources, small dimensions, determinism per seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoport_cst.errors import InputError
from autoport_cst.validate.tiny import build_tiny_checkpoint


def _differing_tensors(a: Path, b: Path) -> list[str]:
    """Names of the tensors whose values differ between two checkpoints."""
    import torch
    from safetensors.torch import load_file

    left, right = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert sorted(left) == sorted(right)
    return [name for name in left if not torch.equal(left[name], right[name])]


def test_same_seed_gives_byte_identical_tensors(tmp_path: Path) -> None:
    first = build_tiny_checkpoint("LlamaForCausalLM", tmp_path / "a", seed=7)
    second = build_tiny_checkpoint("LlamaForCausalLM", tmp_path / "b", seed=7)
    other = build_tiny_checkpoint("LlamaForCausalLM", tmp_path / "c", seed=8)
    assert _differing_tensors(first.directory, second.directory) == []
    data = (first.directory / "model.safetensors").read_bytes()
    assert data == (second.directory / "model.safetensors").read_bytes()
    assert data != (other.directory / "model.safetensors").read_bytes()
    assert (first.directory / "config.json").read_text() == (second.directory / "config.json").read_text()


def test_model_type_and_config_path_sources(tmp_path: Path) -> None:
    by_type = build_tiny_checkpoint("qwen2", tmp_path / "qwen2")
    assert by_type.architecture == "Qwen2ForCausalLM"
    config = json.loads((by_type.directory / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (64, 2, 4)
    assert (config["num_key_value_heads"], config["intermediate_size"]) == (2, 128)
    assert config.get("head_dim", config["hidden_size"] // config["num_attention_heads"]) == 16
    assert config["vocab_size"] == 511  # odd: no TP size divides it
    assert len(config["layer_types"]) == 2
    again = build_tiny_checkpoint(by_type.directory / "config.json", tmp_path / "again")
    assert again.architecture == "Qwen2ForCausalLM"
    assert _differing_tensors(by_type.directory, again.directory) == []
    assert (again.directory / "model.safetensors").read_bytes() == (
        by_type.directory / "model.safetensors"
    ).read_bytes()


@pytest.mark.parametrize("source", ["NoSuchForCausalLM", "no_such_type", "missing/config.json"])
def test_unknown_source_is_input_error(tmp_path: Path, source: str) -> None:
    with pytest.raises(InputError):
        build_tiny_checkpoint(source, tmp_path / "out")


def test_every_per_layer_list_follows_the_layer_count(tmp_path: Path) -> None:
    """GPT-Neo's attention_layers has one entry per layer: it keeps its first
    two (a global and a local layer), and the saved config loads back."""
    from transformers import AutoConfig

    built = build_tiny_checkpoint("GPTNeoForCausalLM", tmp_path / "neo")
    config = json.loads((built.directory / "config.json").read_text())
    assert config["num_layers"] == 2
    assert config["attention_layers"] == ["global", "local"]
    AutoConfig.from_pretrained(built.directory)


def test_a_shrunk_config_transformers_rejects_is_input_error(tmp_path: Path) -> None:
    """Mamba-2 ties its head count to hidden_size * expand, which the shrinker
    does not know: the error quotes transformers' validator and nothing is written."""
    with pytest.raises(InputError, match="does not validate in transformers.*hidden_size \\* expand"):
        build_tiny_checkpoint("Mamba2ForCausalLM", tmp_path / "mamba2")
    assert not (tmp_path / "mamba2").exists()


def test_a_config_without_kv_head_count_gets_one_per_query_head(tmp_path: Path) -> None:
    """Nemotron's default config leaves num_key_value_heads None (multi-head
    attention), which its modeling code cannot build."""
    built = build_tiny_checkpoint("NemotronForCausalLM", tmp_path / "nemotron")
    config = json.loads((built.directory / "config.json").read_text())
    assert config["num_key_value_heads"] == config["num_attention_heads"] == 4


def test_non_finite_config_values_round_trip(tmp_path: Path) -> None:
    """transformers' to_dict encodes Mamba's infinite time_step_limit as
    {"__float__": "Infinity"}, which its own validators then reject; the
    written config.json holds the float and loads back."""
    import math

    from transformers import AutoConfig, Mamba2Config

    from autoport_cst.validate.tiny import config_values

    values = config_values(Mamba2Config())
    assert values["time_step_limit"][1] == math.inf
    (tmp_path / "config.json").write_text(json.dumps(values))
    assert AutoConfig.from_pretrained(tmp_path).time_step_limit[1] == math.inf


def test_a_model_transformers_cannot_build_is_input_error(tmp_path: Path) -> None:
    """CohereCompass's default text config has no RoPE parameters for its
    layer types, so its own modeling code fails: a positioned InputError, not
    a KeyError, and nothing written."""
    with pytest.raises(InputError, match="cannot build the model.*KeyError"):
        build_tiny_checkpoint("CohereCompassForCausalLM", tmp_path / "compass")
    assert not (tmp_path / "compass").exists()


def test_a_read_only_head_dim_is_left_to_its_config():
    from transformers import FalconConfig

    from autoport_cst.validate.tiny import shrink_config

    config = shrink_config(FalconConfig(), "FalconForCausalLM", {})
    assert config.head_dim == config.hidden_size // config.num_attention_heads == 16


@pytest.mark.parametrize("architecture", ["GPTJForCausalLM", "CodeGenForCausalLM"])
def test_a_rotary_dim_in_channels_keeps_its_fraction_of_the_head(architecture):
    """GPT-J and CodeGen rotate ``rotary_dim`` channels of each head (64 of
    256 by default): the tiny head of 16 rotates 4, and a rotary_dim given
    with --set is taken as given."""
    import transformers

    from autoport_cst.validate.tiny import shrink_config

    config_class = {"GPTJForCausalLM": "GPTJConfig", "CodeGenForCausalLM": "CodeGenConfig"}[architecture]
    full = getattr(transformers, config_class)()
    assert full.rotary_dim * 4 == full.hidden_size // full.num_attention_heads
    config = shrink_config(full, architecture, {})
    assert config.hidden_size // config.num_attention_heads == 16 and config.rotary_dim == 4
    given = shrink_config(getattr(transformers, config_class)(), architecture, {"rotary_dim": 8})
    assert given.rotary_dim == 8
