"""Stand-in for ``vllm_neuron.functional.attention.attention_decode``: the
fused decode-attention kernel, and the packed FP8 K-cache layout helpers
models import from that module.

``attention_decode`` runs, in the kernel's order: optional RMSNorm of ``X``
(over its first ``X_hidden_dim_actual`` columns when padded), the QKV
projection, optional per-head QK norms before RoPE, the attention-DP
exchange (below), RoPE on the local batch, optional QK norms after RoPE, the
decode-context-parallel query gather (below), attention over the gathered
paged context with the step's K/V in its last ``S`` slots, the merges of the
two parallel modes, the in-place cache write, and the output projection.

Caches: ``[blocks, kv_heads, block_len, d]``, or ``[blocks, block_len, d]``
for one KV head; with ``fp8_packed`` the K cache is
``[blocks, (kv_heads,) block_len / 2, d, 2]`` (two consecutive positions
interleaved in the last dimension). FP8 caches are read raw: the models fold
the K dequantization into ``softmax_scale`` and the V one into ``W_out``;
``k_scale``/``v_scale`` quantize the step's K/V (``x * scale``, clamped to
the platform's FP8 range), which the attention then uses as stored.

Masks: ``attention_mask [S_ctx, B, q_heads, S]`` from
``gen_attention_decode_mask``, or, with ``pos_ids [B, S]`` (and optionally
``swa_start_pos_ids``), the same mask built from the positions; then
``attention_mask`` may only be the active-token part ``[S, B, q_heads, S]``.
``max_context_len`` bounds the prior context read (slots at or past it are
not read).

Attention data parallelism (``attention_dp = N``): ``X`` holds the batches
of the N ranks of ``attention_dp_group``; the Q heads are exchanged so that
each rank attends for its own batch (its cache) with the Q heads of all N,
then exchanged back, and the projection's partial output covers every batch.
With ``kv_needs_a2a`` the K/V heads are exchanged the same way.

Decode context parallelism (``dcp_size = W`` over ``dcp_group``): each rank
holds an interleaved share of the context; the queries of the group's heads
are gathered, each rank attends over its share, and the partial results are
merged by their log-sum-exp and scattered back by head.

Cache write (``update_cache``): ``kv_cache_update_idx`` uint32 ``[B, S]``;
a slot outside the cache (the -1 sentinel of a rank that does not own the
token) is skipped, as the kernel's out-of-bounds-skip scatter does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import collectives, kernel_phases
from .common_types import QuantizationType
from .decode_mask import _resize_block_len, gen_attention_decode_mask, mask_block_len
from .kernel_options import KernelOptions, refuse_bools
from .numerics import KernelConstraintError, check_bias, is_fp8, matmul, quantize_kv, rms_norm, rotate_half

DECODE_OPTIONS = KernelOptions(
    "attention_decode",
    refused={
        "quantization_type_qkv": QuantizationType.NONE,
        "weight_dequant_scale_qkv": None,
        "input_dequant_scale_qkv": None,
        "quantization_type_out": QuantizationType.NONE,
        "weight_dequant_scale_out": None,
        "input_dequant_scale_out": None,
        "K_cache_transposed": False,
        "transposed_out": False,
        "out_in_sb": False,
        "skip_attention": False,
        "is_h_transposed_by_4": False,
    },
    hints=frozenset({"sbm_lower_bound", "sbm_upper_bound", "sbm_use_auto_alloc", "sbm_default_stack_alloc"}),
)


# -- packed FP8 K cache -------------------------------------------------------------


def unswizzle_packed_k(packed: torch.Tensor) -> torch.Tensor:
    """``[..., block_len / 2, d, 2]`` -> ``[..., block_len, d]`` (entry ``[i, :, j]``
    is position ``2 i + j``)."""
    *lead, half, d_head, two = packed.shape
    if two != 2:
        raise KernelConstraintError(
            f"packed K cache: the last dimension must be 2, got {tuple(packed.shape)}"
        )
    return packed.transpose(-1, -2).reshape(*lead, half * 2, d_head).contiguous()


def swizzle_packed_k(unpacked: torch.Tensor) -> torch.Tensor:
    """``[..., block_len, d]`` -> ``[..., block_len / 2, d, 2]``."""
    *lead, block_len, d_head = unpacked.shape
    if block_len % 2 != 0:
        raise KernelConstraintError(f"packed K cache: block_len must be even, got {block_len}")
    return unpacked.reshape(*lead, block_len // 2, 2, d_head).transpose(-1, -2).contiguous()


_unswizzle_packed_k = unswizzle_packed_k
_swizzle_packed_k = swizzle_packed_k


def packed_fp8_viable_for_bucket(block_len: int, bs: int, q_head: int, s_active: int, s_prior: int) -> bool:
    """The packed FP8 decode kernel needs the resized block length to stay at
    least 2 (two positions per packed pair)."""
    if block_len <= 0 or s_prior <= 0:
        return False
    return _resize_block_len(block_len, bs, q_head, s_active, s_prior) >= 2


# -- the kernel ----------------------------------------------------------------


@dataclass
class _Geometry:
    batch: int  # rows of X (all attention-DP batches)
    seq: int
    local_batch: int  # sequences whose cache this rank holds
    q_heads: int  # projected Q heads
    kv_heads: int  # projected K/V heads
    cache_heads: int
    block_len: int
    d_head: int
    blocks_per_seq: int

    @property
    def context(self) -> int:
        return self.blocks_per_seq * self.block_len


def _geometry(X, W_qkv, K_cache, V_cache, table, attention_dp, kv_needs_a2a, fp8_packed) -> _Geometry:
    if X.dim() != 3:
        raise KernelConstraintError(f"NF.attention_decode: X must be [B, S, H], got {tuple(X.shape)}")
    if table is None or table.dtype != torch.int32:
        raise KernelConstraintError(
            "NF.attention_decode: active_blocks_table must be an int32 tensor "
            f"(got {None if table is None else table.dtype})"
        )
    if V_cache.dim() == 4:
        _, cache_heads, block_len, d_head = V_cache.shape
    elif V_cache.dim() == 3:
        (_, block_len, d_head), cache_heads = V_cache.shape, 1
    else:
        raise KernelConstraintError(
            "NF.attention_decode: caches must be [blocks, kv_heads, block_len, d] or [blocks, block_len, d], "
            f"got {tuple(V_cache.shape)}"
        )
    expected_k = list(V_cache.shape[:-2]) + (
        [block_len // 2, d_head, 2] if fp8_packed else [block_len, d_head]
    )
    if list(K_cache.shape) != expected_k:
        raise KernelConstraintError(
            f"NF.attention_decode: K cache {tuple(K_cache.shape)} does not match V cache {tuple(V_cache.shape)}"
            + (" in the packed FP8 layout" if fp8_packed else "")
        )
    kv_heads = cache_heads // attention_dp if kv_needs_a2a else cache_heads
    width = W_qkv.shape[1]
    q_heads = width // d_head - 2 * kv_heads
    if q_heads <= 0 or q_heads % kv_heads != 0 or (q_heads + 2 * kv_heads) * d_head != width:
        raise KernelConstraintError(
            f"NF.attention_decode: W_qkv width {width} does not split into q heads and {kv_heads} kv heads of {d_head}"
        )
    batch, seq, _ = X.shape
    if batch % attention_dp != 0 or table.shape[0] != batch // attention_dp:
        raise KernelConstraintError(
            f"NF.attention_decode: active_blocks_table has {table.shape[0]} rows for {batch} sequences over "
            f"{attention_dp} attention-DP rank(s)"
        )
    return _Geometry(
        batch, seq, batch // attention_dp, q_heads, kv_heads, cache_heads, block_len, d_head, table.shape[-1]
    )


def _heads(x: torch.Tensor, batch: int, seq: int, count: int, d_head: int) -> torch.Tensor:
    return x.reshape(batch, seq, count, d_head).transpose(1, 2)


def _project(X, W_qkv, bias_qkv, g: _Geometry, x_norm: tuple, qk_norm: tuple, qk_norm_weights: tuple):
    """Optional RMSNorm of X, the QKV projection and optional per-head QK
    norms: ``q [B, q_heads, S, d]``, ``k``, ``v [B, kv_heads, S, d]``."""
    enabled, eps, gamma, width = x_norm
    x = rms_norm(X, 1e-3 if eps is None else eps, gamma, width) if enabled else X
    qkv = matmul(x, W_qkv, bias_qkv)
    q_end, k_end = g.q_heads * g.d_head, (g.q_heads + g.kv_heads) * g.d_head
    q = _heads(qkv[..., :q_end], g.batch, g.seq, g.q_heads, g.d_head)
    k = _heads(qkv[..., q_end:k_end], g.batch, g.seq, g.kv_heads, g.d_head)
    v = _heads(qkv[..., k_end:], g.batch, g.seq, g.kv_heads, g.d_head)
    enabled, eps = qk_norm
    if enabled:
        w_q, w_k = qk_norm_weights
        q, k = rms_norm(q, eps, w_q), rms_norm(k, eps, w_k)
    return q, k, v


def _apply_rope(q, k, cos, sin, geometry: _Geometry, contiguous: bool):
    """RoPE with ``cos``/``sin`` ``[d/2, B, S]`` on ``[B, heads, S, d]``."""
    expected = (geometry.d_head // 2, q.shape[0], geometry.seq)
    if tuple(cos.shape) != expected or tuple(sin.shape) != expected:
        raise KernelConstraintError(
            f"NF.attention_decode: cos/sin must be {list(expected)}, got {list(cos.shape)} and {list(sin.shape)}"
        )
    cos = cos.permute(1, 2, 0).unsqueeze(1).to(q.dtype)
    sin = sin.permute(1, 2, 0).unsqueeze(1).to(q.dtype)
    if contiguous:
        cos, sin, rotate = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1), rotate_half
    else:
        cos = torch.stack((cos, cos), -1).flatten(-2)
        sin = torch.stack((sin, sin), -1).flatten(-2)
        rotate = _rotate_pairs
    return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE: pairs ``(2j, 2j + 1)`` rotate together."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _exchange_for_attention_dp(q, k, v, geometry, group, rank, kv_needs_a2a):
    """Each rank gets its own batch with the Q heads of every attention-DP rank."""
    q = collectives.all_to_all(q.contiguous(), split_dim=0, concat_dim=1, group=group)
    if kv_needs_a2a:
        k = collectives.all_to_all(k.contiguous(), split_dim=0, concat_dim=1, group=group)
        v = collectives.all_to_all(v.contiguous(), split_dim=0, concat_dim=1, group=group)
    else:
        rows = slice(rank * geometry.local_batch, (rank + 1) * geometry.local_batch)
        k, v = k[rows], v[rows]
    return q, k, v


def _gathered_context(K_cache, V_cache, table, geometry, fp8_packed, dtype):
    """Each local sequence's context ``[B, cache_heads, S_ctx, d]``."""
    if fp8_packed:
        K_cache = unswizzle_packed_k(K_cache)
    blocks = table.to(torch.int64).clamp(min=0).reshape(-1)
    contexts = []
    for cache in (K_cache, V_cache):
        view = cache if cache.dim() == 4 else cache.unsqueeze(1)
        gathered = view.to(dtype)[blocks].view(
            geometry.local_batch,
            geometry.blocks_per_seq,
            geometry.cache_heads,
            geometry.block_len,
            geometry.d_head,
        )
        contexts.append(
            gathered.permute(0, 2, 1, 3, 4).reshape(
                geometry.local_batch, geometry.cache_heads, geometry.context, geometry.d_head
            )
        )
    return contexts


