# SPDX-License-Identifier: Apache-2.0
"""DeepSeek-V3 for the vLLM Neuron backend.

Exports the factory's ``DeepseekV3ForCausalLM`` (what the registry imports) and the
config dataclass. The implementation class of the same name lives in
``model.py`` and is reached through the factory.
"""

from .config import DeepseekV3Config
from .factory import DeepseekV3ForCausalLM

__all__ = ["DeepseekV3Config", "DeepseekV3ForCausalLM"]
