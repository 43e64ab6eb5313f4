# SPDX-License-Identifier: Apache-2.0
"""Configuration dataclass of the DeepSeek-V3 reference model.

``DeepseekV3Config.from_configs`` accepts what the serving engine hands over
(a ``PretrainedConfig``), a plain dict, or a path to a ``config.json`` (or to
the directory holding one). Only keys that are fields of the dataclass are
kept.

Transformers 5 renamed several keys; both spellings are read:

- RoPE: ``rope_parameters`` (transformers 5, the base ``rope_theta`` inside
  it) or ``rope_theta`` and ``rope_scaling`` (older configs). The base inside
  the dictionary wins over a top-level one;
- dtype: ``dtype`` (transformers 5) or ``torch_dtype``;
- routed experts: ``n_routed_experts``, else ``num_local_experts`` or
  ``num_experts``.

Multi-latent attention: ``q_lora_rank`` None means queries projected
directly from the hidden state (no query LoRA); the KV latent is
``kv_lora_rank`` wide, the rotated shared key ``qk_rope_head_dim``, each
query and key head ``qk_nope_head_dim + qk_rope_head_dim``, each value head
``v_head_dim``. ``n_group`` None or 1 routes without group limits.
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

# fields whose None in the config means something (not "use the default")
_NONE_KEPT = ("n_group", "q_lora_rank", "topk_group")

# field -> config keys that hold it, in order of preference (sorted by field;
# codemods add the aliases of the fields they add in sorted place)
_ALIASES = {
    "n_routed_experts": ("n_routed_experts", "num_local_experts", "num_experts"),
}


@dataclass
class DeepseekV3Config:
    """Model fields of a DeepSeek-V3 checkpoint (defaults: DeepSeek-V3)."""

    vocab_size: int = 129280
    hidden_size: int = 7168
    intermediate_size: int = 18432
    num_hidden_layers: int = 61
    num_attention_heads: int = 128
    max_position_embeddings: int = 163840
    # <-- MODEL-SPECIFIC: RMSNorm epsilon under its Hugging Face name (the latent norms': model.LATENT_NORM_EPS)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # RoPE scaling parameters (``rope_type`` plus the variant's keys), or None
    rope_scaling: dict[str, Any] | None = None
    # pretraining context of YaRN when not in rope_scaling
    original_max_position_embeddings: int | None = None
    # <-- MODEL-SPECIFIC: rotary pairs interleaved (x0, x1), (x2, x3), ... (False: halves)
    rope_interleave: bool = True
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    # <-- MODEL-SPECIFIC: multi-latent attention
    q_lora_rank: int | None = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    # <-- MODEL-SPECIFIC: DeepSeek mixture of experts
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 2048
    n_group: int | None = 8
    topk_group: int | None = 4
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 2.5
    first_k_dense_replace: int = 3
    # "dense" or "sparse" per layer (GLM-4-MoE-Lite); when given, it decides instead of first_k_dense_replace
    mlp_layer_types: list[str] | None = None
    torch_dtype: torch.dtype = torch.bfloat16
    neuron_config: NeuronConfig | None = None

    def __post_init__(self) -> None:
        if isinstance(self.torch_dtype, str):
            self.torch_dtype = _DTYPES[self.torch_dtype.replace("torch.", "")]
        if not self.n_group or self.n_group < 1:
            self.n_group = 1
        if not self.topk_group or self.topk_group < 1:
            self.topk_group = self.n_group
        if self.n_routed_experts % self.n_group != 0:
            raise ValueError(
                f"n_group {self.n_group} does not divide n_routed_experts {self.n_routed_experts}"
            )
        if self.topk_group > self.n_group:
            raise ValueError(f"topk_group {self.topk_group} exceeds n_group {self.n_group}")
        # <-- MODEL-SPECIFIC: what this reference computes (refused by field otherwise)
        if self.attention_bias:
            raise ValueError("attention_bias True is not supported (this model has no projection biases)")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported (SiLU-gated MLPs)")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def from_configs(cls, hf_config: Any, neuron_config: NeuronConfig | None = None) -> "DeepseekV3Config":
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

        # RoPE: transformers 5 nests the base and the scaling in ``rope_parameters``;
        # older configs keep ``rope_theta`` at the top level and the scaling in
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

        # None is meaningful for q_lora_rank (no query LoRA) and the expert groups (no group
        # limit): kept when the key is present
        names = {f.name for f in fields(cls)} - {"neuron_config"}
        kept = {k: v for k, v in values.items() if k in names and (v is not None or k in _NONE_KEPT)}
        return cls(**kept, neuron_config=neuron_config)
