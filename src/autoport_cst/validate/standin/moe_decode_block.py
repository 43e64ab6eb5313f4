"""``NF.moe_block_tkg`` (``moe.moe_block_tkg`` takes the call): the fused
decode block's checks and steps (RMSNorm, router, top-k, the local experts)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .common_types import ExpertAffinityScaleMode, RouterActFnType
from .moe_math import ExpertClamps, check_expert_weights, router_activation, stacked_expert_mlp
from .numerics import KernelConstraintError
from .precision_notes import note


@dataclass(frozen=True)
class BlockTkgCall(ExpertClamps):
    """The arguments of one ``moe_block_tkg`` call (its explicit parameters)."""

    inp: torch.Tensor
    gamma: torch.Tensor
    router_weights: torch.Tensor
    expert_gate_up_weights: torch.Tensor
    expert_down_weights: torch.Tensor
    rank_id: torch.Tensor | None
    top_k: int
    shared_expert_gate_w: torch.Tensor | None
    shared_expert_up_w: torch.Tensor | None
    shared_expert_down_w: torch.Tensor | None
    expert_gate_up_weights_scale: torch.Tensor | None
    expert_down_weights_scale: torch.Tensor | None
    router_bias: torch.Tensor | None
    expert_gate_up_bias: torch.Tensor | None
    expert_down_bias: torch.Tensor | None
    eps: float
    router_act_fn: Any
    router_pre_norm: bool
    norm_topk_prob: bool
    expert_affinities_scaling_mode: Any
    hidden_act_fn: Any
    router_mm_dtype: Any
    hidden_actual: int | None
    skip_router_logits: bool
    is_all_expert: bool
    residual: torch.Tensor | None


def run_moe_block_tkg(call: BlockTkgCall) -> Any:
    """``moe_block_tkg``'s result: ``[T, H]``, and the router logits unless
    ``skip_router_logits``."""
    _refuse_unmodelled(call)
    inp = call.inp
    x = inp.reshape(-1, inp.shape[-1]) if inp.dim() == 3 else inp
    if x.dim() != 2:
        raise KernelConstraintError(
            f"NF.moe_block_tkg: inp must be [B, S, H] or [T, H], got {tuple(inp.shape)}"
        )
    experts_local = _check_weights(call, x.shape[1])
    start = _local_start(experts_local, call.router_weights.shape[1], call.rank_id, call.is_all_expert)
    normed = _norm(x, call.gamma, call.eps, call.hidden_actual)
    logits = _router_logits(normed, call)
    dense = _affinities(logits, call.router_act_fn, call.router_pre_norm, call.norm_topk_prob, call.top_k)
    local = _scaled(dense[:, start : start + experts_local], call.expert_affinities_scaling_mode)
    output = _local_experts(normed, local, call).to(x.dtype)
    if call.skip_router_logits:
        return output
    return output, logits


def _refuse_unmodelled(call: BlockTkgCall) -> None:
    shared = (call.shared_expert_gate_w, call.shared_expert_up_w, call.shared_expert_down_w)
    if any(w is not None for w in shared):
        raise NotImplementedError("NF.moe_block_tkg: fused shared experts are not in the CPU stand-in")
    if call.expert_gate_up_weights_scale is not None or call.expert_down_weights_scale is not None:
        raise NotImplementedError("NF.moe_block_tkg: quantized experts are not in the CPU stand-in")
    if call.residual is not None:
        raise NotImplementedError("NF.moe_block_tkg: the fused residual add is not in the CPU stand-in")


def _check_weights(call: BlockTkgCall, hidden: int) -> int:
    """The block's shape checks; returns the local expert count."""
    gamma, router_weights, router_bias = call.gamma, call.router_weights, call.router_bias
    if gamma.dim() != 2 or tuple(gamma.shape) != (1, hidden):
        raise KernelConstraintError(
            f"NF.moe_block_tkg: gamma must be [1, {hidden}], got {tuple(gamma.shape)}"
        )
    if router_weights.dim() != 2 or router_weights.shape[0] != hidden:
        raise KernelConstraintError(
            f"NF.moe_block_tkg: router_weights must be [H, E] with H = {hidden}, got {tuple(router_weights.shape)}"
        )
    experts_global = router_weights.shape[1]
    if router_bias is not None and tuple(router_bias.shape) != (1, experts_global):
        raise KernelConstraintError(
            f"NF.moe_block_tkg: Bias shape must be [1, {experts_global}], got {tuple(router_bias.shape)} "
            "for router_bias (pass bias.unsqueeze(0))"
        )
    names = ("expert_gate_up_weights", "expert_down_weights")
    gate_up, down = call.expert_gate_up_weights, call.expert_down_weights
    experts_local, inter = check_expert_weights(gate_up, down, hidden, "moe_block_tkg", names)
    if call.expert_gate_up_bias is not None and tuple(call.expert_gate_up_bias.shape) != (
        experts_local,
        2,
        inter,
    ):
        raise KernelConstraintError(
            f"NF.moe_block_tkg: expert_gate_up_bias must be [E_L, 2, I] = [{experts_local}, 2, {inter}], "
            f"got {tuple(call.expert_gate_up_bias.shape)}"
        )
    if call.expert_down_bias is not None and tuple(call.expert_down_bias.shape) != (experts_local, hidden):
        raise KernelConstraintError(
            f"NF.moe_block_tkg: expert_down_bias must be [E_L, H] = [{experts_local}, {hidden}], "
            f"got {tuple(call.expert_down_bias.shape)}"
        )
    return experts_local


