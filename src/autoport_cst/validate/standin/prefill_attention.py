"""Stand-in for the prefill attention kernels of ``vllm_neuron.functional``:
``flash_attention`` (one sequence, all of its K/V given), and the segmented
kernels of chunked prefill and prefix caching, which read the sequence's
earlier tokens from the paged KV cache: ``segmented_attention`` and its
decode-context-parallel form ``segmented_attention_cp``.

Segmented prefill (``segmented_attention``): the chunk's K/V are already in
the cache (written by ``qkv_proj(use_block_kv=True)`` or by the model); the
kernel gathers the sequence's blocks from ``block_tables`` (one row: prefill
runs one sequence) and lets query ``i`` of the chunk attend to cache
positions ``p <= prior_tokens + i`` (and ``p > prior_tokens + i - window``
with a sliding window), plus an optional sink column. The device kernel's
constraints are enforced with its wording: head size at most 128, a
supported ``kv_segment_size`` that is a multiple of the block size, a window
that is a multiple of the block size, a chunk exactly ``kv_segment_size``
tokens long (the runner pads it), block-aligned ``prior_tokens``, and no
plain (non-packed) FP8 K cache.

Numerics are those of ``flash_attention``: scores and softmax in float32,
probabilities rounded to the value dtype before the value matmul.
"""

from __future__ import annotations

from typing import Any

import torch

from . import kernel_phases
from .decode_attention import unswizzle_packed_k
from .kernel_options import KernelOptions, refuse_bools
from .numerics import KernelConstraintError, is_fp8

SUPPORTED_KV_SEGMENT_SIZES = (512, 1024, 2048, 4096, 8192)
MAX_HEAD_DIM = 128

