# SPDX-License-Identifier: Apache-2.0
"""Configuration dataclass of the Starcoder2 reference model.

``Starcoder2Config.from_configs`` accepts what the serving engine hands over (a
``PretrainedConfig``), a plain dict, or a path to a ``config.json`` (or to the
directory holding one). Only keys that are fields of the dataclass are kept.

Field names follow transformers 5: the RoPE base and its scaling live in
``rope_parameters`` (older checkpoints spell them ``rope_theta`` and
``rope_scaling`` at the top level; both are folded into ``rope_parameters``),
the dtype in ``dtype`` (``torch_dtype`` before), and ``head_dim`` is read
from the checkpoint when it has one. ``quantization_config`` becomes
``quant_spec`` (see ``quantization.py``).

<-- MODEL-SPECIFIC: every field below is a Starcoder2 field; a port renames,
adds or drops them to match its architecture.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from vllm_neuron.model.neuron_config import NeuronConfig

from .quantization import QuantizationSpec

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


def _default_rope_parameters() -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": 500000.0}


@dataclass
class Starcoder2Config:
    """Model fields of a Starcoder2 checkpoint (defaults: Llama-3.1-8B)."""

    # <-- MODEL-SPECIFIC: architecture fields
    vocab_size: int = 128256
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    # None (absent from the checkpoint's config) means one KV head per query head
    num_key_value_heads: int | None = None
    # None: hidden_size // num_attention_heads
    head_dim: int | None = None
    max_position_embeddings: int = 131072
    # <-- MODEL-SPECIFIC: RMSNorm epsilon under its Hugging Face name
    norm_epsilon: float = 1e-5
    # ``rope_theta`` plus ``rope_type`` and the variant's own keys
    rope_parameters: dict[str, Any] = field(default_factory=_default_rope_parameters)
    tie_word_embeddings: bool = False
    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
    # attention window in tokens (None: full attention)
    sliding_window: int | None = None
    use_sliding_window: bool = True
    torch_dtype: torch.dtype = torch.bfloat16

    # Serving options (None when the model is built outside the engine)
    neuron_config: NeuronConfig | None = None
    # Parsed ``quantization_config``; None: the checkpoint is not quantized
    quant_spec: QuantizationSpec | None = None

    def __post_init__(self) -> None:
        if _keyed_by_layer_type(self.rope_parameters):
            # keyed by layer type (full_attention, sliding_attention): one set when all agree
            sets = list(self.rope_parameters.values())
            if any(s != sets[0] for s in sets):
                raise ValueError(
                    f"RoPE parameters differ per layer type ({sorted(self.rope_parameters)}): not supported"
                )
            self.rope_parameters = _rope_parameters({"rope_parameters": sets[0]})
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if isinstance(self.torch_dtype, str):
            self.torch_dtype = _DTYPES[self.torch_dtype.replace("torch.", "")]

    @classmethod
    def from_configs(cls, hf_config: Any, neuron_config: NeuronConfig | None = None) -> "Starcoder2Config":
        """Build the config from a ``PretrainedConfig``, a dict or a JSON path."""
        values = _config_values(hf_config)
        values["rope_parameters"] = _rope_parameters(values)
        dtype = values.get("dtype") or values.get("torch_dtype")
        if isinstance(dtype, str):
            values["torch_dtype"] = _DTYPES.get(dtype.replace("torch.", ""), torch.bfloat16)
        elif isinstance(dtype, torch.dtype):
            values["torch_dtype"] = dtype
        else:
            values.pop("torch_dtype", None)

        names = {f.name for f in fields(cls)} - {"neuron_config", "quant_spec"}
        kept = {k: v for k, v in values.items() if k in names and v is not None}
        # A quantized format this reference does not know raises here rather
        # than loading as bf16.
        quant_spec = QuantizationSpec.from_hf_quantization_config(values.get("quantization_config"))
        return cls(**kept, neuron_config=neuron_config, quant_spec=quant_spec)


def _config_values(hf_config: Any) -> dict[str, Any]:
    """The config as a dict, whichever form it comes in."""
    if isinstance(hf_config, (str, os.PathLike)):
        path = os.fspath(hf_config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    if hasattr(hf_config, "to_dict"):
        values = hf_config.to_dict()
        dtype = getattr(hf_config, "dtype", None)
        if isinstance(dtype, torch.dtype):
            values["dtype"] = dtype
        return values
    return dict(hf_config)


def _keyed_by_layer_type(rope: dict[str, Any]) -> bool:
    return bool(rope) and all(isinstance(value, dict) for value in rope.values())


def _rope_parameters(values: dict[str, Any]) -> dict[str, Any]:
    """One ``rope_parameters`` dict: transformers 5 writes it; older configs
    have a top-level ``rope_theta`` and an optional ``rope_scaling``."""
    rope = dict(values.get("rope_parameters") or {})
    if _keyed_by_layer_type(rope):
        return rope  # one set per attention layer type: __post_init__ checks they agree
    legacy = values.get("rope_scaling")
    if isinstance(legacy, dict):
        for key, value in legacy.items():
            rope.setdefault(key, value)
    if "rope_theta" not in rope and values.get("rope_theta") is not None:
        rope["rope_theta"] = values["rope_theta"]
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type")
    defaults = _default_rope_parameters()
    for key, value in defaults.items():
        rope.setdefault(key, value)
    return rope