def _local_start(
    experts_local: int, experts_global: int, rank_id: torch.Tensor | None, is_all_expert: bool
) -> int:
    """The first global expert of this rank's ``experts_local``. Only the
    all-expert mode (``is_all_expert``) reads ``rank_id``: the selective-expert
    mode looks the top-k's global expert ids up in the weights it is given,
    so it needs every expert there."""
    start = 0
    if experts_local < experts_global:
        if not is_all_expert:
            raise KernelConstraintError(
                f"NF.moe_block_tkg: {experts_local} local experts of {experts_global}: the "
                "selective-expert mode (is_all_expert=False) indexes the expert weights by the "
                "global expert ids of the top-k and reads no rank_id; local experts need "
                "is_all_expert=True with rank_id"
            )
        if rank_id is None:
            raise KernelConstraintError("NF.moe_block_tkg: rank_id [1, 1] is required with local experts")
        if rank_id.dtype != torch.int32 or tuple(rank_id.shape) != (1, 1):
            raise KernelConstraintError(
                f"NF.moe_block_tkg: rank_id must be an int32 [1, 1] tensor, got {rank_id.dtype} {tuple(rank_id.shape)}"
            )
        start = experts_local * int(rank_id.reshape(-1)[0])
    if is_all_expert and rank_id is None:
        raise KernelConstraintError("NF.moe_block_tkg: is_all_expert needs rank_id")
    return start


def _norm(x: torch.Tensor, gamma: torch.Tensor, eps: float, hidden_actual: int | None) -> torch.Tensor:
    """RMSNorm over the first ``hidden_actual`` columns (the rest zeroed),
    in float32 with the weight applied before the one rounding."""
    eps_hidden = x.shape[1] if hidden_actual is None else hidden_actual
    x32 = x.to(torch.float32)
    normed = x32.clone()
    variance = x32[:, :eps_hidden].pow(2).mean(-1, keepdim=True)
    normed[:, :eps_hidden] = normed[:, :eps_hidden] * torch.rsqrt(variance + eps)
    normed = (gamma.reshape(-1).to(torch.float32) * normed).to(x.dtype)
    normed[:, eps_hidden:] = 0
    return normed


def _router_logits(normed: torch.Tensor, call: BlockTkgCall) -> torch.Tensor:
    """The router matmul takes its inputs in ``router_mm_dtype`` (float32
    unless given) and accumulates in float32; the bias is added after."""
    mm_dtype = call.router_mm_dtype if isinstance(call.router_mm_dtype, torch.dtype) else torch.float32
    note("NF.moe_block_tkg's router matmul", mm_dtype, normed.dtype)
    logits = normed.to(mm_dtype).to(torch.float32) @ call.router_weights.to(mm_dtype).to(torch.float32)
    if call.router_bias is not None:
        logits = logits + call.router_bias.reshape(-1).to(torch.float32)
    return logits


def _affinities(
    logits: torch.Tensor, router_act_fn: Any, pre_norm: bool, norm_topk_prob: bool, top_k: int
) -> torch.Tensor:
    """Top-k of the router logits ``[T, E]`` (activation before it with
    ``pre_norm``, after it otherwise; optional renormalisation), scattered
    into float32 ``[T, E]``."""
    act = "softmax" if router_act_fn in (RouterActFnType.SOFTMAX, "softmax") else "sigmoid"
    if router_act_fn not in (RouterActFnType.SOFTMAX, RouterActFnType.SIGMOID, "softmax", "sigmoid"):
        raise NotImplementedError(
            f"NF.moe_block_tkg: router activation {router_act_fn} is not in the CPU stand-in"
        )
    if pre_norm:
        values, indices = torch.topk(router_activation(act, logits), top_k, dim=-1)
    else:
        values, indices = torch.topk(logits, top_k, dim=-1)
        values = router_activation(act, values)
    if norm_topk_prob:
        values = values / (values.sum(dim=-1, keepdim=True) + 1e-20)
    dense = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    return dense.scatter_(1, indices, values.to(torch.float32))


def _scaled(local: torch.Tensor, mode: Any) -> torch.Tensor:
    """The experts' output weights: the affinities (POST_SCALE) or 1 (NO_SCALE).
    PRE_SCALE is refused as the kernel refuses it (its token-generation MoE
    asserts that it does not support pre-scaling)."""
    if mode == ExpertAffinityScaleMode.NO_SCALE:
        return (local > 0).to(torch.float32)
    if mode == ExpertAffinityScaleMode.PRE_SCALE:
        raise KernelConstraintError(
            "NF.moe_block_tkg: the kernel does not support pre-scale mode (ExpertAffinityScaleMode.PRE_SCALE); "
            "experts that read router-weighted inputs run the blockwise NF.moe_cte with PRE_SCALE"
        )
    if mode != ExpertAffinityScaleMode.POST_SCALE:
        raise NotImplementedError(
            f"NF.moe_block_tkg: expert_affinities_scaling_mode {mode} is not in the CPU stand-in"
        )
    return local


def _local_experts(normed: torch.Tensor, local: torch.Tensor, call: BlockTkgCall) -> torch.Tensor:
    """The local experts on the rows routed to them (``local [T, E_L]``:
    their output weights), summed in float32."""
    output = torch.zeros_like(normed, dtype=torch.float32)
    stacked = (
        call.expert_gate_up_weights,
        call.expert_down_weights,
        call.expert_gate_up_bias,
        call.expert_down_bias,
    )
    for expert in range(local.shape[1]):
        weight = local[:, expert]
        rows = torch.nonzero(weight, as_tuple=False).reshape(-1)
        if rows.numel() == 0:
            continue
        out = stacked_expert_mlp(
            normed[rows], expert, stacked, call.hidden_act_fn, call.clamps, "moe_block_tkg"
        )
        output.index_add_(0, rows, out * weight[rows].unsqueeze(1))
    return output