def _visible(attention_mask, pos_ids, swa_start_pos_ids, max_context_len, geometry, q_heads):
    """The mask ``[B, q_heads, S, S_ctx]`` the attention applies."""
    shape = (geometry.context, geometry.local_batch, q_heads, geometry.seq)
    if swa_start_pos_ids is not None and pos_ids is None:
        raise KernelConstraintError("NF.attention_decode: swa_start_pos_ids requires pos_ids")
    if pos_ids is not None:
        active_shape = (geometry.seq, geometry.local_batch, q_heads, geometry.seq)
        if attention_mask is not None and tuple(attention_mask.shape) != active_shape:
            raise KernelConstraintError(
                f"NF.attention_decode: with pos_ids the attention_mask is the active part {list(active_shape)}, "
                f"got {list(attention_mask.shape)}"
            )
        flat = geometry.local_batch * geometry.seq
        start = None if swa_start_pos_ids is None else swa_start_pos_ids.reshape(1, flat).to(torch.float32)
        attention_mask = gen_attention_decode_mask(
            pos_ids.reshape(1, flat).to(torch.float32),
            geometry.local_batch,
            q_heads,
            geometry.seq,
            geometry.context,
            start_pos=start,
            block_len=geometry.block_len,
        )
    elif attention_mask is None:
        raise KernelConstraintError("NF.attention_decode: needs attention_mask or pos_ids")
    else:
        _check_mask_layout(attention_mask, geometry.block_len)
    if tuple(attention_mask.shape) != shape:
        raise KernelConstraintError(
            f"NF.attention_decode: attention_mask must be {list(shape)}, got {list(attention_mask.shape)}"
        )
    visible = attention_mask.permute(1, 2, 3, 0) != 0
    if max_context_len is not None:
        visible = visible & _bounded(max_context_len, geometry)
    return visible


