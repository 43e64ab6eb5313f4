"""Arithmetic shared by the stand-in kernels, with the kernels' numerics:
matmuls take their inputs at the given dtype and accumulate in float32
(a bias joins the float32 accumulator, so the result rounds once);
normalisations run in float32; RoPE runs in the tensor's own dtype, as the
fallbacks and transformers do.

Also here: the hardware-constraint error every kernel raises, the 2-D bias
rule, and the FP8 KV-cache emulation (``float8_e4m3fn`` storage on CPU).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

P_MAX = 128  # SBUF partitions: decode contexts and masks come in multiples of it
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


class KernelConstraintError(ValueError):
    """An input a Neuron kernel rejects on hardware."""


def matmul(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w (+ bias)`` accumulated in float32, returned in ``x``'s dtype."""
    if x.dtype == torch.float32 and w.dtype == torch.float32:
        out = x @ w
        return out if bias is None else out + bias.to(torch.float32)
    out = x.to(torch.float32) @ w.to(torch.float32)
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(x.dtype)


def check_bias(bias: torch.Tensor | None, width: int, op: str, name: str = "bias") -> None:
    """Biases are ``[1, width]`` on hardware ("Bias shape must be [1, I]")."""
    if bias is None:
        return
    if bias.dim() != 2 or bias.shape[0] != 1:
        raise KernelConstraintError(
            f"NF.{op}: Bias shape must be [1, {width}], got {tuple(bias.shape)} for {name} "
            f"(pass bias.unsqueeze(0); a 1-D bias fails on hardware)"
        )
    if bias.shape[1] != width:
        raise KernelConstraintError(f"NF.{op}: {name} has width {bias.shape[1]}, expected {width}")


def rms_norm(
    x: torch.Tensor, eps: float, weight: torch.Tensor | None, width: int | None = None
) -> torch.Tensor:
    """RMSNorm over the last dimension in float32. ``width`` is the real
    (unpadded) size when the last dimension is zero-padded: the mean of
    squares divides by it instead of the padded size."""
    dtype = x.dtype
    x32 = x.to(torch.float32)
    if width is None or width == x32.shape[-1]:
        variance = x32.pow(2).mean(-1, keepdim=True)
    else:
        variance = x32.pow(2).sum(-1, keepdim=True) / width
    x32 = x32 * torch.rsqrt(variance + eps)
    if weight is not None:
        x32 = x32 * weight.to(torch.float32).reshape(-1)
    return x32.to(dtype)


def layer_norm(
    x: torch.Tensor, eps: float, weight: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    """LayerNorm over the last dimension in float32."""
    dtype = x.dtype
    x32 = x.to(torch.float32)
    mean = x32.mean(-1, keepdim=True)
    x32 = (x32 - mean) * torch.rsqrt((x32 - mean).pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        x32 = x32 * weight.to(torch.float32).reshape(-1)
    if bias is not None:
        x32 = x32 + bias.to(torch.float32).reshape(-1)
    return x32.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[-x2, x1]`` for the halves ``x1, x2`` of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def activation(x: torch.Tensor, act_fn: Any, op: str = "mlp") -> torch.Tensor:
    """SiLU (also for Swish, as NF.mlp computes it), GELU or tanh-GELU."""
    name = getattr(act_fn, "value", act_fn)
    if name in ("silu", "swish", "SiLU", "Swish"):
        return F.silu(x)
    if name in ("gelu", "GELU"):
        return F.gelu(x)
    if name in ("gelu_tanh_approx", "GELU_Tanh_Approx"):
        return F.gelu(x, approximate="tanh")
    raise NotImplementedError(f"NF.{op}: activation {act_fn!r} is not in the CPU stand-in")


def is_fp8(tensor: torch.Tensor | None) -> bool:
    return tensor is not None and tensor.dtype in FP8_DTYPES


def quantize_kv(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """FP8 KV-cache storage of ``x``: ``x * scale`` (the reciprocal scale the
    models load), clamped to the platform's FP8 range, cast to ``dtype``."""
    from .dtype_utils import FP8_CLAMP_MAX

    scaled = x.to(torch.float32) * scale.to(torch.float32).reshape(-1)[0]
    return scaled.clamp(-FP8_CLAMP_MAX, FP8_CLAMP_MAX).to(dtype)
