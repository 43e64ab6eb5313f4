"""Stand-in for the mixture-of-experts ops of ``vllm_neuron.functional``
(re-exported by :mod:`.functional`, so models reach them as ``NF.router``,
``NF.moe_cte``...).

What each op computes follows its documented semantics (the NF docstrings and
their PyTorch fallbacks); the shapes and dtypes the device kernels accept are
enforced with the kernel's wording, so a port that validates here passes the
same arguments on Trainium:

- ``router(hidden [T, H], router_weights [H, E], top_k, router_bias [E])``:
  router logits in ``computation_dtype``; top-k selection; the activation
  (softmax or sigmoid) applied in one of three documented orders; the
  selected affinities scattered into a dense ``[T, E]`` matrix (zeros for
  experts not selected). With ``return_logits`` also the ``[T, E]`` logits.
- ``build_blockwise_mapping`` groups the tokens routed to each local expert
  into blocks of ``block_size`` (padding slots are ``-1``) and flattens the
  affinities to ``[T * E_local, 1]``.
- ``moe_cte(hidden [T, H], expert_affinities_masked [T * E, 1],
  gate_up_proj_weight [E, H, 2, I], down_proj_weight [E, I, H], ...)`` runs
  every block through its expert (``act(x W_gate) * (x W_up) W_down``),
  scaled by the token's affinity (POST_SCALE), accumulated per token.
- ``moe_block_tkg`` is the fused decode block: RMSNorm (``gamma [1, H]``),
  router, top-k and the expert MLPs over the local experts.
- ``get_local_expert_affinities`` keeps the columns of this rank's experts.

Numerics: router logits in ``computation_dtype`` (float32 by default) from
the weight as given (a float32 router weight gives float32 scores);
expert matmuls take their inputs in the activation dtype and accumulate in
float32; activations and the weighted sum run in float32.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from . import kernel_phases
from .common_types import ActFnType, ExpertAffinityScaleMode, RouterActFnType
from .kernel_options import KernelOptions, refuse_bools
from .numerics import KernelConstraintError

# keyword arguments beyond the explicit parameters: none is modelled
ROUTER_OPTIONS = KernelOptions("router")
MOE_CTE_OPTIONS = KernelOptions("moe_cte")
MOE_BLOCK_TKG_OPTIONS = KernelOptions("moe_block_tkg")

# The moe kernels' Swish is x * sigmoid(1.702 x) (the constant is baked into
# the instruction set); NF.mlp's Swish is SiLU.
SWIGLU_ALPHA = 1.702


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


class RouterComputationOrder(enum.Enum):
    """Order of the router's steps (``vllm_neuron.functional.moe.router``)."""

    PRENORM_LINEAR_TOPK_ACT_SCATTER = "prenorm_linear_topk_act_scatter"
    PRENORM_LINEAR_ACT_TOPK_RENORM_SCATTER = "prenorm_linear_act_topk_renorm_scatter"
    PRENORM_LINEAR_TOPK_SCATTER_ACT = "prenorm_linear_topk_scatter_act"


