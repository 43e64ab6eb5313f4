# SPDX-License-Identifier: Apache-2.0
"""GPT-OSS for the vLLM Neuron backend.

Exports the factory's ``GptOssForCausalLM`` (what the registry imports) and the
config dataclass. The implementation class of the same name lives in
``model.py`` and is reached through the factory.
"""

from .config import GptOssConfig
from .factory import GptOssForCausalLM

__all__ = ["GptOssConfig", "GptOssForCausalLM"]
