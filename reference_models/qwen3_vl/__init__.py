# SPDX-License-Identifier: Apache-2.0
"""Qwen3-VL for the vLLM Neuron backend.

Exports the factory's ``Qwen3VLForConditionalGeneration`` (what the registry
imports under the architecture string ``Qwen3VLForConditionalGeneration``)
and the config dataclasses. The implementation class of the same name lives
in ``model.py`` and is reached through the factory; the vision tower is in
``vision_encoder.py``.
"""

from .config import Qwen3VLConfig, Qwen3VLTextConfig, Qwen3VLVisionConfig
from .factory import Qwen3VLForConditionalGeneration

__all__ = [
    "Qwen3VLConfig",
    "Qwen3VLForConditionalGeneration",
    "Qwen3VLTextConfig",
    "Qwen3VLVisionConfig",
]
