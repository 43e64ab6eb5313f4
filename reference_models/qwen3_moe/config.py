# SPDX-License-Identifier: Apache-2.0
"""Configuration dataclass of the Qwen3-MoE reference model.

``Qwen3MoeConfig.from_configs`` accepts what the serving engine hands over (a
``PretrainedConfig``), a plain dict, or a path to a ``config.json`` (or to the
directory holding one). Only keys that are fields of the dataclass are kept.

Transformers 5 renamed several keys; both spellings are read:

- RoPE: ``rope_parameters`` (transformers 5, the base ``rope_theta`` inside
  it) or ``rope_theta`` and ``rope_scaling`` (older configs). The base inside
  the dictionary wins over a top-level one;
- dtype: ``dtype`` (transformers 5) or ``torch_dtype``;
- mixture-of-experts quantities, the first key present winning:
  routed experts ``num_experts``, ``num_local_experts`` (what transformers 5
  writes for Qwen3-MoE), ``n_routed_experts``, ``moe_num_experts``; experts
  per token ``num_experts_per_tok``, ``moe_topk``, ``moe_k``; one expert's
  intermediate size ``moe_intermediate_size``, else ``intermediate_size``
  (models whose every layer is an MoE use the dense name for the experts).

``head_dim`` is the checkpoint's, or ``hidden_size / num_attention_heads``
when absent; ``norm_topk_prob`` is read from the config (True when absent:
the routers that never say, Mixtral's, renormalize).
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
    "moe_intermediate_size": ("moe_intermediate_size", "intermediate_size"),
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "moe_topk", "moe_k"),
}


@dataclass
class Qwen3MoeConfig:
    """Model fields of a Qwen3-MoE checkpoint (defaults: Qwen3-30B-A3B)."""

    vocab_size: int = 151936
    hidden_size: int = 2048
    num_hidden_layers: int = 48
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 40960
    # <-- MODEL-SPECIFIC: RMSNorm epsilon under its Hugging Face name (also the QK norms')
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    # RoPE scaling parameters (``rope_type`` plus the variant's keys), or None
    rope_scaling: dict[str, Any] | None = None
    # pretraining context of YaRN when not in rope_scaling
    original_max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False
    # <-- MODEL-SPECIFIC: mixture of experts
    num_experts: int = 128
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    # Renormalize the top-k routing weights to sum to 1. Configs without the
    # key get True: the routers that never say (Mixtral, GPT-OSS) renormalize.
    norm_topk_prob: bool = True
    torch_dtype: torch.dtype = torch.bfloat16
    neuron_config: NeuronConfig | None = None

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if isinstance(self.torch_dtype, str):
            self.torch_dtype = _DTYPES[self.torch_dtype.replace("torch.", "")]

    @classmethod
    def from_configs(cls, hf_config: Any, neuron_config: NeuronConfig | None = None) -> "Qwen3MoeConfig":
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
        return cls(**kept, neuron_config=neuron_config)
