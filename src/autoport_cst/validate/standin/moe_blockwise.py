"""``NF.moe_cte`` (``moe.moe_cte`` takes the call): the blockwise expert
MLPs of prefill, the call's checks and the loop over the blocks."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from .common_types import ExpertAffinityScaleMode
from .moe_math import ExpertClamps, check_expert_weights, stacked_expert_mlp
from .numerics import KernelConstraintError
from .precision_notes import note


class MoECTEImplementation(enum.Enum):
    """Kernel variants of ``moe_cte`` (``nkilib.core.moe.moe_cte.moe_cte``);
    the stand-in computes the same result for each."""

    shard_on_block = "shard_on_block"
    shard_on_i = "shard_on_i"
    shard_on_i_hybrid = "shard_on_i_hybrid"
    shard_on_i_dropping = "shard_on_i_dropping"
    shard_on_block_mx = "shard_on_block_mx"
    shard_on_i_mx = "shard_on_i_mx"
    shard_on_i_mx_hybrid = "shard_on_i_mx_hybrid"


@dataclass(frozen=True)
class CteCall(ExpertClamps):
    """The arguments of one ``moe_cte`` call (its explicit parameters)."""

    hidden_states: torch.Tensor
    expert_affinities_masked: torch.Tensor
    gate_up_proj_weight: torch.Tensor
    down_proj_weight: torch.Tensor
    token_position_to_id: torch.Tensor
    block_to_expert: torch.Tensor
    block_size: int
    implementation: Any
    conditions: torch.Tensor | None
    gate_and_up_proj_bias: torch.Tensor | None
    down_proj_bias: torch.Tensor | None
    gate_up_proj_scale: torch.Tensor | None
    down_proj_scale: torch.Tensor | None
    activation_function: Any
    skip_token: bool
    skip_weight: bool
    compute_dtype: Any
    is_tensor_update_accumulating: bool
    expert_affinities_scaling_mode: Any


def run_moe_cte(call: CteCall) -> torch.Tensor:
    """``moe_cte``'s result, ``[T, H]`` in the hidden states' dtype."""
    _check_variant(
        call.implementation,
        call.gate_up_proj_scale,
        call.down_proj_scale,
        call.expert_affinities_scaling_mode,
    )
    hidden_states = call.hidden_states
    if hidden_states.dim() != 2:
        raise KernelConstraintError(
            f"NF.moe_cte: hidden_states must be [T, H], got {tuple(hidden_states.shape)}"
        )
    hidden = hidden_states.shape[1]
    names = ("gate_up_proj_weight", "down_proj_weight")
    experts, inter = check_expert_weights(
        call.gate_up_proj_weight, call.down_proj_weight, hidden, "moe_cte", names
    )
    _check_biases(call.gate_and_up_proj_bias, call.down_proj_bias, experts, inter, hidden)
    positions, block_expert = _check_mapping(call.token_position_to_id, call.block_to_expert, call.block_size)
    affinities = _affinity_matrix(call.expert_affinities_masked, experts, hidden_states.shape[0])
    active = _active_blocks(call.conditions, block_expert.numel())
    _check_skips(positions, block_expert, call.skip_token, call.skip_weight)
    compute = _compute_dtype(call.compute_dtype, hidden_states.dtype)
    note("NF.moe_cte", compute, hidden_states.dtype)  # bf16 experts in a float32 model, as the device
    return _run_blocks(call, positions, block_expert, affinities, active, compute)


def _run_blocks(
    call: CteCall,
    positions: torch.Tensor,
    block_expert: torch.Tensor,
    affinities: torch.Tensor,
    active: list[bool],
    compute: torch.dtype,
) -> torch.Tensor:
    """Each active block's tokens through its expert, weighted by their
    affinities (``affinities [T, E]``) and accumulated (or written) into
    their rows."""
    hidden_states, block_size = call.hidden_states, call.block_size
    tokens = affinities.shape[0]
    output = torch.zeros(tokens, hidden_states.shape[1], dtype=torch.float32, device=hidden_states.device)
    stacked = (
        call.gate_up_proj_weight,
        call.down_proj_weight,
        call.gate_and_up_proj_bias,
        call.down_proj_bias,
    )
    pre_scale = call.expert_affinities_scaling_mode == ExpertAffinityScaleMode.PRE_SCALE
    for block in range(block_expert.numel()):
        ids = positions[block * block_size : (block + 1) * block_size].to(torch.long)
        ids = ids[(ids >= 0) & (ids < tokens)]  # -1 skipped; T: the zero padding row
        expert = int(block_expert[block])
        if ids.numel() == 0 or not active[block] or expert < 0:
            continue
        rows, affinity = hidden_states[ids], affinities[ids, expert].unsqueeze(1)
        if pre_scale:
            # the kernel multiplies the block's rows, loaded in compute_dtype, by their
            # float32 affinities before the gate/up projection; the outputs are not weighted
            rows = (rows.to(compute) * affinity).to(compute)
        out = stacked_expert_mlp(
            rows, expert, stacked, call.activation_function, call.clamps, "moe_cte", compute
        )
        weighted = out if pre_scale else out * affinity
        if call.is_tensor_update_accumulating:
            output.index_add_(0, ids, weighted)
        else:  # each block writes its tokens' rows: a token keeps its last expert's output
            output[ids] = weighted
    return output.to(hidden_states.dtype)


def _check_variant(implementation: Any, gate_up_scale: Any, down_scale: Any, scaling_mode: Any) -> None:
    """The kernel variants and modes the stand-in computes."""
    if not isinstance(implementation, MoECTEImplementation):
        raise KernelConstraintError(
            f"NF.moe_cte: implementation must be a MoECTEImplementation, got {implementation!r}"
        )
    if implementation.value.endswith(("_mx", "_mx_hybrid")):
        raise NotImplementedError(
            f"NF.moe_cte: {implementation.value} (MX quantized) is not in the CPU stand-in"
        )
    if gate_up_scale is not None or down_scale is not None:
        raise NotImplementedError("NF.moe_cte: quantized experts are not in the CPU stand-in")
    if scaling_mode not in (ExpertAffinityScaleMode.POST_SCALE, ExpertAffinityScaleMode.PRE_SCALE):
        # PRE_SCALE_DELAYED (the affinities applied between the gate/up matmul and the
        # activation, in the kernel's documentation) and NO_SCALE are not computed here
        raise NotImplementedError(
            f"NF.moe_cte: expert_affinities_scaling_mode {scaling_mode} is not in the CPU stand-in "
            "(it computes POST_SCALE and PRE_SCALE)"
        )


def _check_biases(
    gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None, experts: int, inter: int, hidden: int
) -> None:
    if (gate_up_bias is None) != (down_bias is None):
        raise KernelConstraintError("NF.moe_cte: gate_and_up_proj_bias and down_proj_bias go together")
    if gate_up_bias is not None and tuple(gate_up_bias.shape) != (experts, 2, inter):
        raise KernelConstraintError(
            f"NF.moe_cte: gate_and_up_proj_bias must be [E, 2, I] = [{experts}, 2, {inter}], "
            f"got {tuple(gate_up_bias.shape)}"
        )
    if down_bias is not None and tuple(down_bias.shape) not in ((experts, hidden), (experts, 1, hidden)):
        raise KernelConstraintError(
            f"NF.moe_cte: down_proj_bias must be [E, H] = [{experts}, {hidden}], got {tuple(down_bias.shape)}"
        )


def _check_mapping(
    token_position_to_id: torch.Tensor, block_to_expert: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The blockwise mapping, flattened: ``(positions [N * block_size],
    block_to_expert [N])``."""
    for name, tensor in (
        ("token_position_to_id", token_position_to_id),
        ("block_to_expert", block_to_expert),
    ):
        if tensor.dtype != torch.int32:
            raise KernelConstraintError(f"NF.moe_cte: {name} must be int32, got {tensor.dtype}")
    positions = token_position_to_id.reshape(-1)
    if positions.numel() % block_size != 0:
        raise KernelConstraintError(
            f"NF.moe_cte: len(token_position_to_id) = {positions.numel()} is not a multiple of block_size {block_size}"
        )
    num_blocks = positions.numel() // block_size
    block_expert = block_to_expert.reshape(-1)
    if block_expert.numel() != num_blocks:
        raise KernelConstraintError(
            f"NF.moe_cte: block_to_expert has {block_expert.numel()} entries for {num_blocks} blocks"
        )
    return positions, block_expert


