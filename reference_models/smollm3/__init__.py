# SPDX-License-Identifier: Apache-2.0
"""SmolLM3 for the vLLM Neuron backend.

Exports the factory's ``SmolLM3ForCausalLM`` (what the registry imports) and the
config dataclass. The implementation class of the same name lives in
``model.py`` and is reached through the factory.
"""

from .config import SmolLM3Config
from .factory import SmolLM3ForCausalLM

__all__ = ["SmolLM3Config", "SmolLM3ForCausalLM"]
