"""What the MoE kernels of the stand-in share: the router's score
activation (``router``, ``moe_block_tkg``) and one expert's MLP with the
checks of the stacked expert weights (``moe_cte``, ``moe_block_tkg``).

Numerics: the expert matmuls take their inputs in the activation dtype (or
``compute_dtype``) and accumulate in float32; activations run in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .common_types import ActFnType
from .numerics import KernelConstraintError

Clamps = tuple[float | None, float | None, float | None, float | None]


@dataclass(frozen=True)
class ExpertClamps:
    """The clamp limits of the experts' gate and up projections (None: no
    limit), as the MoE kernels take them."""

    gate_clamp_upper_limit: float | None
    gate_clamp_lower_limit: float | None
    up_clamp_upper_limit: float | None
    up_clamp_lower_limit: float | None

    @property
    def clamps(self) -> Clamps:
        return (
            self.gate_clamp_upper_limit,
            self.gate_clamp_lower_limit,
            self.up_clamp_upper_limit,
            self.up_clamp_lower_limit,
        )


# The moe kernels' Swish is x * sigmoid(1.702 x) (the constant is baked into
# the instruction set); NF.mlp's Swish is SiLU.
SWIGLU_ALPHA = 1.702


def router_activation(
    activation: str | Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> torch.Tensor:
    if callable(activation):
        return activation(x)
    if activation == "softmax":
        return torch.softmax(x, dim=-1)
    if activation == "sigmoid":
        return torch.sigmoid(x)
    raise ValueError(f"Unsupported activation function: {activation}. Use 'softmax' or 'sigmoid'.")


def expert_activation(gate: torch.Tensor, act: Any, op: str) -> torch.Tensor:
    if act in (ActFnType.SiLU, "silu"):
        return F.silu(gate)
    if act in (ActFnType.GELU, "gelu"):
        return F.gelu(gate)
    if act in (ActFnType.Swish, "swish"):
        return gate * torch.sigmoid(gate * SWIGLU_ALPHA)
    raise NotImplementedError(f"NF.{op}: activation {act!r} is not in the CPU stand-in")


def expert_mlp(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    gate_up_bias: torch.Tensor | None,
    down_bias: torch.Tensor | None,
    act: Any,
    clamps: Clamps,
    op: str,
    compute: torch.dtype | None = None,
) -> torch.Tensor:
    """One expert on rows ``x [n, H]``: gate_up ``[H, 2, I]``, down ``[I, H]``,
    biases ``[2, I]`` / ``[H]``; the matmuls take their inputs in ``compute``
    (the rows' dtype by default) and accumulate in float32. Returns float32
    ``[n, H]``."""
    compute = compute or x.dtype
    x = x.to(compute)
    gate = x.to(torch.float32) @ gate_up[:, 0, :].to(compute).to(torch.float32)
    up = x.to(torch.float32) @ gate_up[:, 1, :].to(compute).to(torch.float32)
    if compute != torch.float32:
        gate, up = gate.to(compute).to(torch.float32), up.to(compute).to(torch.float32)
    if gate_up_bias is not None:
        gate = gate + gate_up_bias[0].to(torch.float32)
        up = up + gate_up_bias[1].to(torch.float32)
    gate_upper, gate_lower, up_upper, up_lower = clamps
    if gate_upper is not None or gate_lower is not None:
        gate = gate.clamp(min=gate_lower, max=gate_upper)
    if up_upper is not None or up_lower is not None:
        up = up.clamp(min=up_lower, max=up_upper)
    inner = (expert_activation(gate, act, op) * up).to(compute)
    out = inner.to(torch.float32) @ down.to(compute).to(torch.float32)
    if down_bias is not None:
        out = out + down_bias.to(torch.float32).reshape(-1)
    return out


StackedExperts = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def stacked_expert_mlp(
    x: torch.Tensor,
    expert: int,
    stacked: StackedExperts,
    act: Any,
    clamps: Clamps,
    op: str,
    compute: torch.dtype | None = None,
) -> torch.Tensor:
    """Expert ``expert`` of the stacked weights ``stacked`` (gate_up
    ``[E, H, 2, I]``, down ``[E, I, H]``, and the biases ``[E, 2, I]`` /
    ``[E, H]`` or None) on rows ``x`` (:func:`expert_mlp`)."""
    gate_up, down, gate_up_bias, down_bias = stacked
    return expert_mlp(
        x,
        gate_up[expert],
        down[expert],
        None if gate_up_bias is None else gate_up_bias[expert],
        None if down_bias is None else down_bias[expert],
        act,
        clamps,
        op,
        compute,
    )


def check_expert_weights(
    gate_up: torch.Tensor, down: torch.Tensor, hidden: int, op: str, names: tuple[str, str]
) -> tuple[int, int]:
    """``(E, I)`` of ``gate_up [E, H, 2, I]`` and ``down [E, I, H]``."""
    if gate_up.dim() != 4 or gate_up.shape[2] != 2 or gate_up.shape[1] != hidden:
        raise KernelConstraintError(
            f"NF.{op}: {names[0]} must be [E, H={hidden}, 2, I] (gate and up stacked on dim 2; "
            f"reshape [E, H, 2*I] with .reshape(E, H, 2, I)), got {tuple(gate_up.shape)}"
        )
    experts, _, _, inter = gate_up.shape
    if tuple(down.shape) != (experts, inter, hidden):
        raise KernelConstraintError(
            f"NF.{op}: {names[1]} must be [E, I, H] = [{experts}, {inter}, {hidden}], got {tuple(down.shape)}"
        )
    return experts, inter
