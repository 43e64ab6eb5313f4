"""config-guards: what the written guard does, and that every reference's
config takes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoport_cst.transform.base import run_on_source
from autoport_cst.transform.library import get_codemod

ROOT = Path(__file__).resolve().parents[2]
ConfigGuards = get_codemod("config-guards")
ASSUMED = {
    "assumed": [
        {"field": "attention_bias", "value": False, "default": False, "fixes": "attention.qkv_bias"},
        {
            "field": "rope_parameters.rope_type",
            "value": "default",
            "default": "default",
            "fixes": "rope.type",
        },
        {
            "field": "layer_types",
            "value": ["full_attention"],
            "allowed": ["full_attention", "chunked_attention"],
            "fixes": "attention.sliding_window",
        },
    ]
}


def guard_function():
    source = "@dataclass\nclass MyConfig:\n    hidden_size: int = 8\n\n    @classmethod\n"
    source += (
        "    def from_configs(cls, hf_config):\n        values = dict(hf_config)\n        return cls()\n"
    )
    codemod = ConfigGuards(ConfigGuards.parse_params(ASSUMED))
    output, _ = run_on_source(codemod, source, "config.py", "config")
    namespace: dict = {}
    exec(output.split("@dataclass", 1)[0], namespace)
    return namespace["check_assumed_config"]


def test_the_planned_config_passes_and_absent_fields_take_the_default():
    check = guard_function()
    check(
        {
            "attention_bias": False,
            "rope_parameters": {"rope_type": "default"},
            "layer_types": ["full_attention"],
        }
    )
    check({})  # transformers' defaults
    check({"layer_types": ["chunked_attention", "full_attention"]})


def test_another_value_is_refused_naming_the_field_and_both_values():
    check = guard_function()
    with pytest.raises(ValueError) as info:
        check({"attention_bias": True})
    message = str(info.value)
    assert "attention_bias is True" in message and "attention_bias = False" in message
    assert "attention.qkv_bias" in message
    with pytest.raises(ValueError, match=r"rope_parameters.rope_type is 'yarn'.*= 'default'"):
        check({"rope_parameters": {"rope_type": "yarn"}})


def test_a_per_layer_type_the_port_does_not_handle_is_refused_by_name():
    check = guard_function()
    with pytest.raises(ValueError, match=r"layer_types holds 'sliding_attention'.*entries in"):
        check({"layer_types": ["full_attention", "sliding_attention"]})


@pytest.mark.parametrize(
    "config", sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("reference_models/*/config.py"))
)
def test_every_reference_config_takes_the_guard(config):
    source = (ROOT / config).read_text()
    codemod = ConfigGuards(ConfigGuards.parse_params(ASSUMED))
    output, _ = run_on_source(codemod, source, "config.py", "config")
    compile(output, config, "exec")
    assert output.count("check_assumed_config(values)") == 1
    again, _ = run_on_source(codemod, output, "config.py", "config")
    assert again == output


def test_parameters_must_be_json_scalars_and_dotted_names():
    from autoport_cst.errors import MultiInputError

    with pytest.raises(MultiInputError) as info:
        ConfigGuards.parse_params({"assumed": [{"field": "a b", "value": {"x": 1}}]})
    text = "\n".join(str(e) for e in info.value.errors)
    assert "not a dotted identifier" in text and "JSON scalars" in text
