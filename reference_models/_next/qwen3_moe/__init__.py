# SPDX-License-Identifier: Apache-2.0
"""Qwen3-MoE for the vLLM Neuron backend.

Exports the factory's ``Qwen3MoeForCausalLM`` (what the registry imports) and the
config dataclass. The implementation class of the same name lives in
``model.py`` and is reached through the factory.
"""

from .config import Qwen3MoeConfig
from .factory import Qwen3MoeForCausalLM

__all__ = ["Qwen3MoeConfig", "Qwen3MoeForCausalLM"]