def _check_mask_layout(attention_mask: torch.Tensor, block_len: int) -> None:
    """A mask from ``gen_attention_decode_mask`` must be laid out for this
    cache's blocks."""
    built_for = mask_block_len(attention_mask)
    if built_for is not None and built_for != block_len:
        raise KernelConstraintError(
            f"NF.attention_decode: the attention_mask was built by gen_attention_decode_mask with "
            f"block_len={built_for}, but the KV cache's blocks hold {block_len} slots (the device lays the "
            "mask out by block: pass the cache's block size)"
        )


def _bounded(max_context_len: torch.Tensor, geometry: _Geometry) -> torch.Tensor:
    """Slots the bounded gather reads: the prior ones before ``max_context_len``
    and the active ones."""
    if not isinstance(max_context_len, torch.Tensor) or max_context_len.dtype != torch.int32:
        raise KernelConstraintError("NF.attention_decode: max_context_len must be an int32 tensor [1]")
    slots = torch.arange(geometry.context)
    limit = int(max_context_len.reshape(-1)[0])
    return (slots < limit) | (slots >= geometry.context - geometry.seq)


def _attend(q, k_ctx, v_ctx, visible, sink, scale, dtype):
    """Softmax attention in float32; returns the output and its log-sum-exp."""
    groups = q.shape[1] // k_ctx.shape[1]
    k_ctx = k_ctx.repeat_interleave(groups, dim=1)
    v_ctx = v_ctx.repeat_interleave(groups, dim=1)
    scores = (q.to(torch.float32) @ k_ctx.to(torch.float32).transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        heads = q.shape[1]
        if tuple(sink.shape) != (heads, 1):
            raise KernelConstraintError(
                f"NF.attention_decode: sink must be [{heads}, 1], got {tuple(sink.shape)}"
            )
        column = sink.to(torch.float32).view(1, heads, 1, 1).expand(q.shape[0], heads, q.shape[2], 1)
        scores = torch.cat((scores, column), dim=-1)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sink is not None:
        probs = probs[..., :-1]
    out = (probs.to(dtype).to(torch.float32) @ v_ctx.to(torch.float32)).to(dtype)
    return out, lse


def _merge_context_parallel(out, lse, group, width):
    """LSE-weighted sum of the ranks' partial outputs, scattered back by head."""
    batch, heads, seq, _ = out.shape
    every = group.all_gather(lse.contiguous(), dim=0).view(width, batch, heads, seq)
    weight = torch.exp(lse - torch.logsumexp(every, dim=0))
    out = (out.to(torch.float32) * weight.unsqueeze(-1)).to(out.dtype)
    return group.reduce_scatter(out.contiguous(), dim=1)


def _write_cache(K_cache, V_cache, k, v, index, geometry, fp8_packed):
    """Write the step's K/V at ``index`` (uint32 ``[B, S]``); slots outside
    the cache are skipped."""
    expected = (geometry.local_batch, geometry.seq)
    if index is None or index.dtype != torch.uint32 or tuple(index.shape) != expected:
        raise KernelConstraintError(
            f"NF.attention_decode: kv_cache_update_idx must be uint32 {list(expected)}, got "
            f"{None if index is None else (index.dtype, list(index.shape))}"
        )
    slots = index.to(torch.int64).reshape(-1)
    capacity = V_cache.shape[0] * geometry.block_len
    keep = (slots >= 0) & (slots < capacity)
    blocks, offsets = slots[keep] // geometry.block_len, slots[keep] % geometry.block_len
    k_rows = k.transpose(1, 2).reshape(-1, k.shape[1], geometry.d_head)[keep]  # [tokens, kv, d]
    v_rows = v.transpose(1, 2).reshape(-1, v.shape[1], geometry.d_head)[keep]
    target_k = unswizzle_packed_k(K_cache) if fp8_packed else K_cache
    for cache, rows in ((target_k, k_rows), (V_cache, v_rows)):
        view = cache if cache.dim() == 4 else cache.unsqueeze(1)
        for head in range(rows.shape[1]):
            view[blocks, head, offsets] = rows[:, head].to(cache.dtype)
    if fp8_packed:
        K_cache.copy_(swizzle_packed_k(target_k))


def attention_decode(
    X: torch.Tensor,
    X_hidden_dim_actual: int | None = None,
    rmsnorm_X_enabled: bool = False,
    rmsnorm_X_eps: float | None = None,
    rmsnorm_X_gamma: torch.Tensor | None = None,
    W_qkv: torch.Tensor | None = None,
    bias_qkv: torch.Tensor | None = None,
    rmsnorm_QK_pre_rope_enabled: bool = False,
    rmsnorm_QK_pre_rope_eps: float = 1e-6,
    rmsnorm_QK_pre_rope_W_Q: torch.Tensor | None = None,
    rmsnorm_QK_pre_rope_W_K: torch.Tensor | None = None,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    rope_contiguous_layout: bool = True,
    rmsnorm_QK_post_rope_enabled: bool = False,
    rmsnorm_QK_post_rope_eps: float = 1e-6,
    rmsnorm_QK_post_rope_W_Q: torch.Tensor | None = None,
    rmsnorm_QK_post_rope_W_K: torch.Tensor | None = None,
    active_blocks_table: torch.Tensor | None = None,
    K_cache: torch.Tensor | None = None,
    V_cache: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    sink: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    pos_ids: torch.Tensor | None = None,
    swa_start_pos_ids: torch.Tensor | None = None,
    max_context_len: torch.Tensor | None = None,
    update_cache: bool = False,
    kv_cache_update_idx: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    fp8_packed: bool = False,
    W_out: torch.Tensor | None = None,
    bias_out: torch.Tensor | None = None,
    attention_dp: int = 1,
    attention_dp_group: Any = None,
    attention_dp_rank: int = 0,
    kv_needs_a2a: bool = False,
    dcp_size: int = 1,
    dcp_group: Any = None,
    **options: Any,
):
    """Fused decode attention (module docstring). Returns ``output``
    (``[B * S, H]`` with ``W_out``, else ``[B, q_heads, d, S]``) with
    ``update_cache``; otherwise ``(output, K_new [d, B * kv_heads, S],
    V_new [B, kv_heads, S, d])``."""
    kernel_phases.record("attention_decode")
    DECODE_OPTIONS.check(options)
    par = _Parallel(attention_dp, attention_dp_group, attention_dp_rank, kv_needs_a2a, dcp_size, dcp_group)
    par.check(X_hidden_dim_actual, k_scale, v_scale)
    g = _checked_geometry(
        X, W_qkv, bias_qkv, K_cache, V_cache, active_blocks_table, W_out, bias_out, par, fp8_packed
    )
    x_norm = (rmsnorm_X_enabled, rmsnorm_X_eps, rmsnorm_X_gamma, X_hidden_dim_actual)
    pre_rope = (rmsnorm_QK_pre_rope_enabled, rmsnorm_QK_pre_rope_eps)
    pre_rope_weights = (rmsnorm_QK_pre_rope_W_Q, rmsnorm_QK_pre_rope_W_K)
    post_rope = (rmsnorm_QK_post_rope_enabled, rmsnorm_QK_post_rope_eps)
    post_rope_weights = (rmsnorm_QK_post_rope_W_Q, rmsnorm_QK_post_rope_W_K)
    q, k, v = _project(X, W_qkv, bias_qkv, g, x_norm, pre_rope, pre_rope_weights)
    q, k, v = _rope_stage(q, k, v, g, par, (cos, sin, rope_contiguous_layout), post_rope, post_rope_weights)
    k, v = _quantized(k, v, k_scale, v_scale, K_cache, V_cache)
    k_ctx, v_ctx = _context(K_cache, V_cache, active_blocks_table, g, fp8_packed, k, v, X.dtype)
    visible = _visible(attention_mask, pos_ids, swa_start_pos_ids, max_context_len, g, q.shape[1])
    attn = _attend_in_parallel(q, k_ctx, v_ctx, visible, sink, softmax_scale, g, par, X.dtype)
    if update_cache:
        _write_cache(K_cache, V_cache, k, v, kv_cache_update_idx, g, fp8_packed)
        return _output(attn, W_out, bias_out)
    return _output(attn, W_out, bias_out), _k_new(k, g), v


@dataclass(frozen=True)
class _Parallel:
    """The kernel's attention data parallelism and decode context parallelism."""

    dp: int
    dp_group: Any
    dp_rank: int
    kv_needs_a2a: bool
    dcp: int
    dcp_group: Any

    def check(self, X_hidden_dim_actual, k_scale, v_scale) -> None:
        """Counts are numbers (not bools), groups match their sizes, and the
        K/V quantization scales go together."""
        refuse_bools(
            "attention_decode",
            attention_dp=self.dp,
            attention_dp_rank=self.dp_rank,
            dcp_size=self.dcp,
            X_hidden_dim_actual=X_hidden_dim_actual,
        )
        _check_parallel(self.dp, self.dp_group, self.kv_needs_a2a, self.dcp, self.dcp_group, k_scale, v_scale)


def _checked_geometry(
    X, W_qkv, bias_qkv, K_cache, V_cache, table, W_out, bias_out, par, fp8_packed
) -> _Geometry:
    """The required tensors, the FP8 packed layout, the geometry and the biases checked."""
    if W_qkv is None or K_cache is None or V_cache is None:
        raise KernelConstraintError("NF.attention_decode: W_qkv, K_cache and V_cache are required")
    if fp8_packed and not is_fp8(K_cache):
        raise KernelConstraintError(
            f"NF.attention_decode: fp8_packed needs an FP8 K cache, got {K_cache.dtype}"
        )
    geometry = _geometry(X, W_qkv, K_cache, V_cache, table, par.dp, par.kv_needs_a2a, fp8_packed)
    check_bias(bias_qkv, W_qkv.shape[1], "attention_decode", "bias_qkv")
    if W_out is not None:
        check_bias(bias_out, W_out.shape[1], "attention_decode", "bias_out")
    elif bias_out is not None:
        raise KernelConstraintError("NF.attention_decode: bias_out without W_out")
    return geometry


def _rope_stage(
    q, k, v, g: _Geometry, par: _Parallel, rope: tuple, post_rope: tuple, post_rope_weights: tuple
):
    """The attention-DP exchange, RoPE on the local batch, the QK norms after
    RoPE and the decode-context-parallel query gather."""
    if par.dp > 1:
        q, k, v = _exchange_for_attention_dp(q, k, v, g, par.dp_group, par.dp_rank, par.kv_needs_a2a)
    cos, sin, contiguous = rope
    if cos is not None and sin is not None:
        q, k = _apply_rope(q, k, cos, sin, g, contiguous)
    enabled, eps = post_rope
    if enabled:
        w_q, w_k = post_rope_weights
        q, k = rms_norm(q, eps, w_q), rms_norm(k, eps, w_k)
    if par.dcp > 1:
        q = par.dcp_group.all_gather(q.contiguous(), dim=1)
    return q, k, v


def _quantized(k, v, k_scale, v_scale, K_cache, V_cache):
    """The step's K/V quantized to the caches' FP8 formats when scales are given."""
    if k_scale is not None and v_scale is not None:  # both or neither (_check_parallel)
        return quantize_kv(k, k_scale, _fp8_dtype(K_cache)), quantize_kv(v, v_scale, _fp8_dtype(V_cache))
    return k, v


def _context(K_cache, V_cache, table, g: _Geometry, fp8_packed: bool, k, v, dtype):
    """The gathered paged context with the step's K/V in its last ``S`` slots."""
    k_ctx, v_ctx = _gathered_context(K_cache, V_cache, table, g, fp8_packed, dtype)
    k_ctx[:, :, g.context - g.seq :] = k.to(dtype)
    v_ctx[:, :, g.context - g.seq :] = v.to(dtype)
    return k_ctx, v_ctx


def _attend_in_parallel(q, k_ctx, v_ctx, visible, sink, softmax_scale, g: _Geometry, par: _Parallel, dtype):
    """The attention, merged over the context-parallel ranks and exchanged
    back over the attention-DP ranks."""
    scale = g.d_head**-0.5 if softmax_scale is None else softmax_scale
    attn, lse = _attend(q, k_ctx, v_ctx, visible, sink, scale, dtype)
    if par.dcp > 1:
        attn = _merge_context_parallel(attn, lse, par.dcp_group, par.dcp)
    if par.dp > 1:
        attn = collectives.all_to_all(attn.contiguous(), split_dim=1, concat_dim=0, group=par.dp_group)
    return attn


def _check_parallel(attention_dp, group, kv_needs_a2a, dcp_size, dcp_group, k_scale, v_scale) -> None:
    if attention_dp > 1 and collectives.group_size(group) != attention_dp:
        raise KernelConstraintError(
            f"NF.attention_decode: attention_dp={attention_dp} needs an attention_dp_group of that size"
        )
    if kv_needs_a2a and attention_dp == 1:
        raise KernelConstraintError("NF.attention_decode: kv_needs_a2a needs attention_dp > 1")
    if dcp_size > 1 and (dcp_group is None or dcp_group.world_size != dcp_size):
        raise KernelConstraintError(
            f"NF.attention_decode: dcp_size={dcp_size} needs a dcp_group of that size"
        )
    if (k_scale is None) != (v_scale is None):
        raise KernelConstraintError("NF.attention_decode: k_scale and v_scale go together")


def _fp8_dtype(cache: torch.Tensor) -> torch.dtype:
    """The FP8 format the step's K/V are quantized to (the cache's own)."""
    return cache.dtype if is_fp8(cache) else torch.float8_e4m3fn


def _k_new(k: torch.Tensor, g: _Geometry) -> torch.Tensor:
    """The step's K ``[B, kv_heads, S, d]`` as ``[d, B * kv_heads, S]``."""
    return k.reshape(k.shape[0] * k.shape[1], g.seq, g.d_head).permute(2, 0, 1).contiguous()


def _output(attn: torch.Tensor, W_out: torch.Tensor | None, bias_out: torch.Tensor | None) -> torch.Tensor:
    batch, heads, seq, d_head = attn.shape
    if W_out is None:
        return attn.transpose(2, 3).contiguous()  # [B, q_heads, d, S]
    flat = attn.transpose(1, 2).reshape(batch * seq, heads * d_head)
    return matmul(flat, W_out, bias_out)
