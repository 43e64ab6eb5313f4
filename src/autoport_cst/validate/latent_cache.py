"""The KV cache a multi-latent-attention port asks for must hold latents.

A model with latent attention (its config has ``kv_lora_rank``) caches, per
token and layer, one row: the compressed KV latent (``kv_lora_rank`` values)
and the rotated shared key (``qk_rope_head_dim``). That row is the point of
the architecture: full keys and values of every head are tens of times
larger. A port that caches full K/V computes the same numbers, so the logit
comparison cannot see it; this check, on the port's ``get_kv_spec``, does:
the values a layer's cache holds per token (``num_kv_heads * head_size``,
twice for a key/value pair, once for a ``latent_kv`` layer) must not exceed
the latent row. The latent is replicated on every TP rank, so the bound is
per rank as it is per model.
"""

from __future__ import annotations

from typing import Any


def latent_row_width(hf_config: Any) -> int | None:
    """Values of one token's latent row, or None for a model without latent attention."""
    rank = getattr(hf_config, "kv_lora_rank", None)
    if not isinstance(rank, int) or rank <= 0:
        return None
    return rank + int(getattr(hf_config, "qk_rope_head_dim", 0) or 0)


def values_per_token(layer: Any) -> int:
    """What one cache layer of a ``KVSpec`` holds per token: one buffer for a
    latent layer, a key and a value otherwise."""
    buffers = 1 if getattr(layer, "latent_kv", False) else 2
    return buffers * int(layer.num_kv_heads) * int(layer.head_size)


def oversized_latent_layers(kv_spec: Any, hf_config: Any) -> str | None:
    """A message naming the layers whose cache holds more than the latent row
    per token, or None when every layer fits (or the model has no latents)."""
    width = latent_row_width(hf_config)
    if width is None:
        return None
    oversized = [
        (layer, values_per_token(layer)) for layer in kv_spec.layers if values_per_token(layer) > width
    ]
    if not oversized:
        return None
    layer, held = oversized[0]
    kind = "one latent buffer" if getattr(layer, "latent_kv", False) else "a key and a value"
    return (
        f"{len(oversized)} of {len(kv_spec.layers)} cache layers hold more than the latent row per token: "
        f"{layer.name} asks for {kind} of {layer.num_kv_heads} head(s) x {layer.head_size} = {held} values, "
        f"the latent row is kv_lora_rank {hf_config.kv_lora_rank} + qk_rope_head_dim "
        f"{getattr(hf_config, 'qk_rope_head_dim', 0)} = {width}. A latent-attention model caches the "
        "compressed latent and the rope key (LayerSpec(num_kv_heads=1, head_size=kv_lora_rank + "
        "qk_rope_head_dim, latent_kv=True)), not full K/V"
    )
