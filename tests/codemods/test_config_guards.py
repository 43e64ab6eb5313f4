"""config-guards: what the written guard does, and that every reference's
config takes it."""

from __future__ import annotations

import json
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


# -- a from_configs in the production packages' shape: the dict named otherwise, bound per branch --

PRODUCTION_SHAPED = """
import json
from dataclasses import dataclass


class PretrainedConfig:
    def __init__(self, **values):
        self.values = values

    def to_dict(self):
        return dict(self.values)


@dataclass
class MyConfig:
    hidden_size: int = 8
    neuron_config: object = None

    @classmethod
    def from_configs(cls, hf_config, neuron_config):
        if isinstance(hf_config, str):
            with open(hf_config) as handle:
                config_dict = json.load(handle)
        elif isinstance(hf_config, PretrainedConfig):
            if hf_config.values.get("quantization_config", 0) is None:
                config_dict = hf_config.to_dict()
                config_dict.pop("quantization_config")
            else:
                config_dict = hf_config.to_dict()
        else:
            config_dict = hf_config
        kept = {k: v for k, v in config_dict.items() if k in cls.__dataclass_fields__}
        kept["neuron_config"] = neuron_config
        return cls(**kept)
"""


def test_the_guard_reads_the_dict_every_branch_binds(tmp_path):
    codemod = ConfigGuards(ConfigGuards.parse_params(ASSUMED))
    output, _ = run_on_source(codemod, PRODUCTION_SHAPED, "config.py", "config")
    assert output.count("check_assumed_config(config_dict)") == 1
    namespace: dict = {}
    exec(output, namespace)  # noqa: S102 - the written guard is under test
    config_class, pretrained = namespace["MyConfig"], namespace["PretrainedConfig"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 4, "attention_bias": True}))
    # each branch: a path, a PretrainedConfig (with and without the quantization key), a dict
    for wrong in (
        str(path),
        pretrained(hidden_size=4, attention_bias=True),
        pretrained(hidden_size=4, attention_bias=True, quantization_config=None),
        {"hidden_size": 4, "attention_bias": True},
    ):
        with pytest.raises(ValueError, match="attention_bias is True"):
            config_class.from_configs(wrong, None)
    assert config_class.from_configs(pretrained(hidden_size=4, attention_bias=False), None).hidden_size == 4


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("config_dict = hf_config.to_dict()\nreturn cls()", ("config_dict", 1)),
        (
            "if hf_config is None:\n    raise ValueError('no config')\nelse:\n    d = dict(hf_config)\nreturn cls()",
            ("d", 1),
        ),
        (
            "try:\n    d = hf_config.to_dict()\nexcept AttributeError:\n    d = dict(hf_config)\nreturn cls()",
            ("d", 1),
        ),
        ("d = {}\nif hf_config:\n    d = hf_config.to_dict()\nreturn cls(**d)", ("d", 2)),
        ("d = hf_config.to_dict()\nkept = dict(d)\nd = None\nreturn cls(**kept)", ("d", 1)),
        ("for _ in range(1):\n    d = hf_config.to_dict()\nreturn cls(**d)", ("d", None)),
        ("values = load(hf_config)\nd = hf_config.to_dict()\nreturn cls()", ("values", 1)),
        ("d = other.to_dict()\nreturn cls()", None),
    ],
)
def test_the_config_dict_and_the_statement_binding_it_on_every_path(body, expected):
    import libcst as cst

    from autoport_cst.transform.anatomy.config_values import config_values

    source = "def from_configs(cls, hf_config):\n" + "".join(f"    {line}\n" for line in body.splitlines())
    method = cst.parse_module(source).body[0]
    found = config_values(method)
    if expected is None:
        assert found is None
        return
    name, index = expected
    assert found.name == name
    if index is None:
        assert found.statement is None and found.partial is method.body.body[0]
    else:
        assert found.statement is method.body.body[index - 1]


def test_a_field_related_to_another_is_refused_unless_equal():
    """A single value with same_as: the model needs the two fields equal
    (Falcon without multi-query), whatever value they share."""
    related = {"assumed": [{"field": "num_kv_heads", "value": 4, "same_as": "num_attention_heads"}]}
    source = "@dataclass\nclass MyConfig:\n    hidden_size: int = 8\n\n    @classmethod\n"
    source += (
        "    def from_configs(cls, hf_config):\n        values = dict(hf_config)\n        return cls()\n"
    )
    assert not ConfigGuards.check_params(ConfigGuards.parse_params(related))
    output, _ = run_on_source(ConfigGuards(ConfigGuards.parse_params(related)), source, "config.py", "config")
    namespace: dict = {}
    exec(output.split("@dataclass", 1)[0], namespace)
    check = namespace["check_assumed_config"]
    check({"num_kv_heads": 4, "num_attention_heads": 4})
    check({"num_kv_heads": 32, "num_attention_heads": 32})
    with pytest.raises(
        ValueError, match="num_kv_heads is 4, but this port needs num_kv_heads equal to num_att"
    ):
        check({"num_kv_heads": 4, "num_attention_heads": 8})
