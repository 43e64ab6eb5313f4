"""config.json read the way transformers reads it: the non-finite floats it
writes as ``{"__float__": "Infinity"}`` (Bamba, Falcon-H1, GraniteMoE-hybrid,
Nemotron-H) are decoded, and the configuration is built by the config
class's ``from_dict``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autoport_cst.config_json import config_object, decode_floats, load_config_values

HYBRID_TYPES = ("bamba", "falcon_h1", "granitemoehybrid", "nemotron_h")


def test_tagged_floats_are_decoded() -> None:
    values = decode_floats(
        {"a": [0.0, {"__float__": "Infinity"}], "b": {"__float__": "-Infinity"}, "c": {"__float__": "NaN"}}
    )
    assert values["a"] == [0.0, math.inf] and values["b"] == -math.inf and math.isnan(values["c"])
    # anything else is left alone
    assert decode_floats({"__float__": "other"}) == {"__float__": "other"}
    assert decode_floats({"__float__": "Infinity", "x": 1}) == {"__float__": "Infinity", "x": 1}


def _saved_by_transformers(tmp_path: Path, model_type: str) -> Path:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    directory = tmp_path / model_type
    CONFIG_MAPPING[model_type]().save_pretrained(directory)
    assert '"__float__"' in (directory / "config.json").read_text()
    return directory


@pytest.mark.parametrize("model_type", HYBRID_TYPES)
def test_configs_transformers_writes_are_read(tmp_path: Path, model_type: str) -> None:
    from transformers import AutoConfig

    from autoport_cst.research.config_analysis import read_config, resolve_config
    from autoport_cst.validate.tiny import resolve_config as tiny_config

    directory = _saved_by_transformers(tmp_path, model_type)
    expected = AutoConfig.from_pretrained(directory).to_dict()
    expected.pop("_name_or_path")
    raw = read_config(directory / "config.json")
    assert _values(resolve_config(raw, str(directory / "config.json"))) == expected
    assert _values(config_object(load_config_values(directory / "config.json"))) == expected
    config, _architecture = tiny_config(directory / "config.json")
    assert _values(config) == expected
    # the configs a port is checked on beyond its own (validate.variants)
    from autoport_cst.validate.variants import _hf_config, read_values

    assert _values(_hf_config(read_values(directory))) == expected


def _values(config) -> dict:
    values = config.to_dict()
    values.pop("_name_or_path")
    return values


def test_plan_reads_a_checkpoint_transformers_wrote(tmp_path: Path) -> None:
    """Bamba's plan is refused for its Mamba layers, not for its config."""
    from click.testing import CliRunner
    from transformers import BambaConfig, BambaForCausalLM

    from autoport_cst.cli import cli

    config = BambaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=512,
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_d_state=16,
        attn_layer_indices=[1],
    )
    BambaForCausalLM(config).save_pretrained(tmp_path / "bamba")
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["plan", str(tmp_path / "bamba"), "--name", "bamba", "-o", str(out)])
    assert result.exit_code == 1, result.output  # written, not portable
    assert json.loads(out.read_text())["spec"]["unsupported"]
