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

``moe_cte`` and ``moe_block_tkg`` hand their arguments to their computation
in ``moe_blockwise`` and ``moe_decode_block``; ``moe_math`` holds what the
kernels share (the router activation, one expert's MLP).

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

from . import kernel_phases, nki_language
from .common_types import ActFnType, ExpertAffinityScaleMode, RouterActFnType
from .kernel_options import KernelOptions, refuse_bools
from .moe_blockwise import CteCall, MoECTEImplementation, run_moe_cte
from .moe_decode_block import BlockTkgCall, run_moe_block_tkg
from .moe_math import SWIGLU_ALPHA, router_activation
from .numerics import KernelConstraintError

__all__ = ["SWIGLU_ALPHA", "MoECTEImplementation", "RouterComputationOrder"]

# keyword arguments beyond the explicit parameters: none is modelled
ROUTER_OPTIONS = KernelOptions("router")
MOE_CTE_OPTIONS = KernelOptions("moe_cte")
MOE_BLOCK_TKG_OPTIONS = KernelOptions("moe_block_tkg")


class RouterComputationOrder(enum.Enum):
    """Order of the router's steps (``vllm_neuron.functional.moe.router``)."""

    PRENORM_LINEAR_TOPK_ACT_SCATTER = "prenorm_linear_topk_act_scatter"
    PRENORM_LINEAR_ACT_TOPK_RENORM_SCATTER = "prenorm_linear_act_topk_renorm_scatter"
    PRENORM_LINEAR_TOPK_SCATTER_ACT = "prenorm_linear_topk_scatter_act"


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
    x = hidden_states.T if transposed_hidden_states else hidden_states
    _check_router_inputs(
        hidden_states, x, router_weights, top_k, router_bias, gamma, router_computation_order
    )
    if gamma is not None:
        x = _rms(x, gamma, eps)
    logits = F.linear(
        x.to(computation_dtype),
        router_weights.T.to(computation_dtype),
        None if router_bias is None else router_bias.to(computation_dtype),
    )
    affinities = _route_in_order(router_computation_order, logits, activation, top_k)
    if return_logits:
        return affinities, logits
    return affinities


def _check_router_inputs(
    hidden_states: torch.Tensor,
    x: torch.Tensor,
    router_weights: torch.Tensor,
    top_k: int,
    router_bias: torch.Tensor | None,
    gamma: torch.Tensor | None,
    order: Any,
) -> None:
    """``NF.router``'s shape checks (``x``: the hidden states ``[T, H]``)."""
    if hidden_states.dim() != 2:
        raise ValueError(f"Expected hidden_states to be 2D [T, H], got shape {tuple(hidden_states.shape)}")
    if router_weights.dim() != 2:
        raise ValueError(f"Expected router_weights to be 2D [H, E], got shape {tuple(router_weights.shape)}")
    hidden = x.shape[1]
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
    if not isinstance(order, RouterComputationOrder):
        raise ValueError(f"router_computation_order must be a RouterComputationOrder, got {type(order)}")


def _route_in_order(
    order: RouterComputationOrder,
    logits: torch.Tensor,
    activation: str | Callable[[torch.Tensor], torch.Tensor],
    top_k: int,
) -> torch.Tensor:
    """The router's top-k and activation in ``order``: affinities ``[T, E]``
    in the logits' dtype, zero for the experts not chosen."""
    tokens, experts = logits.shape
    affinities = torch.zeros(tokens, experts, dtype=logits.dtype, device=logits.device)
    if order is RouterComputationOrder.PRENORM_LINEAR_TOPK_ACT_SCATTER:
        values, indices = torch.topk(logits, top_k, dim=-1)
        values = router_activation(activation, values)
        return affinities.scatter_(1, indices, values.to(logits.dtype))
    if order is RouterComputationOrder.PRENORM_LINEAR_ACT_TOPK_RENORM_SCATTER:
        probs = router_activation(activation, logits)
        values, indices = torch.topk(probs, top_k, dim=-1)
        values = values / values.sum(dim=-1, keepdim=True)
        return affinities.scatter_(1, indices, values.to(logits.dtype))
    values, indices = torch.topk(logits, top_k, dim=-1)
    sparse = torch.full((tokens, experts), float("-inf"), dtype=logits.dtype, device=logits.device)
    sparse.scatter_(1, indices, values)
    return router_activation(activation, sparse)


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
    _check_mapping_inputs(expert_affinities, num_local_experts, padding_mask, rank)
    tokens = expert_affinities.shape[0]
    affinities = expert_affinities
    if padding_mask is not None:
        affinities = affinities * padding_mask.to(affinities.dtype).unsqueeze(1)
    selected = expert_affinities != 0
    per_expert = selected.sum(dim=0).to(torch.long)
    blocks_per_expert = (per_expert + block_size - 1) // block_size
    num_blocks = _block_bound(tokens, num_local_experts, num_experts_per_token, block_size)
    needed = int(blocks_per_expert.sum())
    if needed > num_blocks:
        raise KernelConstraintError(
            f"NF.build_blockwise_mapping: the routing needs {needed} blocks but the kernel bound is "
            f"{num_blocks}: a token selects more than num_experts_per_token={num_experts_per_token} experts"
        )
    token_position_to_id, block_to_expert = _fill_blocks(selected, blocks_per_expert, num_blocks, block_size)
    conditions = (token_position_to_id.view(num_blocks, block_size) != -1).any(dim=1).to(torch.int32)
    return affinities.reshape(-1, 1), token_position_to_id, block_to_expert, conditions


def _check_mapping_inputs(
    expert_affinities: torch.Tensor,
    num_local_experts: int,
    padding_mask: torch.Tensor | None,
    rank: torch.Tensor | int | None,
) -> None:
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
    if padding_mask is not None and tuple(padding_mask.shape) != (tokens,):
        raise KernelConstraintError(
            f"NF.build_blockwise_mapping: padding_mask must be [{tokens}], got {tuple(padding_mask.shape)}"
        )


def _block_bound(tokens: int, num_local_experts: int, num_experts_per_token: int, block_size: int) -> int:
    """The kernel's static upper bound on the number of blocks."""
    routed = tokens * min(num_experts_per_token, num_local_experts)
    num_blocks = math.ceil((routed - (num_local_experts - 1)) / block_size) + num_local_experts - 1
    return max(1, min(num_blocks, routed))


def _fill_blocks(
    selected: torch.Tensor, blocks_per_expert: torch.Tensor, num_blocks: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each expert's tokens (``selected [T, E]``) in ``ceil(count /
    block_size)`` consecutive blocks, experts in order: ``(token_position_to_id
    [N * block_size]`` (-1 padding), ``block_to_expert [N])``, int32."""
    num_local_experts, device = selected.shape[1], selected.device
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
    return token_position_to_id, block_to_expert


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
    compute_dtype: Any = nki_language.bfloat16,
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
    ``block_to_expert[n]``; its output is scaled by the affinity
    (POST_SCALE), or its input rows are, in ``compute_dtype``, before the
    gate/up projection and its output is not (PRE_SCALE); any other mode
    (NO_SCALE, PRE_SCALE_DELAYED) is refused; the results are accumulated
    into the token's row (``is_tensor_update_accumulating``; without it a
    block's rows are overwritten, so a token keeps one expert's output).
    Blocks whose ``conditions`` entry is 0 are not computed; -1 slots and
    blocks are skipped with ``skip_token`` / ``skip_weight`` and refused
    without them; the expert matmuls take their inputs in ``compute_dtype``
    (default ``nl.bfloat16``, the kernel's documented default, whatever the
    hidden states' dtype; None: the hidden states' dtype).
    """
    kernel_phases.record("moe_cte")
    refuse_bools("moe_cte", block_size=block_size)
    MOE_CTE_OPTIONS.check(options)
    arguments = {name: value for name, value in locals().items() if name != "options"}
    return run_moe_cte(CteCall(**arguments))


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
    experts ``[E_L * rank_id, E_L * (rank_id + 1))``, in the all-expert mode
    (``is_all_expert``) only: the selective-expert mode indexes the weights
    by global expert id and is refused with fewer local than global experts.
    """
    kernel_phases.record("moe_block_tkg")
    refuse_bools("moe_block_tkg", top_k=top_k, hidden_actual=hidden_actual)
    MOE_BLOCK_TKG_OPTIONS.check(options)
    arguments = {name: value for name, value in locals().items() if name != "options"}
    return run_moe_block_tkg(BlockTkgCall(**arguments))
