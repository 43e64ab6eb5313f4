"""Stand-in for the projection kernels of ``vllm_neuron.functional``:
``qkv_proj`` (with its fused norm, QK norms, RoPE and the in-kernel paged
KV-cache write of segmented prefill) and ``o_proj``.

``qkv_proj`` follows the kernel's stages in order: optional fused residual
add (``hidden + mlp_prev + attn_prev``), optional RMS / layer norm of the
input, ``hidden @ qkv_weights + bias``, optional per-head norms of the Q and
K heads before RoPE, split-half RoPE on the Q and K heads, optional per-head
norms after RoPE. RoPE is applied when ``cos_cache``, ``sin_cache`` and both
head counts are given (otherwise the kernel skips it): for each head with
halves ``x1, x2``, ``x1 cos[:d/2] - x2 sin[:d/2]`` and
``x2 cos[d/2:] + x1 sin[:d/2]``.

With ``use_block_kv=True`` the kernel also writes the post-RoPE K and V of
every token into the paged cache at ``slot_mapping`` and returns
``(q, k_cache, v_cache)``, ``q`` being ``[B, S, Nq * d]``. The slots are DMA
offsets on the device: one outside the cache faults, so the stand-in
refuses it (models clamp padding slots before the call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import kernel_phases
from .common_types import NormType, QKVOutputLayout, QKVWeightLayout, QuantizationType
from .kernel_options import KernelOptions, refuse_bools, refuse_unless_default
from .numerics import KernelConstraintError, check_bias, layer_norm, matmul, rms_norm

QKV_OPTIONS = KernelOptions(
    "qkv_proj",
    refused={
        "quantization_type": QuantizationType.NONE,
        "qkv_w_scale": None,
        "qkv_in_scale": None,
        "weight_layout": QKVWeightLayout.CONTIGUOUS,
        "store_output_in_sbuf": False,
        "transpose_k_cache": False,
        "fp8_packed": False,
        "qk_norm_pre_rope_gamma_fused_in_rope_caches": False,
        "qk_norm_post_rope_gamma_fused_in_rope_caches": False,
    },
    hints=frozenset(
        {
            "use_dma_transpose",
            "sbm_lower_bound",
            "sbm_upper_bound",
            "sbm_use_auto_alloc",
            "sbm_default_stack_alloc",
            "use_auto_allocation",
        }
    ),
)


def qkv_proj(
    hidden: torch.Tensor,
    qkv_weights: torch.Tensor,
    norm_weights: torch.Tensor | None = None,
    mlp_prev: torch.Tensor | None = None,
    attn_prev: torch.Tensor | None = None,
    d_head: int | None = None,
    output_layout: Any = QKVOutputLayout.BSD,
    eps: float = 1e-6,
    norm_type: Any = NormType.NO_NORM,
    bias: torch.Tensor | None = None,
    norm_b: torch.Tensor | None = None,
    hidden_actual: int | None = None,
    cos_cache: torch.Tensor | None = None,
    sin_cache: torch.Tensor | None = None,
    num_q_heads: int | None = None,
    num_kv_heads: int | None = None,
    qk_norm_pre_rope_q_norm: Any = None,
    qk_norm_pre_rope_k_norm: Any = None,
    qk_norm_pre_rope_eps: float = 1e-6,
    qk_norm_pre_rope_q_gamma: torch.Tensor | None = None,
    qk_norm_pre_rope_k_gamma: torch.Tensor | None = None,
    qk_norm_pre_rope_q_beta: torch.Tensor | None = None,
    qk_norm_pre_rope_k_beta: torch.Tensor | None = None,
    qk_norm_post_rope_q_norm: Any = None,
    qk_norm_post_rope_k_norm: Any = None,
    qk_norm_post_rope_eps: float = 1e-6,
    qk_norm_post_rope_q_gamma: torch.Tensor | None = None,
    qk_norm_post_rope_k_gamma: torch.Tensor | None = None,
    qk_norm_post_rope_q_beta: torch.Tensor | None = None,
    qk_norm_post_rope_k_beta: torch.Tensor | None = None,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    fp8_max: float | None = None,
    fp8_min: float | None = None,
    kv_dtype: torch.dtype | None = None,
    use_block_kv: bool = False,
    block_size: int | None = None,
    slot_mapping: torch.Tensor | None = None,
    **options: Any,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[B, S, H] -> [B, S, F]`` (see the module docstring), or
    ``(q, k_cache, v_cache)`` with ``use_block_kv``."""
    kernel_phases.record("qkv_proj")
    _check_arguments(
        hidden, options, output_layout, d_head, hidden_actual, num_q_heads, num_kv_heads, block_size
    )
    width = qkv_weights.shape[1]
    check_bias(bias, width, "qkv_proj")
    x = _fused_input(hidden, mlp_prev, attn_prev, norm_type, norm_weights, norm_b, eps, hidden_actual)
    qkv = matmul(x, qkv_weights, bias)
    heads = _HeadLayout.of(width, d_head, num_q_heads, num_kv_heads)
    pre = (qk_norm_pre_rope_q_norm, qk_norm_pre_rope_k_norm, qk_norm_pre_rope_eps)
    pre_gamma = (qk_norm_pre_rope_q_gamma, qk_norm_pre_rope_k_gamma)
    pre_beta = (qk_norm_pre_rope_q_beta, qk_norm_pre_rope_k_beta)
    post = (qk_norm_post_rope_q_norm, qk_norm_post_rope_k_norm, qk_norm_post_rope_eps)
    post_gamma = (qk_norm_post_rope_q_gamma, qk_norm_post_rope_k_gamma)
    post_beta = (qk_norm_post_rope_q_beta, qk_norm_post_rope_k_beta)
    qkv = _qk_norm(qkv, heads, *pre, *pre_gamma, *pre_beta, stage="pre_rope")
    if cos_cache is not None and sin_cache is not None and heads is not None:
        qkv = _fused_rope(qkv, heads, cos_cache, sin_cache)
    qkv = _qk_norm(qkv, heads, *post, *post_gamma, *post_beta, stage="post_rope")
    if k_cache is None and v_cache is None and not use_block_kv:
        return qkv
    cache = _CacheWrite(
        k_cache, v_cache, use_block_kv, block_size, slot_mapping, k_scale, v_scale, fp8_min, fp8_max, kv_dtype
    )
    return cache.write(qkv, heads)


