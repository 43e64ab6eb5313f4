"""Stand-in for ``vllm_neuron.functional`` (imported by models as ``NF``).

Each op computes what the Neuron kernel computes, in plain PyTorch, with the
kernels' numerics where they matter: matmuls take their inputs at the given
dtype and accumulate in float32; softmax and normalisation run in float32.

Constraints of the hardware kernels that decide whether a port runs on a
device are enforced with the kernel's wording, so a port that passes on CPU
does not then fail on Trainium:

- biases passed to ``qkv_proj``, ``o_proj``, ``attention_decode`` and ``mlp``
  are 2-D ``[1, N]`` ("Bias shape must be [1, I]");
- ``gen_attention_decode_mask`` needs ``s_prior % 128 == 0``;
- ``attention_decode`` takes an int32 ``active_blocks_table`` and, with
  ``update_cache``, a uint32 ``kv_cache_update_idx`` of shape ``[B, S]``.

Decode-mask layout: the stand-in uses the plain (sequential slot) layout
``[s_prior, bs, q_head, s_active]``; ``attention_decode`` reads it the same
way. Prior slots ``s < min(pos)`` of a sequence are visible, and the last
``s_active`` slots hold the active tokens (causal among themselves).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .common_types import ActFnType, NormType

P_MAX = 128

__all__ = [
    "ActFnType",
    "NormType",
    "attention_decode",
    "flash_attention",
    "gen_attention_decode_mask",
    "merge_prompt_embeds",
    "mlp",
    "o_proj",
    "qkv_proj",
]


class KernelConstraintError(ValueError):
    """An input a Neuron kernel rejects on hardware."""


# -- helpers -----------------------------------------------------------------


def _matmul(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w (+ bias)`` with float32 accumulation, result in ``x``'s dtype.

    A bias is added to the float32 accumulator, so the result is rounded once
    (as a fused projection with bias rounds, and as torch's ``F.linear``
    with a bias does); adding it after the rounding would round twice."""
    if x.dtype == torch.float32 and w.dtype == torch.float32:
        out = x @ w
        return out if bias is None else out + bias.to(torch.float32)
    out = x.to(torch.float32) @ w.to(torch.float32)
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(x.dtype)


def _check_bias(bias: torch.Tensor | None, width: int, op: str, name: str = "bias") -> None:
    if bias is None:
        return
    if bias.dim() != 2 or bias.shape[0] != 1:
        raise KernelConstraintError(
            f"NF.{op}: Bias shape must be [1, {width}], got {tuple(bias.shape)} for {name} "
            f"(pass bias.unsqueeze(0); a 1-D bias fails on hardware)"
        )
    if bias.shape[1] != width:
        raise KernelConstraintError(
            f"NF.{op}: {name} has width {bias.shape[1]}, expected {width}"
        )


def _rms_norm(x: torch.Tensor, eps: float, weight: torch.Tensor | None) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        x32 = x32 * weight.to(torch.float32).reshape(-1)
    return x32.to(dtype)


