# SPDX-License-Identifier: Apache-2.0
"""Entry point the model registry exposes for the GPT-OSS reference model.

The serving engine calls ``GptOssForCausalLM.from_configs(hf_config,
neuron_config)``, which returns the concrete implementation from ``model.py``
(not an instance of this thin wrapper).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from vllm_neuron.model.neuron_config import NeuronConfig

_SUPPORTED_QUANTIZATION = (None, "bf16")
# the MoE kernels' Swish is x * sigmoid(1.702 x): the gain is built in
_KERNEL_SWIGLU_ALPHA = 1.702


class GptOssForCausalLM(nn.Module):
    """Registry entry: picks and builds the implementation for a config."""

    def __init__(self, hf_config: Any, neuron_config: NeuronConfig | None = None):
        super().__init__()
        self._model = _select_implementation(hf_config, neuron_config)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._model(*args, **kwargs)

    @classmethod
    def from_configs(cls, hf_config: Any, neuron_config: NeuronConfig | None = None) -> nn.Module:
        return _select_implementation(hf_config, neuron_config)


def _config_value(hf_config: Any, name: str, default: Any) -> Any:
    if isinstance(hf_config, dict):
        return hf_config.get(name, default)
    return getattr(hf_config, name, default)


def _validate_config(hf_config: Any, neuron_config: NeuronConfig | None) -> None:
    quantization = getattr(neuron_config, "quantization", None) if neuron_config else None
    if quantization not in _SUPPORTED_QUANTIZATION:
        raise ValueError(
            f"GptOssForCausalLM supports quantization {_SUPPORTED_QUANTIZATION}, got {quantization!r} "
            "(MXFP4 experts need a bf16 checkpoint)"
        )
    alpha = _config_value(hf_config, "swiglu_alpha", _KERNEL_SWIGLU_ALPHA)
    if alpha is not None and abs(float(alpha) - _KERNEL_SWIGLU_ALPHA) > 1e-6:
        raise ValueError(
            f"GptOssForCausalLM: swiglu_alpha {alpha} is not supported; the MoE kernels compute "
            f"x * sigmoid({_KERNEL_SWIGLU_ALPHA} x)"
        )


def _select_implementation(hf_config: Any, neuron_config: NeuronConfig | None) -> nn.Module:
    _validate_config(hf_config, neuron_config)
    from .model import GptOssForCausalLM as Model

    return Model.from_configs(hf_config, neuron_config)
