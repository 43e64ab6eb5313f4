# SPDX-License-Identifier: Apache-2.0
"""Qwen3 for the vLLM Neuron backend.

Exports the factory's ``Qwen3ForCausalLM`` (what the registry imports) and the
config dataclass. The implementation class of the same name lives in
``model.py`` and is reached through the factory.
"""

from .config import Qwen3Config
from .factory import Qwen3ForCausalLM

__all__ = ["Qwen3Config", "Qwen3ForCausalLM"]
