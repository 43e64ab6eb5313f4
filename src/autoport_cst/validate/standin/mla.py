"""Multi-latent attention (MLA) kernels of the stand-in: ``NF.mla_absorb`` and
``NF.mla_decode_attention`` (the vllm_neuron modules
``functional.attention.mla_absorb`` and ``functional.attention.mla_decode``).

An MLA layer caches one row per token: the compressed KV latent
(``kv_lora_rank`` wide, normed) followed by the rotated shared key
(``qk_rope_head_dim`` wide), in a paged cache ``[num_blocks, 1, block_size,
width]`` whose one "head" is that row. Decode attends over those rows in the
absorbed form: queries are lifted into the latent space per head
(``mla_absorb`` with the key half of ``kv_b_proj``), the row is both key and
value, and the attention output is brought back to the value width per head
(``mla_absorb`` with the value half). Prefill expands the latents into K and
V and runs the ordinary prefill attention.

``mla_decode_attention`` implements the latent leg of the vllm_neuron op:
a paged read through ``latent_block_table`` with the causal cap
``slot < (pos + 1) // compress_ratio`` (``compress_ratio=1``: every token up to
the current one). The sliding-window leg, sinks, top-k indices, split cache
pieces, scale caches and the in-op cache write are refused by name.
"""

from __future__ import annotations

from typing import Any

import torch

from . import kernel_phases
from .kernel_options import KernelOptions
from .numerics import KernelConstraintError
from .prefill_attention import softmax_attention

# the vllm_neuron defaults (the DeepSeek-V4 latent: 448 NoPE + 64 RoPE)
LATENT_NOPE_DIM = 448
LATENT_ROPE_DIM = 64

MLA_DECODE_OPTIONS = KernelOptions(
    "mla_decode_attention",
    refused={
        "window": 128,
        "topk_indices": None,
        "topk_index_offset": 0,
        "max_compressed_slots": None,
        "latent_v_cache": None,
        "latent_rope_cache": None,
        "latent_scale_cache": None,
        "latent_widths": None,
        "swa_v_cache": None,
        "swa_scale_cache": None,
        "swa_widths": None,
        "swa_block_table": None,
        "swa_pos_offset": None,
        "swa_ring": False,
        "current_latent_rows": None,
        "current_scale_rows": None,
        "current_compressed_rows": None,
        "current_slot_ids": None,
        "quant_group_size": 64,
    },
    hints=frozenset({"update_cache"}),
)