def _check_arguments(
    hidden: torch.Tensor,
    options: dict[str, Any],
    output_layout: Any,
    d_head: int | None,
    hidden_actual: int | None,
    num_q_heads: int | None,
    num_kv_heads: int | None,
    block_size: int | None,
) -> None:
    """Counts are numbers (not bools), options the stand-in implements, the
    ``BSD`` output layout, and a ``[B, S, H]`` input."""
    refuse_bools(
        "qkv_proj",
        d_head=d_head,
        hidden_actual=hidden_actual,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        block_size=block_size,
    )
    QKV_OPTIONS.check(options)
    refuse_unless_default("qkv_proj", output_layout=(output_layout, QKVOutputLayout.BSD))
    if hidden.dim() != 3:
        raise KernelConstraintError(f"NF.qkv_proj: hidden must be [B, S, H], got {tuple(hidden.shape)}")


def _fused_input(
    hidden: torch.Tensor,
    mlp_prev: torch.Tensor | None,
    attn_prev: torch.Tensor | None,
    norm_type: Any,
    norm_weights: torch.Tensor | None,
    norm_b: torch.Tensor | None,
    eps: float,
    hidden_actual: int | None,
) -> torch.Tensor:
    """The fused residual add and input norm of the kernel."""
    if (mlp_prev is None) != (attn_prev is None):
        raise KernelConstraintError("NF.qkv_proj: mlp_prev and attn_prev go together (fused residual add)")
    x = hidden if mlp_prev is None or attn_prev is None else hidden + mlp_prev + attn_prev
    if norm_type in (None, NormType.NO_NORM):
        return x
    if norm_type == NormType.RMS_NORM:
        return rms_norm(x, eps, norm_weights, hidden_actual)
    if norm_type == NormType.LAYER_NORM:
        return layer_norm(x, eps, norm_weights, norm_b)
    raise NotImplementedError(f"NF.qkv_proj: norm_type={norm_type!r} is not implemented in the CPU stand-in")


