"""Stand-in for ``vllm_neuron.model.kv_cache``: what a model asks the runner
to allocate, one entry per attention layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class LayerSpec:
    """One attention layer's cache: ``num_kv_heads`` per rank of ``head_size``.

    The runner allocates ``(k_cache, v_cache)``, each
    ``[num_blocks, num_kv_heads, block_size, head_size]``, under ``name``.
    """

    name: str
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    sliding_window_size: int | None = None
    chunk_size: int | None = None
    kda_state_shape: Any = None
    latent_kv: bool = False
    latent_dim: int | None = None


@dataclass
class KVSpec:
    layers: list[LayerSpec] = field(default_factory=list)