def _affinity_matrix(expert_affinities_masked: torch.Tensor, experts: int, rows: int) -> torch.Tensor:
    """``[T * E, 1]`` -> float32 ``[T, E]``; the hidden states hold ``rows``
    = T (or T + 1, a zero padding row)."""
    affinities = expert_affinities_masked.reshape(-1)
    if affinities.numel() % experts != 0:
        raise KernelConstraintError(
            f"NF.moe_cte: expert_affinities_masked has {affinities.numel()} entries, not T * E (E = {experts})"
        )
    tokens = affinities.numel() // experts
    if rows not in (tokens, tokens + 1):
        raise KernelConstraintError(f"NF.moe_cte: hidden_states has {rows} rows for {tokens} tokens")
    return affinities.reshape(tokens, experts).to(torch.float32)


def _active_blocks(conditions: torch.Tensor | None, num_blocks: int) -> list[bool]:
    """Which blocks ``moe_cte`` computes: those whose ``conditions`` entry
    (from ``build_blockwise_mapping``: 1 when the block holds a token) is not
    0; every block without ``conditions``."""
    if conditions is None:
        return [True] * num_blocks
    flags = conditions.reshape(-1)
    if flags.numel() != num_blocks:
        raise KernelConstraintError(
            f"NF.moe_cte: conditions has {flags.numel()} entries for {num_blocks} blocks"
        )
    return [bool(flag) for flag in flags.tolist()]


def _check_skips(
    positions: torch.Tensor, block_expert: torch.Tensor, skip_token: bool, skip_weight: bool
) -> None:
    """-1 entries are skipped only in the skip modes that say so: without
    ``skip_token`` every slot of ``token_position_to_id`` is a row of
    ``hidden_states`` (padding points at a zero row ``T``), without
    ``skip_weight`` every block has an expert."""
    if not skip_token and bool((positions < 0).any()):
        raise KernelConstraintError(
            "NF.moe_cte: token_position_to_id holds -1 padding slots, which the kernel skips only with "
            "skip_token=True (without it, padding slots point at a zero row T of hidden_states [T + 1, H])"
        )
    if not skip_weight and bool((block_expert < 0).any()):
        raise KernelConstraintError(
            "NF.moe_cte: block_to_expert holds -1 (a block without an expert), which the kernel skips only "
            "with skip_weight=True"
        )


def _compute_dtype(compute_dtype: Any, default: torch.dtype) -> torch.dtype:
    """``compute_dtype`` (an ``nl`` dtype, which the stand-in's are torch
    dtypes) or ``default`` when None."""
    if compute_dtype is None:
        return default
    if not isinstance(compute_dtype, torch.dtype) or not compute_dtype.is_floating_point:
        raise KernelConstraintError(f"NF.moe_cte: compute_dtype must be a float dtype, got {compute_dtype!r}")
    return compute_dtype