def _router_activation(
    activation: str | Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> torch.Tensor:
    if callable(activation):
        return activation(x)
    if activation == "softmax":
        return torch.softmax(x, dim=-1)
    if activation == "sigmoid":
        return torch.sigmoid(x)
    raise ValueError(f"Unsupported activation function: {activation}. Use 'softmax' or 'sigmoid'.")


def _rms(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * gamma.to(torch.float32).reshape(-1)).to(dtype)


def router(
    hidden_states: torch.Tensor,
    router_weights: torch.Tensor,
    top_k: int,
    router_bias: torch.Tensor | None = None,
    activation: str | Callable[[torch.Tensor], torch.Tensor] = "softmax",
    return_logits: bool = False,
    gamma: torch.Tensor | None = None,
    eps: float = 1e-6,
    computation_dtype: torch.dtype = torch.float32,
    router_computation_order: RouterComputationOrder = RouterComputationOrder.PRENORM_LINEAR_TOPK_ACT_SCATTER,
    shard_on_tokens: bool | None = None,
    transposed_hidden_states: bool = False,
    **kernel_only: Any,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Expert affinities ``[T, E]`` (zeros for experts not selected).

    Orders: TOPK_ACT_SCATTER (default) applies the activation to the top-k
    logits only (softmax there renormalizes over the selected experts);
    ACT_TOPK_RENORM_SCATTER activates all logits, picks the top k and
    L1-renormalizes them; TOPK_SCATTER_ACT scatters the top-k logits into
    ``-inf`` and activates the whole row.
    """
    kernel_phases.record("router")
    refuse_bools("router", top_k=top_k)
    ROUTER_OPTIONS.check(kernel_only)
    if hidden_states.dim() != 2:
        raise ValueError(f"Expected hidden_states to be 2D [T, H], got shape {tuple(hidden_states.shape)}")
    if router_weights.dim() != 2:
        raise ValueError(f"Expected router_weights to be 2D [H, E], got shape {tuple(router_weights.shape)}")
    x = hidden_states.T if transposed_hidden_states else hidden_states
    tokens, hidden = x.shape
    hidden_w, experts = router_weights.shape
    if hidden != hidden_w:
        raise ValueError(
            f"Hidden dimension mismatch: hidden_states has {hidden}, router_weights has {hidden_w}"
        )
    if router_bias is not None and tuple(router_bias.shape) != (experts,):
        raise KernelConstraintError(
            f"NF.router: Expected router_bias shape [E] = [{experts}], got {tuple(router_bias.shape)}"
        )
    if gamma is not None and tuple(gamma.shape) != (hidden,):
        raise ValueError(f"Expected gamma shape [H], got {tuple(gamma.shape)}")
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k must be between 1 and {experts}, got {top_k}")
    if not isinstance(router_computation_order, RouterComputationOrder):
        raise ValueError(
            f"router_computation_order must be a RouterComputationOrder, got {type(router_computation_order)}"
        )
    if gamma is not None:
        x = _rms(x, gamma, eps)
    logits = F.linear(
        x.to(computation_dtype),
        router_weights.T.to(computation_dtype),
        None if router_bias is None else router_bias.to(computation_dtype),
    )
    order = router_computation_order
    if order is RouterComputationOrder.PRENORM_LINEAR_TOPK_ACT_SCATTER:
        values, indices = torch.topk(logits, top_k, dim=-1)
        values = _router_activation(activation, values)
        affinities = torch.zeros(tokens, experts, dtype=computation_dtype, device=x.device)
        affinities.scatter_(1, indices, values.to(computation_dtype))
    elif order is RouterComputationOrder.PRENORM_LINEAR_ACT_TOPK_RENORM_SCATTER:
        probs = _router_activation(activation, logits)
        values, indices = torch.topk(probs, top_k, dim=-1)
        values = values / values.sum(dim=-1, keepdim=True)
        affinities = torch.zeros(tokens, experts, dtype=computation_dtype, device=x.device)
        affinities.scatter_(1, indices, values.to(computation_dtype))
    else:
        values, indices = torch.topk(logits, top_k, dim=-1)
        sparse = torch.full((tokens, experts), float("-inf"), dtype=computation_dtype, device=x.device)
        sparse.scatter_(1, indices, values)
        affinities = _router_activation(activation, sparse)
    if return_logits:
        return affinities, logits
    return affinities


def get_local_expert_affinities(
    expert_affinities: torch.Tensor, local_expert_indices: torch.Tensor
) -> torch.Tensor:
    """Columns of this rank's experts: ``[T, E_global]`` -> ``[T, E_local]``."""
    kernel_phases.record("get_local_expert_affinities")
    if expert_affinities.dim() != 2:
        raise ValueError(f"expert_affinities must be [T, E], got {tuple(expert_affinities.shape)}")
    indices = local_expert_indices.reshape(-1).to(torch.long)
    if indices.numel() == 0 or int(indices.max()) >= expert_affinities.shape[1] or int(indices.min()) < 0:
        raise ValueError(
            f"local_expert_indices {indices.tolist()} out of range for {expert_affinities.shape[1]} experts"
        )
    return expert_affinities.index_select(1, indices)


def build_blockwise_mapping(
    expert_affinities: torch.Tensor,
    num_local_experts: int,
    num_experts_per_token: int,
    block_size: int,
    moe_group: Any = None,
    tp_degree: int = 1,
    padding_mask: torch.Tensor | None = None,
    rank: torch.Tensor | int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Blockwise token-to-expert mapping for ``moe_cte``.

    ``expert_affinities [T, E_local]`` (zeros for experts not selected) ->
    ``(expert_affinities_masked [T * E_local, 1], token_position_to_id
    [N * block_size] int32 (-1 for padding slots), block_to_expert [N] int32,
    conditions [N] int32 (1 when the block holds a token))``. Each expert's
    tokens fill ``ceil(count / block_size)`` consecutive blocks, experts in
    order; ``N`` is the kernel's static upper bound on the block count.
    Padding tokens (``padding_mask`` False) get zero affinity.

    The device path shards the mapping's construction over ``moe_group``
    (``tp_degree`` ranks) and combines it; every rank ends with the same
    mapping, which is what this stand-in computes directly. ``rank`` (the
    runner's rank tensor, passed so the rank is a runtime input rather than a
    compiled-in constant) picks the rank's share of that construction and
    does not change the mapping; it must be a whole number when given.
    """
    kernel_phases.record("build_blockwise_mapping")
    refuse_bools(
        "build_blockwise_mapping",
        num_local_experts=num_local_experts,
        num_experts_per_token=num_experts_per_token,
        block_size=block_size,
        tp_degree=tp_degree,
    )
    if rank is not None and (
        isinstance(rank, torch.Tensor) and rank.is_floating_point() or isinstance(rank, float)
    ):
        raise KernelConstraintError(f"NF.build_blockwise_mapping: rank must be an integer rank, got {rank!r}")
    if expert_affinities.dim() != 2 or expert_affinities.shape[1] != num_local_experts:
        raise KernelConstraintError(
            f"NF.build_blockwise_mapping: expert_affinities must be [T, {num_local_experts}] "
            f"(this rank's experts), got {tuple(expert_affinities.shape)}"
        )
    tokens = expert_affinities.shape[0]
    device = expert_affinities.device
    affinities = expert_affinities
    if padding_mask is not None:
        if tuple(padding_mask.shape) != (tokens,):
            raise KernelConstraintError(
                f"NF.build_blockwise_mapping: padding_mask must be [{tokens}], got {tuple(padding_mask.shape)}"
            )
        affinities = affinities * padding_mask.to(affinities.dtype).unsqueeze(1)
    selected = expert_affinities != 0
    per_expert = selected.sum(dim=0).to(torch.long)
    blocks_per_expert = (per_expert + block_size - 1) // block_size
    routed = tokens * min(num_experts_per_token, num_local_experts)
    num_blocks = math.ceil((routed - (num_local_experts - 1)) / block_size) + num_local_experts - 1
    num_blocks = max(1, min(num_blocks, routed))
    needed = int(blocks_per_expert.sum())
    if needed > num_blocks:
        raise KernelConstraintError(
            f"NF.build_blockwise_mapping: the routing needs {needed} blocks but the kernel bound is "
            f"{num_blocks}: a token selects more than num_experts_per_token={num_experts_per_token} experts"
        )
    token_position_to_id = torch.full((num_blocks * block_size,), -1, dtype=torch.int32, device=device)
    block_to_expert = torch.full((num_blocks,), num_local_experts - 1, dtype=torch.int32, device=device)
    block = 0
    for expert in range(num_local_experts):
        ids = torch.nonzero(selected[:, expert], as_tuple=False).reshape(-1)
        count = int(blocks_per_expert[expert])
        if count:
            start = block * block_size
            token_position_to_id[start : start + ids.numel()] = ids.to(torch.int32)
            block_to_expert[block : block + count] = expert
        block += count
    if block < num_blocks and block > 0:
        # trailing padding blocks keep the last used expert (no weight reload)
        block_to_expert[block:] = block_to_expert[block - 1]
    conditions = (token_position_to_id.view(num_blocks, block_size) != -1).any(dim=1).to(torch.int32)
    return affinities.reshape(-1, 1), token_position_to_id, block_to_expert, conditions


def _expert_activation(gate: torch.Tensor, act: Any, op: str) -> torch.Tensor:
    if act in (ActFnType.SiLU, "silu"):
        return F.silu(gate)
    if act in (ActFnType.GELU, "gelu"):
        return F.gelu(gate)
    if act in (ActFnType.Swish, "swish"):
        return gate * torch.sigmoid(gate * SWIGLU_ALPHA)
    raise NotImplementedError(f"NF.{op}: activation {act!r} is not in the CPU stand-in")


def _expert_mlp(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    gate_up_bias: torch.Tensor | None,
    down_bias: torch.Tensor | None,
    act: Any,
    clamps: tuple[float | None, float | None, float | None, float | None],
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
    inner = (_expert_activation(gate, act, op) * up).to(compute)
    out = inner.to(torch.float32) @ down.to(compute).to(torch.float32)
    if down_bias is not None:
        out = out + down_bias.to(torch.float32).reshape(-1)
    return out


def _check_expert_weights(
    gate_up: torch.Tensor, down: torch.Tensor, hidden: int, op: str, names: tuple[str, str]
) -> tuple[int, int]:
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


def moe_cte(
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    gate_up_proj_weight: torch.Tensor,
    down_proj_weight: torch.Tensor,
    token_position_to_id: torch.Tensor,
    block_to_expert: torch.Tensor,
    block_size: int,
    implementation: Any = None,
    conditions: torch.Tensor | None = None,
    gate_and_up_proj_bias: torch.Tensor | None = None,
    down_proj_bias: torch.Tensor | None = None,
    gate_up_proj_scale: torch.Tensor | None = None,
    down_proj_scale: torch.Tensor | None = None,
    activation_function: Any = ActFnType.SiLU,
    skip_token: bool = False,
    skip_weight: bool = False,
    compute_dtype: Any = None,
    is_tensor_update_accumulating: bool = True,
    expert_affinities_scaling_mode: Any = ExpertAffinityScaleMode.POST_SCALE,
    gate_clamp_upper_limit: float | None = None,
    gate_clamp_lower_limit: float | None = None,
    up_clamp_upper_limit: float | None = None,
    up_clamp_lower_limit: float | None = None,
    **options: Any,
) -> torch.Tensor:
    """Blockwise expert MLPs for prefill -> ``[T, H]`` in the input dtype.

    ``hidden_states [T, H]`` (or ``[T+1, H]``); ``expert_affinities_masked
    [T * E, 1]``; ``gate_up_proj_weight [E, H, 2, I]``; ``down_proj_weight
    [E, I, H]``; ``token_position_to_id [N * block_size]`` int32;
    ``block_to_expert [N]`` (or ``[N, 1]``) int32; biases ``[E, 2, I]`` and
    ``[E, H]``. Each token of block ``n`` goes through expert
    ``block_to_expert[n]``; its output is scaled by the affinity (POST_SCALE,
    or before the down projection for PRE_SCALE_DELAYED) and accumulated
    into the token's row (``is_tensor_update_accumulating``; without it a
    block's rows are overwritten, so a token keeps one expert's output).
    Blocks whose ``conditions`` entry is 0 are not computed; -1 slots and
    blocks are skipped with ``skip_token`` / ``skip_weight`` and refused
    without them; the expert matmuls take their inputs in ``compute_dtype``
    (default: the hidden states' dtype).
    """
    kernel_phases.record("moe_cte")
    refuse_bools("moe_cte", block_size=block_size)
    MOE_CTE_OPTIONS.check(options)
    if not isinstance(implementation, MoECTEImplementation):
        raise KernelConstraintError(
            f"NF.moe_cte: implementation must be a MoECTEImplementation, got {implementation!r}"
        )
    if implementation.value.endswith(("_mx", "_mx_hybrid")):
        raise NotImplementedError(
            f"NF.moe_cte: {implementation.value} (MX quantized) is not in the CPU stand-in"
        )
    if gate_up_proj_scale is not None or down_proj_scale is not None:
        raise NotImplementedError("NF.moe_cte: quantized experts are not in the CPU stand-in")
    if hidden_states.dim() != 2:
        raise KernelConstraintError(
            f"NF.moe_cte: hidden_states must be [T, H], got {tuple(hidden_states.shape)}"
        )
    hidden = hidden_states.shape[1]
    experts, inter = _check_expert_weights(
        gate_up_proj_weight, down_proj_weight, hidden, "moe_cte", ("gate_up_proj_weight", "down_proj_weight")
    )
    if (gate_and_up_proj_bias is None) != (down_proj_bias is None):
        raise KernelConstraintError("NF.moe_cte: gate_and_up_proj_bias and down_proj_bias go together")
    if gate_and_up_proj_bias is not None and tuple(gate_and_up_proj_bias.shape) != (experts, 2, inter):
        raise KernelConstraintError(
            f"NF.moe_cte: gate_and_up_proj_bias must be [E, 2, I] = [{experts}, 2, {inter}], "
            f"got {tuple(gate_and_up_proj_bias.shape)}"
        )
    if down_proj_bias is not None and tuple(down_proj_bias.shape) not in (
        (experts, hidden),
        (experts, 1, hidden),
    ):
        raise KernelConstraintError(
            f"NF.moe_cte: down_proj_bias must be [E, H] = [{experts}, {hidden}], got {tuple(down_proj_bias.shape)}"
        )
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
    affinities = expert_affinities_masked.reshape(-1)
    if affinities.numel() % experts != 0:
        raise KernelConstraintError(
            f"NF.moe_cte: expert_affinities_masked has {affinities.numel()} entries, not T * E (E = {experts})"
        )
    tokens = affinities.numel() // experts
    if hidden_states.shape[0] not in (tokens, tokens + 1):
        raise KernelConstraintError(
            f"NF.moe_cte: hidden_states has {hidden_states.shape[0]} rows for {tokens} tokens"
        )
    affinities = affinities.reshape(tokens, experts).to(torch.float32)
    mode = expert_affinities_scaling_mode
    if mode not in (
        ExpertAffinityScaleMode.POST_SCALE,
        getattr(ExpertAffinityScaleMode, "PRE_SCALE_DELAYED", None),
    ):
        raise NotImplementedError(
            f"NF.moe_cte: expert_affinities_scaling_mode {mode} is not in the CPU stand-in"
        )
    active = _active_blocks(conditions, num_blocks)
    _check_skips(positions, block_expert, skip_token, skip_weight)
    compute = _compute_dtype(compute_dtype, hidden_states.dtype)
    clamps = (gate_clamp_upper_limit, gate_clamp_lower_limit, up_clamp_upper_limit, up_clamp_lower_limit)
    output = torch.zeros(tokens, hidden, dtype=torch.float32, device=hidden_states.device)
    for block in range(num_blocks):
        ids = positions[block * block_size : (block + 1) * block_size].to(torch.long)
        ids = ids[(ids >= 0) & (ids < tokens)]  # -1 skipped; T: the zero padding row
        expert = int(block_expert[block])
        if ids.numel() == 0 or not active[block] or expert < 0:
            continue
        out = _expert_mlp(
            hidden_states[ids],
            gate_up_proj_weight[expert],
            down_proj_weight[expert],
            None if gate_and_up_proj_bias is None else gate_and_up_proj_bias[expert],
            None if down_proj_bias is None else down_proj_bias[expert],
            activation_function,
            clamps,
            "moe_cte",
            compute,
        )
        weighted = out * affinities[ids, expert].unsqueeze(1)
        if is_tensor_update_accumulating:
            output.index_add_(0, ids, weighted)
        else:  # each block writes its tokens' rows: a token keeps its last expert's output
            output[ids] = weighted
    return output.to(hidden_states.dtype)


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


def moe_block_tkg(
    inp: torch.Tensor,
    gamma: torch.Tensor,
    router_weights: torch.Tensor,
    expert_gate_up_weights: torch.Tensor,
    expert_down_weights: torch.Tensor,
    rank_id: torch.Tensor | None = None,
    top_k: int = 1,
    shared_expert_gate_w: torch.Tensor | None = None,
    shared_expert_up_w: torch.Tensor | None = None,
    shared_expert_down_w: torch.Tensor | None = None,
    expert_gate_up_weights_scale: torch.Tensor | None = None,
    expert_down_weights_scale: torch.Tensor | None = None,
    router_bias: torch.Tensor | None = None,
    expert_gate_up_bias: torch.Tensor | None = None,
    expert_down_bias: torch.Tensor | None = None,
    eps: float = 1e-6,
    router_act_fn: Any = RouterActFnType.SIGMOID,
    router_pre_norm: bool = True,
    norm_topk_prob: bool = False,
    expert_affinities_scaling_mode: Any = ExpertAffinityScaleMode.NO_SCALE,
    hidden_act_fn: Any = ActFnType.SiLU,
    gate_clamp_upper_limit: float | None = None,
    gate_clamp_lower_limit: float | None = None,
    up_clamp_upper_limit: float | None = None,
    up_clamp_lower_limit: float | None = None,
    router_mm_dtype: Any = None,
    hidden_actual: int | None = None,
    skip_router_logits: bool = False,
    is_all_expert: bool = False,
    residual: torch.Tensor | None = None,
    **options: Any,
) -> Any:
    """Fused decode MoE block: RMSNorm(``gamma [1, H]``) -> router
    (``router_weights [H, E]`` in float32, ``router_bias [1, E]``) -> top-k
    (activation before the top-k with ``router_pre_norm``, after it
    otherwise; optional renormalization) -> the local experts
    (``expert_gate_up_weights [E_L, H, 2, I]``, ``expert_down_weights
    [E_L, I, H]``, biases ``[E_L, 2, I]`` / ``[E_L, H]``) weighted by their
    affinities (POST_SCALE) or by 1 (NO_SCALE).

    ``inp`` is ``[B, S, H]`` or ``[T, H]``; returns ``[T, H]`` (and the
    ``[T, E]`` router logits unless ``skip_router_logits``). With fewer local
    than global experts, ``rank_id [1, 1]`` int32 names the rank owning
    experts ``[E_L * rank_id, E_L * (rank_id + 1))``.
    """
    kernel_phases.record("moe_block_tkg")
    refuse_bools("moe_block_tkg", top_k=top_k, hidden_actual=hidden_actual)
    MOE_BLOCK_TKG_OPTIONS.check(options)
    if any(w is not None for w in (shared_expert_gate_w, shared_expert_up_w, shared_expert_down_w)):
        raise NotImplementedError("NF.moe_block_tkg: fused shared experts are not in the CPU stand-in")
    if expert_gate_up_weights_scale is not None or expert_down_weights_scale is not None:
        raise NotImplementedError("NF.moe_block_tkg: quantized experts are not in the CPU stand-in")
    if residual is not None:
        raise NotImplementedError("NF.moe_block_tkg: the fused residual add is not in the CPU stand-in")
    x = inp.reshape(-1, inp.shape[-1]) if inp.dim() == 3 else inp
    if x.dim() != 2:
        raise KernelConstraintError(
            f"NF.moe_block_tkg: inp must be [B, S, H] or [T, H], got {tuple(inp.shape)}"
        )
    tokens, hidden = x.shape
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
    experts_local, inter = _check_expert_weights(
        expert_gate_up_weights,
        expert_down_weights,
        hidden,
        "moe_block_tkg",
        ("expert_gate_up_weights", "expert_down_weights"),
    )
    if expert_gate_up_bias is not None and tuple(expert_gate_up_bias.shape) != (experts_local, 2, inter):
        raise KernelConstraintError(
            f"NF.moe_block_tkg: expert_gate_up_bias must be [E_L, 2, I] = [{experts_local}, 2, {inter}], "
            f"got {tuple(expert_gate_up_bias.shape)}"
        )
    if expert_down_bias is not None and tuple(expert_down_bias.shape) != (experts_local, hidden):
        raise KernelConstraintError(
            f"NF.moe_block_tkg: expert_down_bias must be [E_L, H] = [{experts_local}, {hidden}], "
            f"got {tuple(expert_down_bias.shape)}"
        )
    start = 0
    if experts_local < experts_global:
        if rank_id is None:
            raise KernelConstraintError("NF.moe_block_tkg: rank_id [1, 1] is required with local experts")
        if rank_id.dtype != torch.int32 or tuple(rank_id.shape) != (1, 1):
            raise KernelConstraintError(
                f"NF.moe_block_tkg: rank_id must be an int32 [1, 1] tensor, got {rank_id.dtype} {tuple(rank_id.shape)}"
            )
        start = experts_local * int(rank_id.reshape(-1)[0])
    if is_all_expert and rank_id is None:
        raise KernelConstraintError("NF.moe_block_tkg: is_all_expert needs rank_id")

    eps_hidden = hidden if hidden_actual is None else hidden_actual
    x32 = x.to(torch.float32)
    normed = x32.clone()
    variance = x32[:, :eps_hidden].pow(2).mean(-1, keepdim=True)
    normed[:, :eps_hidden] = normed[:, :eps_hidden] * torch.rsqrt(variance + eps)
    normed = (gamma.reshape(-1).to(torch.float32) * normed).to(x.dtype)
    normed[:, eps_hidden:] = 0

    # the router matmul takes its inputs in router_mm_dtype (float32 unless
    # given) and accumulates in float32
    mm_dtype = router_mm_dtype if isinstance(router_mm_dtype, torch.dtype) else torch.float32
    logits = normed.to(mm_dtype).to(torch.float32) @ router_weights.to(mm_dtype).to(torch.float32)
    if router_bias is not None:
        logits = logits + router_bias.reshape(-1).to(torch.float32)
    act = "softmax" if router_act_fn in (RouterActFnType.SOFTMAX, "softmax") else "sigmoid"
    if router_act_fn not in (RouterActFnType.SOFTMAX, RouterActFnType.SIGMOID, "softmax", "sigmoid"):
        raise NotImplementedError(
            f"NF.moe_block_tkg: router activation {router_act_fn} is not in the CPU stand-in"
        )
    if router_pre_norm:
        values, indices = torch.topk(_router_activation(act, logits), top_k, dim=-1)
    else:
        values, indices = torch.topk(logits, top_k, dim=-1)
        values = _router_activation(act, values)
    if norm_topk_prob:
        values = values / (values.sum(dim=-1, keepdim=True) + 1e-20)
    dense = torch.zeros(tokens, experts_global, dtype=torch.float32, device=x.device)
    dense.scatter_(1, indices, values.to(torch.float32))
    local = dense[:, start : start + experts_local]
    if expert_affinities_scaling_mode == ExpertAffinityScaleMode.NO_SCALE:
        local = (local > 0).to(torch.float32)
    elif expert_affinities_scaling_mode != ExpertAffinityScaleMode.POST_SCALE:
        raise NotImplementedError(
            f"NF.moe_block_tkg: expert_affinities_scaling_mode {expert_affinities_scaling_mode} is not in the CPU stand-in"
        )
    clamps = (gate_clamp_upper_limit, gate_clamp_lower_limit, up_clamp_upper_limit, up_clamp_lower_limit)
    output = torch.zeros(tokens, hidden, dtype=torch.float32, device=x.device)
    for expert in range(experts_local):
        weight = local[:, expert]
        rows = torch.nonzero(weight, as_tuple=False).reshape(-1)
        if rows.numel() == 0:
            continue
        out = _expert_mlp(
            normed[rows],
            expert_gate_up_weights[expert],
            expert_down_weights[expert],
            None if expert_gate_up_bias is None else expert_gate_up_bias[expert],
            None if expert_down_bias is None else expert_down_bias[expert],
            hidden_act_fn,
            clamps,
            "moe_block_tkg",
        )
        output.index_add_(0, rows, out * weight[rows].unsqueeze(1))
    output = output.to(x.dtype)
    if skip_router_logits:
        return output
    return output, logits
