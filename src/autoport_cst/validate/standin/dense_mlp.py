"""Stand-in for ``NF.mlp`` (the dense MLP kernel) and
``NF.merge_prompt_embeds``.

``mlp`` computes, in the kernel's order: an optional fused residual add
(``hidden + fused_add_tensor``), an optional RMS or layer norm, the gate and
up projections (with ``[1, I]`` biases), optional clamps of the gate and up
results, ``act(gate) * up`` (``act(up)`` with ``skip_gate``) in float32, and
the down projection (``[1, H]`` bias). With ``store_fused_add_result`` it
also returns the residual sum.
"""

from __future__ import annotations

from typing import Any

import torch

from . import kernel_phases
from .common_types import ActFnType, NormType, QuantizationType
from .kernel_options import KernelOptions
from .numerics import activation, check_bias, layer_norm, matmul, rms_norm

MLP_OPTIONS = KernelOptions(
    "mlp",
    refused={
        "quantization_type": QuantizationType.NONE,
        "gate_w_scale": None,
        "up_w_scale": None,
        "down_w_scale": None,
        "gate_up_in_scale": None,
        "down_in_scale": None,
        "quant_clipping_bound": 0.0,
        "gate_up_w_layout": None,
    },
)


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
    fused_add_tensor: torch.Tensor | None = None,
    store_fused_add_result: bool = False,
    output_dtype: torch.dtype | None = None,
    gate_clamp_upper_limit: float | None = None,
    gate_clamp_lower_limit: float | None = None,
    up_clamp_upper_limit: float | None = None,
    up_clamp_lower_limit: float | None = None,
    **options: Any,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The dense MLP (module docstring); weights ``[H, I]``, ``[H, I]``, ``[I, H]``."""
    kernel_phases.record("mlp")
    MLP_OPTIONS.check(options)
    check_bias(gate_b, gate_w.shape[1], "mlp", "gate_b")
    check_bias(up_b, up_w.shape[1], "mlp", "up_b")
    check_bias(down_b, down_w.shape[1], "mlp", "down_b")
    residual = hidden if fused_add_tensor is None else hidden + fused_add_tensor
    x = _normed(residual, norm_type, eps, ln_w, norm_b)
    up = matmul(x, up_w, up_b).to(torch.float32)
    up = _clamp(up, up_clamp_lower_limit, up_clamp_upper_limit)
    if skip_gate:
        inner = activation(up, act_fn)
    else:
        gate = _clamp(
            matmul(x, gate_w, gate_b).to(torch.float32), gate_clamp_lower_limit, gate_clamp_upper_limit
        )
        inner = activation(gate, act_fn) * up
    output = matmul(inner.to(hidden.dtype), down_w, down_b)
    if output_dtype is not None:
        output = output.to(output_dtype)
    if store_fused_add_result and fused_add_tensor is not None:
        return output, residual
    return output


def _normed(x: torch.Tensor, norm_type: Any, eps: float, weight, bias) -> torch.Tensor:
    if norm_type in (None, NormType.NO_NORM):
        return x
    if norm_type == NormType.RMS_NORM:
        return rms_norm(x, eps, weight)
    if norm_type == NormType.LAYER_NORM:
        return layer_norm(x, eps, weight, bias)
    raise NotImplementedError(f"NF.mlp: norm_type={norm_type!r} is not implemented in the CPU stand-in")


def _clamp(x: torch.Tensor, low: float | None, high: float | None) -> torch.Tensor:
    if low is None and high is None:
        return x
    return x.clamp(min=low, max=high)


def merge_prompt_embeds(
    hidden: torch.Tensor,
    inputs_embeds: torch.Tensor | None,
    is_token_ids: torch.Tensor | None,
) -> torch.Tensor:
    """Token embeddings where ``is_token_ids``, ``inputs_embeds`` elsewhere."""
    kernel_phases.record("merge_prompt_embeds")
    if inputs_embeds is None or is_token_ids is None:
        return hidden
    return torch.where(is_token_ids.bool().unsqueeze(-1), hidden, inputs_embeds.to(hidden.dtype))
