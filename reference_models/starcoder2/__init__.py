# SPDX-License-Identifier: Apache-2.0
"""Starcoder2 for the vLLM Neuron backend.

Exports the factory's ``Starcoder2ForCausalLM`` (what the registry imports) and the
config dataclass. The implementation class of the same name lives in
``model.py`` and is reached through the factory.
"""

from .config import Starcoder2Config
from .factory import Starcoder2ForCausalLM

__all__ = ["Starcoder2Config", "Starcoder2ForCausalLM"]
