# SPDX-License-Identifier: Apache-2.0
"""Configuration dataclass of the GPT-OSS reference model.

``GptOssConfig.from_configs`` accepts what the serving engine hands over (a
``PretrainedConfig``), a plain dict, or a path to a ``config.json`` (or to the
directory holding one). Only keys that are fields of the dataclass are kept.

Transformers 5 renamed several keys; both spellings are read:

- RoPE: ``rope_parameters`` (transformers 5, the base ``rope_theta`` inside
  it) or ``rope_theta`` and ``rope_scaling`` (older configs); the base inside
  the dictionary wins over a top-level one. A config naming no RoPE scaling
  at all gets YaRN as the GPT-OSS releases ship it;
- dtype: ``dtype`` (transformers 5) or ``torch_dtype``;
- the expert count and experts per token, the first key present winning
  (``_ALIASES``).

``layer_types`` marks each layer "sliding_attention" or "full_attention"
(every even layer slides when absent); an explicit null ``sliding_window``
means full attention everywhere.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from typing import Any

import torch

from vllm_neuron.model.neuron_config import NeuronConfig

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}

# field -> config keys that hold it, in order of preference (sorted by field;
# codemods add the aliases of the fields they add in sorted place)
_ALIASES = {
    "num_experts_per_tok": ("num_experts_per_tok", "moe_topk", "moe_k"),
    "num_local_experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
}

# YaRN as GPT-OSS ships it (used when a config names no RoPE scaling at all)
_DEFAULT_ROPE_SCALING = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


@dataclass
class GptOssConfig:
    """Model fields of a GPT-OSS checkpoint (defaults: gpt-oss-120b)."""

    vocab_size: int = 201088
    hidden_size: int = 2880
    num_hidden_layers: int = 36
    num_attention_heads: int = 64
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 131072
    # <-- MODEL-SPECIFIC: RMSNorm epsilon under its Hugging Face name
    rms_norm_eps: float = 1e-5
    rope_theta: float = 150000.0
    # RoPE scaling parameters (``rope_type`` plus the variant's keys), or None
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    # <-- MODEL-SPECIFIC: sliding-window attention on the layers marked
    # "sliding_attention" in layer_types (every even layer when absent)
    sliding_window: int | None = 128
    layer_types: list[str] | None = None
    # <-- MODEL-SPECIFIC: mixture of experts (every layer), experts with biases
    num_local_experts: int = 128
    num_experts_per_tok: int = 4
    intermediate_size: int = 2880
    # <-- MODEL-SPECIFIC: clamped SwiGLU of the experts
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    torch_dtype: torch.dtype = torch.bfloat16
    neuron_config: NeuronConfig | None = None

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if isinstance(self.torch_dtype, str):
            self.torch_dtype = _DTYPES[self.torch_dtype.replace("torch.", "")]
        if self.layer_types is None:
            self.layer_types = [
                "sliding_attention" if index % 2 == 0 else "full_attention"
                for index in range(self.num_hidden_layers)
            ]

    @classmethod
    def from_configs(cls, hf_config: Any, neuron_config: NeuronConfig | None = None) -> "GptOssConfig":
        """Build the config from a ``PretrainedConfig``, a dict or a JSON path."""
        if isinstance(hf_config, (str, os.PathLike)):
            path = os.fspath(hf_config)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            with open(path, encoding="utf-8") as handle:
                values = json.load(handle)
        elif hasattr(hf_config, "to_dict"):
            values = hf_config.to_dict()
        else:
            values = dict(hf_config)

        # RoPE: transformers 5 nests the base and the scaling in ``rope_parameters``
        # (keyed by layer type in some models: one set when all agree); older
        # configs keep ``rope_theta`` at the top level and the scaling in
        # ``rope_scaling``. The base inside the dictionary wins.
        rope = values.get("rope_parameters") or values.get("rope_scaling")
        if isinstance(rope, dict) and rope and all(isinstance(v, dict) for v in rope.values()):
            sets = list(rope.values())
            if any(s != sets[0] for s in sets):
                raise ValueError(f"RoPE parameters differ per layer type ({sorted(rope)}): not supported")
            rope = sets[0]
        if isinstance(rope, dict):
            if rope.get("rope_theta") is not None:
                values["rope_theta"] = rope["rope_theta"]
            values["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
        elif "rope_parameters" not in values and "rope_scaling" not in values:
            values["rope_scaling"] = dict(_DEFAULT_ROPE_SCALING)

        for name, keys in _ALIASES.items():
            found = next((values[key] for key in keys if values.get(key) is not None), None)
            if found is not None:
                values[name] = found

        dtype = values.get("dtype") or values.get("torch_dtype")
        if isinstance(dtype, str):
            values["torch_dtype"] = _DTYPES.get(dtype.replace("torch.", ""), torch.bfloat16)
        elif isinstance(dtype, torch.dtype):
            values["torch_dtype"] = dtype
        else:
            values.pop("torch_dtype", None)

        names = {f.name for f in fields(cls)} - {"neuron_config"}
        kept = {k: v for k, v in values.items() if k in names and v is not None}
        # an explicit null window means full attention on every layer
        if "sliding_window" in values and values["sliding_window"] is None:
            kept["sliding_window"] = None
        return cls(**kept, neuron_config=neuron_config)