def _layer_norm(
    x: torch.Tensor, eps: float, weight: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.to(torch.float32)
    mean = x32.mean(-1, keepdim=True)
    x32 = (x32 - mean) * torch.rsqrt((x32 - mean).pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        x32 = x32 * weight.to(torch.float32).reshape(-1)
    if bias is not None:
        x32 = x32 + bias.to(torch.float32).reshape(-1)
    return x32.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _activation(x: torch.Tensor, act_fn: Any) -> torch.Tensor:
    name = getattr(act_fn, "value", act_fn)
    if name in ("silu", "swish", "SiLU", "Swish"):
        return F.silu(x)
    if name in ("gelu", "GELU"):
        return F.gelu(x)
    if name in ("gelu_tanh_approx", "GELU_Tanh_Approx"):
        return F.gelu(x, approximate="tanh")
    raise NotImplementedError(f"NF.mlp: activation {act_fn!r} is not in the CPU stand-in")


def _unsupported(op: str, **options: Any) -> None:
    given = [name for name, value in options.items() if value not in (None, False, 0, 1)]
    if given:
        raise NotImplementedError(
            f"NF.{op}: option(s) {', '.join(given)} are not implemented in the CPU stand-in"
        )


# -- projections ---------------------------------------------------------------


def qkv_proj(
    hidden: torch.Tensor,
    qkv_weights: torch.Tensor,
    d_head: int | None = None,
    bias: torch.Tensor | None = None,
    cos_cache: torch.Tensor | None = None,
    sin_cache: torch.Tensor | None = None,
    num_q_heads: int | None = None,
    num_kv_heads: int | None = None,
    qk_norm_pre_rope_q_norm: Any = None,
    qk_norm_pre_rope_k_norm: Any = None,
    qk_norm_pre_rope_eps: float = 1e-6,
    qk_norm_pre_rope_q_gamma: torch.Tensor | None = None,
    qk_norm_pre_rope_k_gamma: torch.Tensor | None = None,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    use_block_kv: bool = False,
    block_size: int | None = None,
    slot_mapping: torch.Tensor | None = None,
    **options: Any,
) -> torch.Tensor:
    """``hidden [B, S, H] @ qkv_weights [H, F] + bias [1, F]`` -> ``[B, S, F]``.

    With ``d_head``, ``cos_cache``/``sin_cache`` ``[B, S, d_head]`` and both
    head counts, the Q and K heads are rotated (rotate-half RoPE), after the
    optional per-head pre-RoPE RMSNorm.
    """
    if use_block_kv:
        raise NotImplementedError(
            "NF.qkv_proj(use_block_kv=True) (segmented prefill) is not in the CPU stand-in"
        )
    _unsupported("qkv_proj", **options)
    if hidden.dim() != 3:
        raise KernelConstraintError(f"NF.qkv_proj: hidden must be [B, S, H], got {tuple(hidden.shape)}")
    width = qkv_weights.shape[1]
    _check_bias(bias, width, "qkv_proj")
    qkv = _matmul(hidden, qkv_weights, bias)
    norm_q = qk_norm_pre_rope_q_norm not in (None, NormType.NO_NORM)
    rope = cos_cache is not None and sin_cache is not None
    if not (rope or norm_q):
        return qkv
    if d_head is None or num_q_heads is None or num_kv_heads is None:
        raise KernelConstraintError(
            "NF.qkv_proj: fused RoPE / QK-norm needs d_head, num_q_heads and num_kv_heads"
        )
    batch, seq, _ = qkv.shape
    q_width = num_q_heads * d_head
    kv_width = num_kv_heads * d_head
    if q_width + 2 * kv_width != width:
        raise KernelConstraintError(
            f"NF.qkv_proj: {num_q_heads} q heads + 2 x {num_kv_heads} kv heads of {d_head} "
            f"do not make the projection width {width}"
        )
    q = qkv[..., :q_width].reshape(batch, seq, num_q_heads, d_head)
    k = qkv[..., q_width : q_width + kv_width].reshape(batch, seq, num_kv_heads, d_head)
    v = qkv[..., q_width + kv_width :]
    if norm_q:
        q = _rms_norm(q, qk_norm_pre_rope_eps, qk_norm_pre_rope_q_gamma)
    if qk_norm_pre_rope_k_norm not in (None, NormType.NO_NORM):
        k = _rms_norm(k, qk_norm_pre_rope_eps, qk_norm_pre_rope_k_gamma)
    if rope:
        cos = cos_cache.reshape(batch, seq, 1, d_head).to(qkv.dtype)
        sin = sin_cache.reshape(batch, seq, 1, d_head).to(qkv.dtype)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
    return torch.cat((q.reshape(batch, seq, q_width), k.reshape(batch, seq, kv_width), v), dim=-1)


def o_proj(active: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Attention output ``[B, N, D, S]`` (or ``[B, S, N*D]``) times
    ``weight [N*D, H]`` plus ``bias [1, H]`` -> ``[B, S, H]``."""
    if active.dim() == 4:
        batch, heads, d_head, seq = active.shape
        active = active.permute(0, 3, 1, 2).reshape(batch, seq, heads * d_head)
    elif active.dim() != 3:
        raise KernelConstraintError(
            f"NF.o_proj: input must be [B, N, D, S] or [B, S, N*D], got {tuple(active.shape)}"
        )
    if active.shape[-1] != weight.shape[0]:
        raise KernelConstraintError(
            f"NF.o_proj: input width {active.shape[-1]} does not match weight {tuple(weight.shape)}"
        )
    _check_bias(bias, weight.shape[1], "o_proj")
    output = _matmul(active, weight, bias)
    return output


# -- attention ---------------------------------------------------------------


def _softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    visible: torch.Tensor,
    sink: torch.Tensor | None,
) -> torch.Tensor:
    """q [N, Sq, D], k/v [N, Sk, D], visible bool [.., Sq, Sk] -> [N, Sq, D]."""
    scores = (q.to(torch.float32) @ k.to(torch.float32).transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        sink_column = sink.to(torch.float32).reshape(-1, 1, 1).expand(scores.shape[0], scores.shape[1], 1)
        scores = torch.cat((scores, sink_column), dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sink is not None:
        probs = probs[..., :-1]
    probs = probs.to(v.dtype)
    return (probs.to(torch.float32) @ v.to(torch.float32)).to(v.dtype)


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
    Returns ``[B, D, S]`` if ``tp_out`` else ``[B, S, D]``."""
    _unsupported("flash_attention", **options)
    q = q if tp_q else q.transpose(1, 2)
    k = k if tp_k else k.transpose(1, 2)
    if q.shape[0] != k.shape[0]:
        if q.shape[0] % k.shape[0] != 0:
            raise KernelConstraintError(
                f"NF.flash_attention: {q.shape[0]} query heads are not a multiple of {k.shape[0]} kv heads"
            )
        groups = q.shape[0] // k.shape[0]
        k = k.repeat_interleave(groups, dim=0)
        v = v.repeat_interleave(groups, dim=0)
    seq_q, seq_k, d_head = q.shape[1], k.shape[1], q.shape[2]
    scale = d_head**-0.5 if scale is None else scale
    q_pos = torch.arange(seq_q, device=q.device).unsqueeze(1) + (seq_k - seq_q)
    k_pos = torch.arange(seq_k, device=q.device).unsqueeze(0)
    visible = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device)
    if causal_mask:
        visible &= k_pos <= q_pos
    if sliding_window is not None:
        visible &= q_pos < k_pos + sliding_window
    if sink is not None and sink.numel() != q.shape[0]:
        raise KernelConstraintError(
            f"NF.flash_attention: sink must have one value per head ({q.shape[0]}), got {tuple(sink.shape)}"
        )
    output = _softmax_attention(q, k, v, scale, visible, sink)
    return output.transpose(1, 2) if tp_out else output


def gen_attention_decode_mask(
    pos_ids: torch.Tensor,
    bs: int,
    q_head: int,
    s_active: int,
    s_prior: int,
    start_pos: torch.Tensor | None = None,
    block_len: int = 0,
    **options: Any,
) -> torch.Tensor:
    """{0, 1} mask ``[s_prior, bs, q_head, s_active]`` for decode attention.

    ``pos_ids [1, bs * s_active]`` are the active tokens' positions. Prior slot
    ``s`` of sequence ``b`` is visible when ``s < min(pos_ids[b])`` (and, with
    a sliding window, ``s >= start_pos`` of the query); the last ``s_active``
    slots are the active tokens, visible causally.
    """
    _unsupported("gen_attention_decode_mask", **options)
    if s_prior % P_MAX != 0:
        raise KernelConstraintError(f"s_prior ({s_prior}) must be divisible by {P_MAX}")
    positions = pos_ids.reshape(bs, s_active).to(torch.float32)
    min_pos = positions.min(dim=1).values  # [bs]
    if bool((min_pos > s_prior - s_active).any()):
        raise KernelConstraintError(
            f"gen_attention_decode_mask: position {int(min_pos.max())} does not fit a context of "
            f"{s_prior} slots with {s_active} active token(s): allocate more blocks per sequence"
        )
    slots = torch.arange(s_prior, dtype=torch.float32, device=pos_ids.device).view(s_prior, 1, 1)
    prior = slots < min_pos.view(1, bs, 1)  # [s_prior, bs, 1]
    if start_pos is not None:
        start = start_pos.reshape(bs, s_active).to(torch.float32)
        prior = prior & (slots >= start.view(1, bs, s_active))  # [s_prior, bs, s_active]
    else:
        prior = prior.expand(s_prior, bs, s_active)
    mask = prior.clone()
    causal = torch.ones(s_active, s_active, dtype=torch.bool, device=pos_ids.device).triu()
    mask[s_prior - s_active :] = causal.view(s_active, 1, s_active).expand(s_active, bs, s_active)
    return mask.to(torch.float32).unsqueeze(2).expand(s_prior, bs, q_head, s_active).contiguous()


def attention_decode(
    X: torch.Tensor,
    W_qkv: torch.Tensor,
    K_cache: torch.Tensor,
    V_cache: torch.Tensor,
    attention_mask: torch.Tensor,
    active_blocks_table: torch.Tensor,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    bias_qkv: torch.Tensor | None = None,
    X_hidden_dim_actual: int | None = None,
    rmsnorm_X_enabled: bool = False,
    rmsnorm_X_eps: float | None = None,
    rmsnorm_X_gamma: torch.Tensor | None = None,
    rmsnorm_QK_pre_rope_enabled: bool = False,
    rmsnorm_QK_pre_rope_eps: float = 1e-6,
    rmsnorm_QK_pre_rope_W_Q: torch.Tensor | None = None,
    rmsnorm_QK_pre_rope_W_K: torch.Tensor | None = None,
    rmsnorm_QK_post_rope_enabled: bool = False,
    rmsnorm_QK_post_rope_eps: float = 1e-6,
    rmsnorm_QK_post_rope_W_Q: torch.Tensor | None = None,
    rmsnorm_QK_post_rope_W_K: torch.Tensor | None = None,
    rope_contiguous_layout: bool = True,
    K_cache_transposed: bool = False,
    sink: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    pos_ids: torch.Tensor | None = None,
    swa_start_pos_ids: torch.Tensor | None = None,
    update_cache: bool = False,
    kv_cache_update_idx: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    W_out: torch.Tensor | None = None,
    bias_out: torch.Tensor | None = None,
    transposed_out: bool = False,
    out_in_sb: bool = False,
    attention_dp: int = 1,
    attention_dp_group: Any = None,
    attention_dp_rank: int = 0,
    kv_needs_a2a: bool = False,
    **options: Any,
):
    """Fused decode attention over a paged KV cache.

    ``X [B, S, H]``; ``W_qkv [H, (q + 2 kv) * d]``; caches
    ``[num_blocks, kv_heads, block_len, d]`` (KV heads come from the cache);
    ``active_blocks_table`` int32 ``[B, blocks_per_seq]``; ``cos``/``sin``
    ``[d/2, B, S]``; ``attention_mask`` from ``gen_attention_decode_mask``.
    Steps: optional RMSNorm of X, QKV projection (+ bias), optional pre-RoPE
    QK-norm, RoPE, optional post-RoPE QK-norm, attention over the gathered
    context with the active K/V in its last S slots, optional in-place cache
    write at ``kv_cache_update_idx``, output projection (+ bias).

    Returns ``output [B*S, H]`` with ``update_cache``; otherwise
    ``(output, K_new [d, B*kv_heads, S], V_new [B, kv_heads, S, d])``.
    """
    _unsupported(
        "attention_decode",
        attention_dp=attention_dp,
        kv_needs_a2a=kv_needs_a2a,
        K_cache_transposed=K_cache_transposed,
        transposed_out=transposed_out,
        out_in_sb=out_in_sb,
        **options,
    )
    if k_scale is not None or v_scale is not None:
        raise NotImplementedError("NF.attention_decode: FP8 KV-cache scales are not in the CPU stand-in")
    if pos_ids is not None or swa_start_pos_ids is not None:
        raise NotImplementedError("NF.attention_decode: in-kernel mask generation is not in the CPU stand-in")
    if not rope_contiguous_layout:
        raise NotImplementedError("NF.attention_decode: interleaved RoPE is not in the CPU stand-in")
    if X.dim() != 3:
        raise KernelConstraintError(f"NF.attention_decode: X must be [B, S, H], got {tuple(X.shape)}")
    if active_blocks_table is None or active_blocks_table.dtype != torch.int32:
        raise KernelConstraintError(
            "NF.attention_decode: active_blocks_table must be an int32 tensor "
            f"(got {None if active_blocks_table is None else active_blocks_table.dtype})"
        )
    if V_cache.dim() != 4:
        raise KernelConstraintError(
            f"NF.attention_decode: caches must be [blocks, kv_heads, block_len, d], got {tuple(V_cache.shape)}"
        )
    batch, seq, hidden = X.shape
    _, kv_heads, block_len, d_head = V_cache.shape
    width = W_qkv.shape[1]
    _check_bias(bias_qkv, width, "attention_decode", "bias_qkv")
    q_heads = width // d_head - 2 * kv_heads
    if q_heads <= 0 or q_heads % kv_heads != 0 or (q_heads + 2 * kv_heads) * d_head != width:
        raise KernelConstraintError(
            f"NF.attention_decode: W_qkv width {width} does not split into q heads and "
            f"{kv_heads} kv heads of {d_head}"
        )
    if W_out is not None:
        _check_bias(bias_out, W_out.shape[1], "attention_decode", "bias_out")
    elif bias_out is not None:
        raise KernelConstraintError("NF.attention_decode: bias_out without W_out")
    blocks_per_seq = active_blocks_table.shape[-1]
    context = blocks_per_seq * block_len
    expected_mask = (context, batch, q_heads, seq)
    if tuple(attention_mask.shape) != expected_mask:
        raise KernelConstraintError(
            f"NF.attention_decode: attention_mask must be {list(expected_mask)}, "
            f"got {list(attention_mask.shape)}"
        )

    x = X
    if rmsnorm_X_enabled:
        x = _rms_norm(x, 1e-3 if rmsnorm_X_eps is None else rmsnorm_X_eps, rmsnorm_X_gamma)
    qkv = _matmul(x, W_qkv, bias_qkv)
    q_width, kv_width = q_heads * d_head, kv_heads * d_head
    q = qkv[..., :q_width].reshape(batch, seq, q_heads, d_head).transpose(1, 2)
    k = qkv[..., q_width : q_width + kv_width].reshape(batch, seq, kv_heads, d_head).transpose(1, 2)
    v = qkv[..., q_width + kv_width :].reshape(batch, seq, kv_heads, d_head).transpose(1, 2)
    if rmsnorm_QK_pre_rope_enabled:
        q = _rms_norm(q, rmsnorm_QK_pre_rope_eps, rmsnorm_QK_pre_rope_W_Q)
        k = _rms_norm(k, rmsnorm_QK_pre_rope_eps, rmsnorm_QK_pre_rope_W_K)
    if cos is not None and sin is not None:
        if tuple(cos.shape) != (d_head // 2, batch, seq):
            raise KernelConstraintError(
                f"NF.attention_decode: cos/sin must be [{d_head // 2}, {batch}, {seq}], got {tuple(cos.shape)}"
            )
        cos_full = cos.permute(1, 2, 0).unsqueeze(1).to(q.dtype)
        sin_full = sin.permute(1, 2, 0).unsqueeze(1).to(q.dtype)
        cos_full = torch.cat((cos_full, cos_full), dim=-1)
        sin_full = torch.cat((sin_full, sin_full), dim=-1)
        q = q * cos_full + _rotate_half(q) * sin_full
        k = k * cos_full + _rotate_half(k) * sin_full
    if rmsnorm_QK_post_rope_enabled:
        q = _rms_norm(q, rmsnorm_QK_post_rope_eps, rmsnorm_QK_post_rope_W_Q)
        k = _rms_norm(k, rmsnorm_QK_post_rope_eps, rmsnorm_QK_post_rope_W_K)

    # Gather each sequence's context [B, kv_heads, context, d] from its blocks.
    table = active_blocks_table.to(torch.long).reshape(batch, blocks_per_seq)
    k_ctx = K_cache[table].permute(0, 2, 1, 3, 4).reshape(batch, kv_heads, context, d_head).to(X.dtype)
    v_ctx = V_cache[table].permute(0, 2, 1, 3, 4).reshape(batch, kv_heads, context, d_head).to(X.dtype)
    k_ctx[:, :, context - seq :] = k
    v_ctx[:, :, context - seq :] = v
    groups = q_heads // kv_heads
    k_ctx = k_ctx.repeat_interleave(groups, dim=1)
    v_ctx = v_ctx.repeat_interleave(groups, dim=1)

    visible = attention_mask.permute(1, 2, 3, 0) != 0  # [B, q_heads, S, context]
    scale = d_head**-0.5 if softmax_scale is None else softmax_scale
    scores = (q.to(torch.float32) @ k_ctx.to(torch.float32).transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        if sink.dim() != 2 or sink.shape != (q_heads, 1):
            raise KernelConstraintError(
                f"NF.attention_decode: sink must be [{q_heads}, 1], got {tuple(sink.shape)}"
            )
        sink_column = sink.to(torch.float32).view(1, q_heads, 1, 1).expand(batch, q_heads, seq, 1)
        scores = torch.cat((scores, sink_column), dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sink is not None:
        probs = probs[..., :-1]
    attn = (probs.to(X.dtype).to(torch.float32) @ v_ctx.to(torch.float32)).to(X.dtype)  # [B, q, S, d]

    if update_cache:
        if kv_cache_update_idx is None:
            raise KernelConstraintError("NF.attention_decode: update_cache needs kv_cache_update_idx")
        if kv_cache_update_idx.dtype != torch.uint32 or tuple(kv_cache_update_idx.shape) != (batch, seq):
            raise KernelConstraintError(
                f"NF.attention_decode: kv_cache_update_idx must be uint32 [{batch}, {seq}], got "
                f"{kv_cache_update_idx.dtype} {list(kv_cache_update_idx.shape)}"
            )
        slots = kv_cache_update_idx.to(torch.int64).reshape(-1)
        capacity = K_cache.shape[0] * block_len
        if bool(((slots < 0) | (slots >= capacity)).any()):
            raise KernelConstraintError(
                f"NF.attention_decode: kv_cache_update_idx has a slot outside the cache ({capacity} slots)"
            )
        blocks = (slots // block_len).repeat(kv_heads)
        offsets = (slots % block_len).repeat(kv_heads)
        heads = torch.arange(kv_heads, device=slots.device).repeat_interleave(slots.shape[0])
        K_cache.index_put_((blocks, heads, offsets), k.transpose(0, 1).reshape(-1, d_head).to(K_cache.dtype))
        V_cache.index_put_((blocks, heads, offsets), v.transpose(0, 1).reshape(-1, d_head).to(V_cache.dtype))

    if W_out is None:
        output = attn.transpose(2, 3)  # [B, q_heads, d, S]
    else:
        flat = attn.transpose(1, 2).reshape(batch * seq, q_heads * d_head)
        output = _matmul(flat, W_out, bias_out)
    if update_cache:
        return output
    k_new = k.permute(3, 0, 1, 2).reshape(d_head, batch * kv_heads, seq)
    return output, k_new, v


# -- MLP and embeddings ----------------------------------------------------------


def mlp(
    hidden: torch.Tensor,
    gate_w: torch.Tensor,
    up_w: torch.Tensor,
    down_w: torch.Tensor,
    eps: float = 1e-6,
    ln_w: torch.Tensor | None = None,
    skip_gate: bool = False,
    act_fn: Any = ActFnType.SiLU,
    gate_b: torch.Tensor | None = None,
    up_b: torch.Tensor | None = None,
    down_b: torch.Tensor | None = None,
    norm_b: torch.Tensor | None = None,
    norm_type: Any = NormType.NO_NORM,
    **options: Any,
) -> torch.Tensor:
    """``act(x @ gate + gb) * (x @ up + ub) @ down + db`` (``act(x @ up + ub)``
    with ``skip_gate``), after an optional RMS or layer norm of ``x``.
    Weights are ``[H, I]``, ``[H, I]``, ``[I, H]``; biases ``[1, N]``."""
    _unsupported("mlp", **options)
    intermediate = up_w.shape[1]
    _check_bias(gate_b, gate_w.shape[1], "mlp", "gate_b")
    _check_bias(up_b, intermediate, "mlp", "up_b")
    _check_bias(down_b, down_w.shape[1], "mlp", "down_b")
    x = hidden
    if norm_type == NormType.RMS_NORM:
        x = _rms_norm(x, eps, ln_w)
    elif norm_type == NormType.LAYER_NORM:
        x = _layer_norm(x, eps, ln_w, norm_b)
    up = _matmul(x, up_w, up_b)
    if skip_gate:
        inner = _activation(up.to(torch.float32), act_fn)
    else:
        gate = _matmul(x, gate_w, gate_b)
        inner = _activation(gate.to(torch.float32), act_fn) * up.to(torch.float32)
    output = _matmul(inner.to(hidden.dtype), down_w, down_b)
    return output


def merge_prompt_embeds(
    hidden: torch.Tensor,
    inputs_embeds: torch.Tensor | None,
    is_token_ids: torch.Tensor | None,
) -> torch.Tensor:
    """Token embeddings where ``is_token_ids``, ``inputs_embeds`` elsewhere."""
    if inputs_embeds is None or is_token_ids is None:
        return hidden
    return torch.where(is_token_ids.bool().unsqueeze(-1), hidden, inputs_embeds.to(hidden.dtype))


# -- not yet in the stand-in ---------------------------------------------------------


def _not_in_standin(name: str):
    def op(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"NF.{name} is not in the CPU stand-in yet")

    op.__name__ = name
    op.__doc__ = f"NF.{name}: not implemented in the CPU stand-in (raises NotImplementedError)."
    return op


segmented_attention = _not_in_standin("segmented_attention")
segmented_attention_cp = _not_in_standin("segmented_attention_cp")
sample = _not_in_standin("sample")


# -- mixture of experts (implemented in .moe) ------------------------------------------

from .moe import (  # noqa: E402  (moe imports KernelConstraintError from this module)
    RouterComputationOrder,
    build_blockwise_mapping,
    get_local_expert_affinities,
    moe_block_tkg,
    moe_cte,
    router,
)