@dataclass(frozen=True)
class _HeadLayout:
    """Where the Q, K and V heads sit in the fused projection."""

    d_head: int
    q: int
    kv: int

    @classmethod
    def of(cls, width: int, d_head: int | None, q: int | None, kv: int | None) -> _HeadLayout | None:
        """The layout; None when the kernel is not given the head counts."""
        if q is None or kv is None:
            return None
        d = d_head if d_head is not None else width // (q + 2 * kv)
        if (q + 2 * kv) * d != width:
            raise KernelConstraintError(
                f"NF.qkv_proj: {q} q heads + 2 x {kv} kv heads of {d} do not make the projection width {width}"
            )
        return cls(d, q, kv)

    @property
    def q_width(self) -> int:
        return self.q * self.d_head

    @property
    def kv_width(self) -> int:
        return self.kv * self.d_head

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q_end, k_end = self.q_width, self.q_width + self.kv_width
        return qkv[..., :q_end], qkv[..., q_end:k_end], qkv[..., k_end:]


def _qk_norm(
    qkv: torch.Tensor,
    heads: _HeadLayout | None,
    q_norm: Any,
    k_norm: Any,
    eps: float,
    q_gamma: torch.Tensor | None,
    k_gamma: torch.Tensor | None,
    q_beta: torch.Tensor | None,
    k_beta: torch.Tensor | None,
    stage: str,
) -> torch.Tensor:
    """Per-head RMSNorm of the Q heads and of the K heads (float32), then
    ``* gamma + beta``."""
    if q_norm is None and k_norm is None:
        return qkv
    for name, norm in (("q", q_norm), ("k", k_norm)):
        if norm is not None and norm != NormType.RMS_NORM:
            raise NotImplementedError(
                f"NF.qkv_proj: qk_norm_{stage}_{name}_norm={norm!r} is not implemented in the CPU stand-in "
                "(RMS_NORM only)"
            )
    if heads is None:
        raise KernelConstraintError(f"NF.qkv_proj: the {stage} QK norm needs num_q_heads and num_kv_heads")
    q, k, v = heads.split(qkv)
    if q_norm is not None:
        q = _head_rms_norm(q, heads.q, heads.d_head, eps, q_gamma, q_beta)
    if k_norm is not None:
        k = _head_rms_norm(k, heads.kv, heads.d_head, eps, k_gamma, k_beta)
    return torch.cat((q, k, v), dim=-1)


def _head_rms_norm(
    x: torch.Tensor,
    count: int,
    d_head: int,
    eps: float,
    gamma: torch.Tensor | None,
    beta: torch.Tensor | None,
) -> torch.Tensor:
    shape = x.shape
    heads = x.reshape(*shape[:-1], count, d_head).to(torch.float32)
    heads = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + eps)
    if gamma is not None:
        heads = heads * gamma.to(torch.float32).reshape(-1)
    if beta is not None:
        heads = heads + beta.to(torch.float32).reshape(-1)
    return heads.to(x.dtype).reshape(shape)