FLASH_OPTIONS = KernelOptions(
    "flash_attention",
    refused={
        "cp_offset": None,
        "global_cp_deg": None,
        "cp_strided_q_slicing": False,
        "k_prior": None,
        "v_prior": None,
        "prior_used_len": None,
        "bound_min": None,
        "bound_max": None,
    },
)


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    visible: torch.Tensor,
    sink: torch.Tensor | None,
) -> torch.Tensor:
    """q ``[N, Sq, D]``, k/v ``[N, Sk, D]``, visible bool ``[.., Sq, Sk]`` ->
    ``[N, Sq, D]``; a query that sees nothing gets zeros."""
    scores = (q.to(torch.float32) @ k.to(torch.float32).transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        sink_column = sink.to(torch.float32).reshape(-1, 1, 1).expand(scores.shape[0], scores.shape[1], 1)
        scores = torch.cat((scores, sink_column), dim=-1)
    probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    if sink is not None:
        probs = probs[..., :-1]
    probs = probs.to(v.dtype)
    return (probs.to(torch.float32) @ v.to(torch.float32)).to(v.dtype)


def _expand_kv(q_heads: int, k: torch.Tensor, v: torch.Tensor, op: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Repeat K/V heads for grouped-query attention."""
    if q_heads == k.shape[0]:
        return k, v
    if q_heads % k.shape[0] != 0:
        raise KernelConstraintError(
            f"NF.{op}: {q_heads} query heads are not a multiple of {k.shape[0]} kv heads"
        )
    groups = q_heads // k.shape[0]
    return k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)


def _check_sink(sink: torch.Tensor | None, heads: int, op: str) -> None:
    if sink is not None and sink.numel() != heads:
        raise KernelConstraintError(
            f"NF.{op}: sink must have one value per head ({heads}), got {tuple(sink.shape)}"
        )


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    causal_mask: bool = True,
    sink: torch.Tensor | None = None,
    sliding_window: int | None = None,
    tp_q: bool = True,
    tp_k: bool = False,
    tp_out: bool = False,
    **options: Any,
) -> torch.Tensor:
    """Prefill attention over one sequence. ``q`` is ``[B, S, D]`` if ``tp_q``
    else ``[B, D, S]``; ``k`` is ``[B, S, D]`` if ``tp_k`` else ``[B, D, S]``;
    ``v`` is ``[B, S, D]``. B may be heads (GQA when ``B_q % B_kv == 0``).
    A window ``w > 0`` hides keys at ``q_pos - k_pos >= w``. Returns
    ``[B, D, S]`` if ``tp_out`` else ``[B, S, D]``."""
    kernel_phases.record("flash_attention")
    refuse_bools("flash_attention", sliding_window=sliding_window)
    FLASH_OPTIONS.check(options)
    q = q if tp_q else q.transpose(1, 2)
    k = k if tp_k else k.transpose(1, 2)
    k, v = _expand_kv(q.shape[0], k, v, "flash_attention")
    seq_q, seq_k, d_head = q.shape[1], k.shape[1], q.shape[2]
    scale = d_head**-0.5 if scale is None else scale
    q_pos = torch.arange(seq_q, device=q.device).unsqueeze(1) + (seq_k - seq_q)
    k_pos = torch.arange(seq_k, device=q.device).unsqueeze(0)
    visible = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device)
    if causal_mask:
        visible &= k_pos <= q_pos
    if sliding_window:
        visible &= q_pos < k_pos + sliding_window
    _check_sink(sink, q.shape[0], "flash_attention")
    output = softmax_attention(q, k, v, scale, visible, sink)
    return output.transpose(1, 2) if tp_out else output


# -- segmented prefill -----------------------------------------------------------


def prior_count(prior_tokens: torch.Tensor | int | None, op: str) -> int:
    """The number of cached tokens before the chunk (one value: one sequence)."""
    if prior_tokens is None:
        raise KernelConstraintError(f"NF.{op}: prior_tokens (the cached_seq_len of the sequence) is required")
    if not isinstance(prior_tokens, torch.Tensor):
        return int(prior_tokens)
    values = prior_tokens.reshape(-1).to(torch.int64)
    if values.numel() == 0 or bool((values != values[0]).any()):
        raise KernelConstraintError(f"NF.{op}: prior_tokens must hold one count, got {prior_tokens.tolist()}")
    return int(values[0])


def gather_sequence(cache: torch.Tensor, table: torch.Tensor, block_size: int) -> torch.Tensor:
    """The cache blocks of one sequence as ``[kv_heads, blocks * block_size, d]``
    (a 3-D cache ``[blocks, block_size, d]`` holds one KV head). Negative
    (unused) table entries read block 0; positions past the sequence are
    masked by the caller."""
    blocks = table.to(torch.int64).clamp(min=0)
    if cache.dim() == 3:
        cache = cache.unsqueeze(1)
    gathered = cache[blocks].to(torch.float32 if is_fp8(cache) else cache.dtype)
    kv_heads, d = gathered.shape[1], gathered.shape[3]
    return gathered.permute(1, 0, 2, 3).reshape(kv_heads, blocks.numel() * block_size, d)


def _segmented_constraints(
    q_len: int,
    d_head: int,
    block_size: int,
    kv_segment_size: int,
    sliding_window: int | None,
    prior: int,
    block_tables: torch.Tensor,
) -> None:
    op = "segmented_attention"
    if d_head > MAX_HEAD_DIM:
        raise KernelConstraintError(
            f"NF.{op}: head_dim={d_head} exceeds the kernel's maximum of {MAX_HEAD_DIM}"
        )
    if kv_segment_size not in SUPPORTED_KV_SEGMENT_SIZES:
        raise KernelConstraintError(
            f"NF.{op}: kv_segment_size={kv_segment_size} is not supported (one of {list(SUPPORTED_KV_SEGMENT_SIZES)})"
        )
    if kv_segment_size % block_size != 0:
        raise KernelConstraintError(
            f"NF.{op}: kv_segment_size ({kv_segment_size}) must be divisible by block_size ({block_size})"
        )
    if sliding_window and sliding_window % block_size != 0:
        raise KernelConstraintError(
            f"NF.{op}: sliding_window ({sliding_window}) must be divisible by block_size ({block_size})"
        )
    if q_len != kv_segment_size:
        raise KernelConstraintError(
            f"NF.{op}: query sequence length ({q_len}) must equal kv_segment_size ({kv_segment_size}): "
            "the runner pads each chunk to the segment size"
        )
    if prior % block_size != 0:
        raise KernelConstraintError(
            f"NF.{op}: prior_tokens ({prior}) must be a multiple of block_size ({block_size})"
        )
    if block_tables.dim() != 2 or block_tables.shape[0] != 1:
        raise KernelConstraintError(
            f"NF.{op}: block_tables must be [1, max_blocks] (prefill runs one sequence), "
            f"got {tuple(block_tables.shape)}"
        )


# What the segmented kernel asserts on the device (its K load needs a packed or pre-transposed FP8
# cache); validate.guard_checks tells this refusal by the kernel from a port's own failures.
NON_PACKED_FP8 = "the segmented kernel cannot read a non-packed FP8 K cache"


def _dequantized_caches(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    fp8_packed: bool,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    op: str,
) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """Caches in the standard layout, and the in-kernel dequant factors."""
    if fp8_packed:
        if not is_fp8(k_cache):
            raise KernelConstraintError(f"NF.{op}: fp8_packed needs an FP8 K cache, got {k_cache.dtype}")
        k_cache = unswizzle_packed_k(k_cache)
    elif is_fp8(k_cache):
        raise KernelConstraintError(
            f"NF.{op}: {NON_PACKED_FP8} (FP8 segmented prefill needs fp8_packed=True)"
        )
    k_factor = 1.0 if k_scale is None else float(k_scale.reshape(-1)[0])
    v_factor = 1.0 if v_scale is None else float(v_scale.reshape(-1)[0])
    return k_cache, v_cache, k_factor, v_factor


def segmented_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    prior_tokens: torch.Tensor | int,
    block_size: int,
    kv_segment_size: int,
    scale: float | None = None,
    tp_q: bool = True,
    tp_out: bool = False,
    sliding_window: int | None = None,
    sink: torch.Tensor | None = None,
    fp8_packed: bool = False,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """One chunk of a sequence attending to its cached tokens (see the module
    docstring). ``q`` is ``[B, S, D]`` if ``tp_q`` else ``[B, D, S]`` (B the
    query heads); returns ``[B, D, S]`` if ``tp_out`` else ``[B, S, D]``."""
    kernel_phases.record("segmented_attention")
    refuse_bools(
        "segmented_attention",
        block_size=block_size,
        kv_segment_size=kv_segment_size,
        sliding_window=sliding_window,
        prior_tokens=prior_tokens,
    )
    op = "segmented_attention"
    q = q if tp_q else q.transpose(1, 2)
    heads, q_len, d_head = q.shape
    prior = prior_count(prior_tokens, op)
    _segmented_constraints(q_len, d_head, block_size, kv_segment_size, sliding_window, prior, block_tables)
    k_cache, v_cache, k_factor, v_factor = _dequantized_caches(
        k_cache, v_cache, fp8_packed, k_scale, v_scale, op
    )
    k = gather_sequence(k_cache, block_tables[0], block_size)
    v = gather_sequence(v_cache, block_tables[0], block_size)
    if k_factor != 1.0 or v_factor != 1.0:
        k, v = k.to(torch.float32) * k_factor, v.to(torch.float32) * v_factor
    k, v = _expand_kv(heads, k.to(q.dtype), v.to(q.dtype), op)
    q_pos = torch.arange(q_len, device=q.device).unsqueeze(1) + prior
    k_pos = torch.arange(k.shape[1], device=q.device).unsqueeze(0)
    visible = (k_pos <= q_pos) & (k_pos < prior + q_len)
    if sliding_window:
        visible &= k_pos > q_pos - sliding_window
    _check_sink(sink, heads, op)
    scale = d_head**-0.5 if scale is None else scale
    output = softmax_attention(q, k, v, scale, visible, sink)
    return output.transpose(1, 2) if tp_out else output


def _global_positions(index: torch.Tensor, rank: int, width: int, interleave: int) -> torch.Tensor:
    """Position in the sequence of a context-parallel rank's ``index``-th token."""
    return (index // interleave) * width * interleave + rank * interleave + index % interleave


def segmented_attention_cp(
    q: torch.Tensor,
    k_local: torch.Tensor,
    v_local: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    prior_tokens: torch.Tensor | int,
    block_size: int,
    cp_rank: int,
    cp_world_size: int,
    cp_kv_cache_interleave_size: int,
    cp_group: Any,
    scale: float | None = None,
    tp_q: bool = True,
    tp_out: bool = False,
) -> torch.Tensor:
    """Segmented prefill with decode context parallelism (gather-Q).

    ``q`` holds every query of the chunk (gathered over the ``cp_group``);
    each rank holds the K/V of its own tokens: the cached ones in its cache
    (``prior_tokens`` of them, the local count) and the chunk's in
    ``k_local``/``v_local`` ``[kv_heads, S_local, D]``. With interleave size
    ``I`` over ``W`` ranks, local slot ``s`` of rank ``R`` is global position
    ``(s // I) * W * I + R * I + s % I`` (the chunk's local tokens likewise,
    after the ``W * prior_tokens`` cached ones). Each rank attends over its
    own K/V, the partial results are merged with their log-sum-exp over the
    group, and rank ``R`` keeps query chunk ``R`` (reduce-scatter over the
    query dimension). Returns ``[B, D, S_local]`` if ``tp_out``."""
    kernel_phases.record("segmented_attention_cp")
    refuse_bools(
        "segmented_attention_cp",
        block_size=block_size,
        cp_rank=cp_rank,
        cp_world_size=cp_world_size,
        cp_kv_cache_interleave_size=cp_kv_cache_interleave_size,
        prior_tokens=prior_tokens,
    )
    q = q if tp_q else q.transpose(1, 2)
    heads, total, d_head = q.shape
    if d_head > MAX_HEAD_DIM:
        raise KernelConstraintError(f"NF.segmented_attention_cp: head_dim={d_head} exceeds {MAX_HEAD_DIM}")
    prior_local = prior_count(prior_tokens, "segmented_attention_cp")
    width, rank, interleave = cp_world_size, cp_rank, cp_kv_cache_interleave_size
    cached_k = gather_sequence(k_cache, block_tables[0], block_size)
    cached_v = gather_sequence(v_cache, block_tables[0], block_size)
    k = torch.cat((cached_k.to(q.dtype), k_local.to(q.dtype)), dim=1)
    v = torch.cat((cached_v.to(q.dtype), v_local.to(q.dtype)), dim=1)
    k, v = _expand_kv(heads, k, v, "segmented_attention_cp")
    slots = torch.arange(cached_k.shape[1])
    local = torch.arange(k_local.shape[1])
    cached_pos = _global_positions(slots, rank, width, interleave)
    cached_pos = torch.where(slots < prior_local, cached_pos, torch.full_like(slots, 1 << 40))
    kv_pos = torch.cat((cached_pos, prior_local * width + _global_positions(local, rank, width, interleave)))
    q_pos = prior_local * width + torch.arange(total)
    visible = kv_pos.unsqueeze(0) <= q_pos.unsqueeze(1)
    scale = d_head**-0.5 if scale is None else scale
    scores = (q.to(torch.float32) @ k.to(torch.float32).transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, S_total]
    partial = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0) @ v.to(torch.float32)
    every_lse = cp_group.all_gather(lse.contiguous(), dim=0).view(width, heads, total)
    weight = torch.nan_to_num(torch.exp(lse - torch.logsumexp(every_lse, dim=0)), nan=0.0)
    output = cp_group.reduce_scatter((partial * weight.unsqueeze(-1)).contiguous(), dim=1).to(q.dtype)
    return output.transpose(1, 2) if tp_out else output
