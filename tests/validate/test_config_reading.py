"""The driver names a config field a port reads under a name transformers only aliases."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

transformers = pytest.importorskip("transformers")

from autoport_cst.validate.config_reading import aliased_fields_missed  # noqa: E402


@dataclass
class _PortConfig:
    hidden_size: int = 64
    num_experts: int = 128


class _Port:
    def __init__(self, config: _PortConfig) -> None:
        self.config = config


def _hf_config():
    return transformers.Qwen3MoeConfig(num_experts=4, hidden_size=64)


def test_a_field_kept_at_its_default_is_named_with_the_written_name():
    (line,) = aliased_fields_missed(_Port(_PortConfig()), _hf_config())
    assert "`num_experts` is 128" in line and "has 4" in line and "`num_local_experts`" in line


def test_a_field_read_right_is_not_reported():
    assert aliased_fields_missed(_Port(_PortConfig(num_experts=4)), _hf_config()) == []


def test_a_port_without_a_dataclass_config_is_not_judged():
    assert aliased_fields_missed(object(), _hf_config()) == []


def test_the_driver_fails_the_build_naming_the_field():
    import torch

    from autoport_cst.validate.driver import PortFailure, PortSession

    class Factory:
        @staticmethod
        def from_configs(hf_config, neuron_config):
            return _Port(_PortConfig())

    with pytest.raises(PortFailure) as raised:
        PortSession._build(Factory, _hf_config())
    assert raised.value.stage == "build" and "num_local_experts" in raised.value.message
    assert torch.get_default_device().type == "cpu"