def _fused_rope(qkv: torch.Tensor, heads: _HeadLayout, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Split-half RoPE of the Q and K heads with ``[B, S, d]`` caches, in the
    projection's dtype."""
    batch, seq, _ = qkv.shape
    d = heads.d_head
    if tuple(cos.shape) != (batch, seq, d) or tuple(sin.shape) != (batch, seq, d):
        raise KernelConstraintError(
            f"NF.qkv_proj: cos_cache/sin_cache must be [B, S, d_head] = [{batch}, {seq}, {d}], "
            f"got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    half = d // 2
    rotated = heads.q + heads.kv
    x = qkv[..., : rotated * d].reshape(batch, seq, rotated, d)
    cos = cos.to(qkv.dtype).unsqueeze(2)
    sin = sin.to(qkv.dtype).unsqueeze(2)
    x1, x2 = x[..., :half], x[..., half:]
    first = x1 * cos[..., :half] - x2 * sin[..., :half]
    second = x2 * cos[..., half:] + x1 * sin[..., :half]
    x = torch.cat((first, second), dim=-1).reshape(batch, seq, rotated * d)
    return torch.cat((x, qkv[..., rotated * d :]), dim=-1)


class _CacheWrite:
    """The in-kernel paged KV-cache write of ``qkv_proj(use_block_kv=True)``."""

    def __init__(
        self,
        k_cache,
        v_cache,
        use_block_kv,
        block_size,
        slot_mapping,
        k_scale,
        v_scale,
        fp8_min,
        fp8_max,
        kv_dtype,
    ) -> None:
        if k_cache is None or v_cache is None:
            raise KernelConstraintError(
                "NF.qkv_proj: k_cache and v_cache go together (in-kernel KV cache write)"
            )
        if not use_block_kv:
            raise KernelConstraintError(
                "NF.qkv_proj: the in-kernel KV cache write needs use_block_kv=True (paged layout)"
            )
        if slot_mapping is None or block_size is None:
            raise KernelConstraintError("NF.qkv_proj: use_block_kv needs slot_mapping and block_size")
        if (k_scale is None) != (v_scale is None):
            raise KernelConstraintError("NF.qkv_proj: k_scale and v_scale go together")
        if k_scale is not None and (fp8_min is None or fp8_max is None):
            raise KernelConstraintError("NF.qkv_proj: FP8 cache write scales need fp8_min and fp8_max")
        self.k_cache, self.v_cache = k_cache, v_cache
        self.block_size, self.slots = block_size, slot_mapping
        self.scales = (k_scale, v_scale)
        self.limits = (fp8_min, fp8_max)
        self.dtype = kv_dtype if kv_dtype is not None else k_cache.dtype

    def write(
        self, qkv: torch.Tensor, heads: _HeadLayout | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if heads is None:
            raise KernelConstraintError(
                "NF.qkv_proj: use_block_kv needs d_head, num_q_heads and num_kv_heads"
            )
        batch, seq, _ = qkv.shape
        q, k, v = heads.split(qkv)
        slots = self._slots(batch * seq)
        for cache, values, scale in ((self.k_cache, k, self.scales[0]), (self.v_cache, v, self.scales[1])):
            rows = values.reshape(batch * seq, heads.kv, heads.d_head)
            self._scatter(cache, self._stored(rows, scale), slots, heads)
        return q, self.k_cache, self.v_cache

    def _slots(self, tokens: int) -> torch.Tensor:
        slots = self.slots.reshape(-1).to(torch.int64)
        if slots.numel() != tokens:
            raise KernelConstraintError(
                f"NF.qkv_proj: slot_mapping has {slots.numel()} slots for {tokens} tokens"
            )
        capacity = self.k_cache.shape[0] * self.block_size
        outside = (slots < 0) | (slots >= capacity)
        if bool(outside.any()):
            bad = int(slots[outside][0])
            raise KernelConstraintError(
                f"NF.qkv_proj: slot_mapping holds slot {bad}, outside the cache of {capacity} slots: the "
                "in-kernel cache write uses slots as DMA offsets (an out-of-bounds fault on hardware); "
                "clamp padding slots before the call"
            )
        return slots

    def _stored(self, rows: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        """Cache values: post-RoPE K/V, or with FP8 scales ``x / scale``
        clamped to ``[fp8_min, fp8_max]``, in the cache dtype."""
        if scale is None:
            return rows.to(self.dtype)
        low, high = self.limits
        scaled = rows.to(torch.float32) / scale.to(torch.float32).reshape(-1)[0]
        return scaled.clamp(low, high).to(self.dtype)

    def _scatter(
        self, cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, heads: _HeadLayout
    ) -> None:
        blocks, offsets = slots // self.block_size, slots % self.block_size
        if cache.dim() == 4:  # [blocks, kv_heads, block_size, d]
            if tuple(cache.shape[1:]) != (heads.kv, self.block_size, heads.d_head):
                raise KernelConstraintError(
                    f"NF.qkv_proj: cache {tuple(cache.shape)} is not [blocks, {heads.kv}, {self.block_size}, "
                    f"{heads.d_head}]"
                )
            for head in range(heads.kv):
                cache[blocks, head, offsets] = rows[:, head].to(cache.dtype)
        elif cache.dim() == 3:  # [blocks, block_size, kv_heads * d]
            if tuple(cache.shape[1:]) != (self.block_size, heads.kv * heads.d_head):
                raise KernelConstraintError(
                    f"NF.qkv_proj: cache {tuple(cache.shape)} is not [blocks, {self.block_size}, "
                    f"{heads.kv * heads.d_head}]"
                )
            cache[blocks, offsets] = rows.reshape(rows.shape[0], -1).to(cache.dtype)
        else:
            raise KernelConstraintError(f"NF.qkv_proj: a paged cache is 3-D or 4-D, got {tuple(cache.shape)}")


def o_proj(active: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Attention output ``[B, N, D, S]`` (or ``[B, S, N*D]``) times
    ``weight [N*D, H]`` plus ``bias [1, H]`` -> ``[B, S, H]``."""
    kernel_phases.record("o_proj")
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
    check_bias(bias, weight.shape[1], "o_proj")
    return matmul(active, weight, bias)
