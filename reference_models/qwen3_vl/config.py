# SPDX-License-Identifier: Apache-2.0
"""Configuration dataclasses of the Qwen3-VL reference model.

A Qwen3-VL checkpoint holds two configs: the text decoder's
(``text_config``: Qwen3 fields plus the M-RoPE sections in
``rope_parameters["mrope_section"]``) and the vision tower's
(``vision_config``). They are read separately, into ``Qwen3VLTextConfig``
and ``Qwen3VLVisionConfig``; ``Qwen3VLConfig`` holds both and the special
token ids of the top-level config.

``Qwen3VLConfig.from_configs`` accepts what the serving engine hands over (a
``PretrainedConfig``), a plain dict, or a path to a ``config.json`` (or to the
directory holding one). Only keys that are fields of the dataclasses are kept.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
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


def _as_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(config)


def _dtype(values: dict[str, Any], default: torch.dtype) -> torch.dtype:
    dtype = values.get("torch_dtype") or values.get("dtype")
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        return _DTYPES.get(dtype.replace("torch.", ""), default)
    return default


def _kept(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)} - {"neuron_config", "torch_dtype"}
    return {k: v for k, v in values.items() if k in names and v is not None}


@dataclass
class Qwen3VLTextConfig:
    """The text decoder (defaults: Qwen3-VL-8B)."""

    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 262144
    # <-- MODEL-SPECIFIC: RMSNorm epsilon under its Hugging Face name (also the QK norms')
    rms_norm_eps: float = 1e-6
    rope_theta: float = 5000000.0
    # <-- MODEL-SPECIFIC: M-RoPE: rotary frequency pairs given to the temporal, height and width
    # positions (they sum to head_dim / 2), interleaved T, H, W, T, H, W, ...
    mrope_section: list[int] = field(default_factory=lambda: [24, 20, 20])
    tie_word_embeddings: bool = False
    torch_dtype: torch.dtype = torch.bfloat16
    neuron_config: NeuronConfig | None = None

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if isinstance(self.torch_dtype, str):
            self.torch_dtype = _DTYPES[self.torch_dtype.replace("torch.", "")]
        if sum(self.mrope_section) != self.head_dim // 2:
            raise ValueError(
                f"mrope_section {self.mrope_section} must sum to head_dim / 2 = {self.head_dim // 2}"
            )

    @classmethod
    def from_values(
        cls, values: dict[str, Any], dtype: torch.dtype, neuron_config: NeuronConfig | None
    ) -> "Qwen3VLTextConfig":
        values = dict(values)
        rope = values.get("rope_parameters") or values.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type")) or "default"
        # <-- MODEL-SPECIFIC: M-RoPE takes the default frequencies only
        if rope_type != "default":
            raise NotImplementedError(f"Qwen3-VL text rope_type {rope_type!r} is not supported")
        if values.get("rope_theta") is None and "rope_theta" in rope:
            values["rope_theta"] = rope["rope_theta"]
        if rope.get("mrope_section") is not None:
            values["mrope_section"] = list(rope["mrope_section"])
        return cls(**_kept(cls, values), torch_dtype=dtype, neuron_config=neuron_config)


@dataclass
class Qwen3VLVisionConfig:
    """The vision tower (defaults: Qwen3-VL-8B)."""

    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 4096
    # learned position table, a square grid resampled to each image's patch grid
    num_position_embeddings: int = 2304
    # <-- MODEL-SPECIFIC: tower layers whose merged output is added to the first decoder layers
    deepstack_visual_indexes: list[int] = field(default_factory=lambda: [8, 16, 24])
    layer_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    torch_dtype: torch.dtype = torch.bfloat16
    neuron_config: NeuronConfig | None = None

    def __post_init__(self) -> None:
        if isinstance(self.torch_dtype, str):
            self.torch_dtype = _DTYPES[self.torch_dtype.replace("torch.", "")]
        self.head_dim = self.hidden_size // self.num_heads

    @classmethod
    def from_values(
        cls, values: dict[str, Any], dtype: torch.dtype, neuron_config: NeuronConfig | None
    ) -> "Qwen3VLVisionConfig":
        values = dict(values)
        rope = values.get("rope_parameters") or {}
        if values.get("rope_theta") is None and "rope_theta" in rope:
            values["rope_theta"] = rope["rope_theta"]
        values["deepstack_visual_indexes"] = list(values.get("deepstack_visual_indexes") or [])
        return cls(**_kept(cls, values), torch_dtype=dtype, neuron_config=neuron_config)


@dataclass
class Qwen3VLConfig:
    """Both configs and the special tokens of the top-level config."""

    text_config: Qwen3VLTextConfig
    vision_config: Qwen3VLVisionConfig
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    neuron_config: NeuronConfig | None = None

    @classmethod
    def from_configs(cls, hf_config: Any, neuron_config: NeuronConfig | None = None) -> "Qwen3VLConfig":
        """Build the configs from a ``PretrainedConfig``, a dict or a JSON path."""
        values = _as_dict(hf_config)
        dtype = _dtype(values, torch.bfloat16)
        text_values = _as_dict(values.get("text_config"))
        # the top-level config holds tie_word_embeddings
        if "tie_word_embeddings" in values:
            text_values["tie_word_embeddings"] = values["tie_word_embeddings"]
        text = Qwen3VLTextConfig.from_values(text_values, dtype, neuron_config)
        vision_values = _as_dict(values.get("vision_config"))
        vision = Qwen3VLVisionConfig.from_values(vision_values, dtype, neuron_config)
        tokens = {
            name: values[name]
            for name in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
            if values.get(name) is not None
        }
        return cls(text_config=text, vision_config=vision, neuron_config=neuron_config, **tokens)