def mla_absorb(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``out[s, h, :] = x[s, h, :] @ w[h]``: ``x [S, H, K]``, ``w [H, K, N]``
    (contraction-major per head) -> ``[S, H, N]``, accumulated in float32 and
    returned in ``x``'s dtype."""
    kernel_phases.record("mla_absorb")
    if x.dim() != 3 or w.dim() != 3:
        raise KernelConstraintError(
            f"NF.mla_absorb: x must be [S, H, K] and w [H, K, N], got {tuple(x.shape)} and {tuple(w.shape)}"
        )
    if w.shape[0] != x.shape[1] or w.shape[1] != x.shape[2]:
        raise KernelConstraintError(
            f"NF.mla_absorb: w {tuple(w.shape)} is not [heads, contraction, out] for x {tuple(x.shape)} "
            "(a [heads, out, contraction] weight is the likely cause)"
        )
    out = torch.einsum("shk,hkn->shn", x.to(torch.float32), w.to(torch.float32))
    return out.to(x.dtype)


def _paged_rows(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """Each sequence's cache rows in table order: ``[B, blocks * block_size, width]``."""
    if cache.dim() != 4 or cache.shape[1] != 1:
        raise KernelConstraintError(
            "NF.mla_decode_attention: the latent cache must be [num_blocks, 1, block_size, width], "
            f"got {tuple(cache.shape)}"
        )
    if block_table.dtype != torch.int32:
        raise KernelConstraintError(
            f"NF.mla_decode_attention: the block table must be int32, got {block_table.dtype}"
        )
    table = block_table.to(torch.int64)
    if bool((table < 0).any()) or bool((table >= cache.shape[0]).any()):
        raise KernelConstraintError("NF.mla_decode_attention: a block table entry is outside the cache")
    return cache[table, 0].flatten(1, 2)


def _check_latent_shapes(q3, q, latent_cache, nope_dim: int, rope_dim: int) -> int:
    """The latent width ``nope_dim + rope_dim`` once the query and the cache fit it."""
    if q3.dim() != 3 or q3.shape[-1] != nope_dim + rope_dim:
        raise KernelConstraintError(
            f"NF.mla_decode_attention: q {tuple(q.shape)} is not [B, H, nope_dim + rope_dim] "
            f"({nope_dim} + {rope_dim})"
        )
    width = q3.shape[-1]
    if latent_cache.shape[-1] < width:
        raise KernelConstraintError(
            f"NF.mla_decode_attention: cache rows of {latent_cache.shape[-1]} columns hold no {width}-wide latent"
        )
    return width


def _positions(positions: torch.Tensor | None, context_lens: torch.Tensor | None) -> torch.Tensor:
    if positions is not None:
        return positions.reshape(-1).to(torch.int64)
    if context_lens is not None:
        return (context_lens.reshape(-1).to(torch.int64) - 1).clamp_min(0)
    raise KernelConstraintError("NF.mla_decode_attention: the stand-in needs positions or context_lens")


def mla_decode_attention(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    swa_cache: torch.Tensor | None,
    scale: float,
    sink: torch.Tensor | None,
    *,
    positions: torch.Tensor | None = None,
    context_lens: torch.Tensor | None = None,
    compress_ratio: int = 0,
    latent_block_table: torch.Tensor | None = None,
    nope_dim: int = LATENT_NOPE_DIM,
    rope_dim: int = LATENT_ROPE_DIM,
    softmax_dtype: torch.dtype = torch.float32,
    out_dtype: torch.dtype = torch.bfloat16,
    **options: Any,
) -> torch.Tensor:
    """One token per sequence attending over its latent rows.

    ``q`` ``[B, H, W]`` (or ``[B, 1, H, W]``), ``W = nope_dim + rope_dim``; each
    cached row's first ``W`` columns are both key and value; scores in float32.
    Returns ``[B, H, W]`` (``[B, 1, H, W]``) in ``out_dtype``."""
    kernel_phases.record("mla_decode_attention")
    MLA_DECODE_OPTIONS.check(options)
    if swa_cache is not None or sink is not None:
        raise KernelConstraintError(
            "NF.mla_decode_attention: the stand-in implements the latent leg only "
            "(swa_cache and sink must be None)"
        )
    if softmax_dtype is not torch.float32:
        raise KernelConstraintError(
            f"NF.mla_decode_attention: softmax_dtype must be float32, got {softmax_dtype}"
        )
    q_was_4d = q.dim() == 4
    q3 = q.reshape(q.shape[0], q.shape[-2], q.shape[-1]) if q_was_4d else q
    width = _check_latent_shapes(q3, q, latent_cache, nope_dim, rope_dim)
    if latent_block_table is None:
        raise KernelConstraintError("NF.mla_decode_attention: a paged latent cache needs latent_block_table")
    rows = _paged_rows(latent_cache, latent_block_table)[..., :width]  # [B, span, W]
    pos = _positions(positions, context_lens)
    slots = torch.arange(rows.shape[1], device=q.device)
    visible = torch.ones(q3.shape[0], rows.shape[1], dtype=torch.bool, device=q.device)
    if compress_ratio > 0:
        visible = slots.unsqueeze(0) < ((pos + 1) // compress_ratio).unsqueeze(1)
    out = torch.stack(
        [
            softmax_attention(
                q3[b].unsqueeze(1), rows[b].unsqueeze(0), rows[b].unsqueeze(0), scale, visible[b], None
            ).squeeze(1)
            for b in range(q3.shape[0])
        ]
    ).to(out_dtype)
    return out.unsqueeze(1) if q_was_4d else out


__all__ = ["LATENT_NOPE_DIM", "LATENT_ROPE_DIM", "mla_absorb", "mla_decode_attention"]
