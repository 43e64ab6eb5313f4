# SPDX-License-Identifier: Apache-2.0
"""Llama for the vLLM Neuron backend.

Exports the factory's ``LlamaForCausalLM`` (what the registry imports) and the
config dataclass. The implementation class of the same name lives in
``model.py`` and is reached through the factory.
"""

from .config import LlamaConfig
from .factory import LlamaForCausalLM

__all__ = ["LlamaConfig", "LlamaForCausalLM"]
