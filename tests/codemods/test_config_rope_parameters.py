"""config-rope-parameters, run: the config it writes reads transformers 5's
``rope_parameters``, flat or given per layer type (Olmo 3's tiny config: the
same base for its sliding and full layers), and refuses per-layer-type
parameters that differ, which the reference's one RoPE cannot compute. From
the real vllm_neuron qwen3 it refused Olmo 3's own checkpoint at build."""

from __future__ import annotations

import textwrap

import pytest

from autoport_cst.transform import PortContext
from autoport_cst.transform.base import run_on_source
from autoport_cst.transform.library import get_codemod

CONFIG = textwrap.dedent(
    """
    from dataclasses import dataclass


    @dataclass
    class Qwen3Config:
        hidden_size: int = 64
        rope_theta: float = 1_000_000.0

        def __post_init__(self):
            pass
    """
)


def _config_class(source: str = CONFIG):
    cls = get_codemod("config-rope-parameters")
    code = run_on_source(cls(cls.parse_params({})), source, "config.py", "config", PortContext())[0]
    namespace: dict = {}
    exec(compile(code, "config.py", "exec"), namespace)
    return namespace["Qwen3Config"]


def test_flat_and_uniform_per_layer_type_parameters_give_the_base():
    config = _config_class()
    assert config().rope_theta == 1_000_000.0
    assert config(rope_parameters={"rope_type": "default", "rope_theta": 500.0}).rope_theta == 500.0
    per_type = {
        name: {"rope_type": "default", "rope_theta": 500.0}
        for name in ("sliding_attention", "full_attention")
    }
    assert config(rope_parameters=per_type).rope_theta == 500.0


def test_per_layer_type_parameters_that_differ_are_refused_by_name():
    config = _config_class()
    per_type = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 500.0},
    }
    with pytest.raises(ValueError, match="rope_parameters differ between layer types") as error:
        config(rope_parameters=per_type)
    assert "10000.0" in str(error.value) and "500.0" in str(error.value)


def test_a_rope_type_the_config_does_not_read_is_refused():
    """The config knew the base alone: a YaRN checkpoint's parameters would be
    read as a default RoPE of that base. Refused by name, flat or per layer
    type; a config that carries its own rope_scaling reads it as before."""
    config = _config_class()
    yarn = {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0}
    with pytest.raises(ValueError, match="rope_type 'yarn' is not read by this config"):
        config(rope_parameters=yarn)
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        config(rope_parameters={"sliding_attention": yarn, "full_attention": yarn})
    field = "    rope_theta: float = 1_000_000.0\n"
    assert CONFIG.count(field) == 1
    scaled = _config_class(CONFIG.replace(field, field + "    rope_scaling: dict | None = None\n"))
    assert scaled(rope_parameters=yarn, rope_scaling=yarn).rope_theta == 500.0
    # one with a rope_scaling field says where it would have read the scaled RoPE
    with pytest.raises(ValueError, match="takes a scaled RoPE from rope_scaling alone"):
        scaled(rope_parameters=yarn)


def test_a_rope_type_of_one_layer_type_split_off_before_is_refused():
    """rope-layer-parameters splits per-layer-type parameters off into
    rope_layer_parameters before this codemod's lines run (Gemma 3 from the
    real qwen3): a linearly scaled global layer type is refused there too."""
    field = "    rope_theta: float = 1_000_000.0\n"
    config = _config_class(CONFIG.replace(field, field + "    rope_layer_parameters: dict | None = None\n"))
    default = {"rope_type": "default", "rope_theta": 10_000.0}
    linear = {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 8.0}
    split = {"sliding_attention": default, "full_attention": linear}
    with pytest.raises(ValueError, match="rope_type 'linear' is not read by this config"):
        config(rope_parameters=dict(default), rope_layer_parameters=split)
    same = {"sliding_attention": default, "full_attention": dict(default, rope_theta=1_000_000.0)}
    assert config(rope_parameters=dict(default), rope_layer_parameters=same).rope_theta == 10_000.0
