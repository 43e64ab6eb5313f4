# SPDX-License-Identifier: Apache-2.0
"""Entry point the model registry exposes for the Qwen3-VL reference model.

The serving engine calls ``Qwen3VLForConditionalGeneration.from_configs(
hf_config, neuron_config)``, which returns the concrete implementation from
``model.py`` (not an instance of this thin wrapper).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from vllm_neuron.model.neuron_config import NeuronConfig

_SUPPORTED_QUANTIZATION = (None, "bf16")


class Qwen3VLForConditionalGeneration(nn.Module):
    """Registry entry: picks and builds the implementation for a config."""

    def __init__(self, hf_config: Any, neuron_config: NeuronConfig | None = None):
        super().__init__()
        self._model = _select_implementation(hf_config, neuron_config)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._model(*args, **kwargs)

    @classmethod
    def from_configs(cls, hf_config: Any, neuron_config: NeuronConfig | None = None) -> nn.Module:
        return _select_implementation(hf_config, neuron_config)

    @classmethod
    def get_vision_token_merge_factor(cls, hf_config: Any) -> int:
        """Patches per prompt token after the merger."""
        return hf_config.vision_config.spatial_merge_size**2


def _validate_config(hf_config: Any, neuron_config: NeuronConfig | None) -> None:
    quantization = getattr(neuron_config, "quantization", None) if neuron_config else None
    if quantization not in _SUPPORTED_QUANTIZATION:
        raise ValueError(
            f"Qwen3VLForConditionalGeneration supports quantization {_SUPPORTED_QUANTIZATION}, "
            f"got {quantization!r}"
        )


def _select_implementation(hf_config: Any, neuron_config: NeuronConfig | None) -> nn.Module:
    _validate_config(hf_config, neuron_config)
    from .model import Qwen3VLForConditionalGeneration as Model

    return Model.from_configs(hf_config, neuron_config)
