# SPDX-License-Identifier: Apache-2.0
"""
Qwen3-MoE for the vLLM Neuron backend (bf16)
============================================

autoport-cst reference model ``qwen3_moe``: a decoder whose feed-forward
blocks are mixtures of experts that fit in tensor parallelism. Grouped-query
attention with a per-head RMSNorm of queries and keys before rotary position
embedding; a float32 softmax router choosing the top-k of E SiLU-gated
experts, with the top-k weights renormalized when the config says so; RMSNorm
everywhere.

Supported parallelism: TP (every rank holds every expert, with its slice of
the expert intermediate dimension), with sequence-parallel (SP) hidden states
between layers during prefill.

Paths:
  prefill  attention: NF.qkv_proj -> QK-norm -> RoPE -> paged KV-cache write
           -> NF.flash_attention -> NF.o_proj
           experts:   RMSNorm -> NF.router -> NF.build_blockwise_mapping -> NF.moe_cte
  decode   attention: NF.attention_decode (fused QKV, QK-norm, RoPE, paged
           attention, cache write, O projection)
           experts:   NF.moe_block_tkg (fused RMSNorm, router, top-k, experts)

ANNOTATION GUIDE (codemods anchor on these markers; keep them when editing):
  # >>> PARALLELISM: <what> <<<    parallelism plumbing, kept across ports
  # <-- MODEL-SPECIFIC: <what>     what changes when porting another architecture
"""

import math
from typing import NamedTuple

import nki.language as nl
import torch
from nkilib.core.moe.moe_cte.moe_cte import MoECTEImplementation
from nkilib.core.utils.common_types import ActFnType, ExpertAffinityScaleMode, RouterActFnType
from torch import nn
from transformers import PretrainedConfig
from vllm.distributed.parallel_state import get_tp_group

import vllm_neuron.functional as NF
import vllm_neuron.nn as neuron_nn
from vllm_neuron.model.kv_cache import KVSpec, LayerSpec
from vllm_neuron.model.neuron_config import NeuronConfig
from vllm_neuron.nn.embedding import VocabDimShardedEmbedding
from vllm_neuron.nn.sampler import Sampler
from vllm_neuron.utils.checkpoints import SafetensorsCheckpoint
from vllm_neuron.utils.weight_loader import (
    SafetensorsWeightLoader,
    fused_qkv_weight_loader,
    set_weight_loader,
    sharding_weight_loader,
)

from .config import Qwen3MoeConfig


def _is_prefill(attn_metadata, layer_name: str = "layers.0.self_attn") -> bool:
    """Prefill when the step has more query tokens than the decode threshold."""
    if attn_metadata is None:
        return False
    meta = attn_metadata[layer_name]
    return meta["max_query_len"] > meta["decode_token_threshold"]


# =============================================================================
# Section 1: RMS Normalization
# <-- MODEL-SPECIFIC: Qwen3-MoE uses RMSNorm (no mean subtraction, no bias)
# =============================================================================


class Qwen3MoeRMSNorm(nn.Module):
    """RMSNorm computed in float32, cast back to the input dtype."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)


# =============================================================================
# Section 2: Rotary Position Embedding
# <-- MODEL-SPECIFIC: rotate-half RoPE with optional Llama 3 frequency scaling
# =============================================================================


def _apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + d/2) of the last dimension."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [Nq, T, Dh], k: [Nkv, T, Dh], cos/sin: [T, Dh]."""
    cos = cos.unsqueeze(0)
    sin = sin.unsqueeze(0)
    return _apply_rotary_emb(q, cos, sin), _apply_rotary_emb(k, cos, sin)


class Qwen3MoeRotaryEmbedding(nn.Module):
    """cos/sin tables for the step's positions.

    ``__init__`` keeps Python scalars only: the model is built on the meta
    device, so a tensor computed here would never hold data. The inverse
    frequencies are computed in ``forward`` on the input's device.
    """

    def __init__(self, config: Qwen3MoeConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.rope_theta = float(config.rope_theta)
        scaling = dict(config.rope_scaling or {})
        self.rope_type = scaling.get("rope_type", scaling.get("type")) or "default"
        # <-- MODEL-SPECIFIC: RoPE variants this model implements
        if self.rope_type not in ("default", "llama3"):
            raise NotImplementedError(f"rope_type {self.rope_type!r} is not supported")
        self.scaling_factor = float(scaling.get("factor", 1.0))
        self.low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
        self.high_freq_factor = float(scaling.get("high_freq_factor", 1.0))
        self.original_max_position_embeddings = int(
            scaling.get("original_max_position_embeddings", 8192)
        )

    def _compute_inv_freq(self, device: torch.device) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device)
        inv_freq = 1.0 / (self.rope_theta ** (exponents.to(torch.float32) / self.head_dim))
        if self.rope_type == "llama3":
            inv_freq = self._apply_llama3_scaling(inv_freq)
        return inv_freq

    def _apply_llama3_scaling(self, inv_freq: torch.Tensor) -> torch.Tensor:
        """Long wavelengths are slowed by ``factor``, short ones kept, and the
        band between them interpolated."""
        original = self.original_max_position_embeddings
        low_freq_wavelen = original / self.low_freq_factor
        high_freq_wavelen = original / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        slowed = torch.where(wavelen > low_freq_wavelen, inv_freq / self.scaling_factor, inv_freq)
        if self.high_freq_factor == self.low_freq_factor:
            return slowed
        smooth = (original / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        blended = (1 - smooth) * slowed / self.scaling_factor + smooth * slowed
        in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(in_band, blended, slowed)

    def forward(
        self, position_ids: torch.Tensor, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self._compute_inv_freq(device)
        freqs = torch.outer(position_ids.to(torch.float32), inv_freq)  # [T, Dh/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, Dh]
        return emb.cos().to(dtype), emb.sin().to(dtype)


# =============================================================================
# Section 3: Attention
# Mixed: PARALLELISM (head sharding, SP gather/scatter, collectives) +
#        MODEL-SPECIFIC (GQA, per-head QK RMSNorm, rotate-half RoPE)
# =============================================================================


class Qwen3MoeAttention(nn.Module):
    """Grouped-query attention with per-head QK-norm, TP head sharding and a
    paged KV cache."""

    def __init__(self, config: Qwen3MoeConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.layer_name = f"layers.{layer_idx}.self_attn"
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size
        self.head_dim = config.head_dim
        self.num_attention_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.scaling = self.head_dim**-0.5

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group

        # >>> PARALLELISM: Head sharding calculation <<<
        self.num_attention_heads_per_rank = self.num_attention_heads // self.world_size
        if self.world_size >= self.num_key_value_heads:
            self.num_key_value_heads_per_rank = 1
            self.num_kv_replicas = self.world_size // self.num_key_value_heads
        else:
            self.num_key_value_heads_per_rank = self.num_key_value_heads // self.world_size
            self.num_kv_replicas = 1
        self.num_key_value_groups = (
            self.num_attention_heads_per_rank // self.num_key_value_heads_per_rank
        )

        self.q_size = self.num_attention_heads_per_rank * self.head_dim
        self.kv_size = self.num_key_value_heads_per_rank * self.head_dim
        qkv_size = self.q_size + 2 * self.kv_size
        self.qkv_split_indices = [self.q_size, self.q_size + self.kv_size]

        # <-- MODEL-SPECIFIC: fused QKV, stored [hidden, q|k|v]; O stored [q, hidden]
        self.qkv_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, qkv_size, dtype=self.dtype)
        )
        self.o_proj_weight = nn.Parameter(
            torch.empty(self.q_size, self.hidden_size, dtype=self.dtype)
        )
        # <-- MODEL-SPECIFIC: per-head RMSNorm of queries and keys before RoPE
        self.q_norm = Qwen3MoeRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)
        self.k_norm = Qwen3MoeRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)

        # Paged KV cache, bound by bind_kv_cache()
        self.k_cache = None
        self.v_cache = None

        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: TP sharding of the QKV and O projections. <<<"""
        # <-- MODEL-SPECIFIC: separate q/k/v checkpoint tensors fused on load
        set_weight_loader(
            self.qkv_proj_weight,
            fused_qkv_weight_loader(
                q_size=self.q_size,
                kv_size=self.kv_size,
                shard_dim=1,
                num_shards=self.world_size,
                is_storage_transposed=True,
                num_kv_replicas=self.num_kv_replicas,
            ),
        )
        set_weight_loader(
            self.o_proj_weight,
            sharding_weight_loader(
                shard_dim=0,
                shard_size=self.q_size,
                num_shards=self.world_size,
                is_storage_transposed=True,
            ),
        )

    def forward(self, hidden_states, positions, position_embeddings, attn_metadata=None):
        """>>> PARALLELISM: dispatch to the prefill or decode path. <<<"""
        if not _is_prefill(attn_metadata, self.layer_name):
            return self.forward_decode(hidden_states, positions, position_embeddings, attn_metadata)
        # >>> PARALLELISM: All-gather from SP before attention <<<
        if self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
        return self.forward_prefill(hidden_states, positions, position_embeddings, attn_metadata)

    def _write_kv_cache(self, k, v, slot_mapping, block_size):
        """Write k, v ([Nkv, T, Dh]) into the paged cache [blocks, Nkv, block, Dh]."""
        tokens = slot_mapping.shape[0]
        blocks = (slot_mapping // block_size).repeat(self.num_key_value_heads_per_rank)
        offsets = (slot_mapping % block_size).repeat(self.num_key_value_heads_per_rank)
        heads = torch.arange(
            self.num_key_value_heads_per_rank, dtype=torch.long, device=k.device
        ).repeat_interleave(tokens)
        self.k_cache.index_put_(
            (blocks, heads, offsets), k.reshape(-1, self.head_dim).to(self.k_cache.dtype)
        )
        self.v_cache.index_put_(
            (blocks, heads, offsets), v.reshape(-1, self.head_dim).to(self.v_cache.dtype)
        )

    def forward_prefill(self, hidden_states, positions, position_embeddings, attn_metadata=None):
        """One sequence of T tokens: [T, H] in, [T / world_size, H] out (SP)."""
        if attn_metadata is None:
            return torch.zeros_like(hidden_states)
        meta = attn_metadata[self.layer_name]
        hidden_states = hidden_states.to(self.dtype)
        tokens = hidden_states.shape[0]

        qkv = NF.qkv_proj(
            hidden=hidden_states.unsqueeze(0),
            qkv_weights=self.qkv_proj_weight,
            bias=None,
        ).squeeze(0)
        q, k, v = torch.tensor_split(qkv, self.qkv_split_indices, dim=-1)
        q = q.view(tokens, self.num_attention_heads_per_rank, self.head_dim).transpose(0, 1)
        k = k.view(tokens, self.num_key_value_heads_per_rank, self.head_dim).transpose(0, 1)
        v = v.view(tokens, self.num_key_value_heads_per_rank, self.head_dim).transpose(0, 1)

        # <-- MODEL-SPECIFIC: per-head RMSNorm of queries and keys before RoPE
        q = self.q_norm(q)
        k = self.k_norm(k)

        # <-- MODEL-SPECIFIC: rotate-half RoPE on all of head_dim
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)

        self._write_kv_cache(k, v, meta["slot_mapping"], meta["block_size"])

        k = k.repeat_interleave(self.num_key_value_groups, dim=0)
        v = v.repeat_interleave(self.num_key_value_groups, dim=0)
        attn_output = NF.flash_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v,
            scale=self.scaling,
            tp_q=False,
            tp_out=True,
        )  # [Nq, Dh, T]

        attn_output = NF.o_proj(attn_output.unsqueeze(0), self.o_proj_weight, None).squeeze(0)

        # >>> PARALLELISM: Reduce-scatter to return to SP layout <<<
        if self.world_size > 1:
            attn_output = self.tp_group.reduce_scatter(attn_output, dim=0)
        return attn_output.contiguous()

    def forward_decode(self, hidden_states, positions, position_embeddings, attn_metadata):
        """B sequences of S new tokens each: [B * S, H] in and out."""
        meta = attn_metadata[self.layer_name]
        block_size = meta["block_size"]
        block_table = meta["block_table_tensor"]
        batch = block_table.shape[0]
        tokens = hidden_states.shape[0]
        new_tokens = tokens // batch
        context = meta["max_blocks_per_seq"] * block_size

        x = hidden_states.to(self.dtype).view(batch, new_tokens, self.hidden_size)

        # Megakernel RoPE layout: [Dh/2, B, S]
        cos, sin = position_embeddings
        half = self.head_dim // 2
        cos = cos[:, :half].reshape(batch, new_tokens, half).permute(2, 0, 1).contiguous()
        sin = sin[:, :half].reshape(batch, new_tokens, half).permute(2, 0, 1).contiguous()

        mask = NF.gen_attention_decode_mask(
            pos_ids=positions.view(1, tokens).to(torch.float32),
            bs=batch,
            q_head=self.num_attention_heads_per_rank,
            s_active=new_tokens,
            s_prior=context,
            start_pos=None,
            block_len=block_size,
        )

        output = NF.attention_decode(
            X=x,
            W_qkv=self.qkv_proj_weight,
            bias_qkv=None,
            cos=cos.to(self.dtype),
            sin=sin.to(self.dtype),
            rope_contiguous_layout=True,
            rmsnorm_X_enabled=False,
            rmsnorm_QK_pre_rope_enabled=True,
            rmsnorm_QK_pre_rope_eps=self.q_norm.variance_epsilon,
            rmsnorm_QK_pre_rope_W_Q=self.q_norm.weight.view(1, -1),
            rmsnorm_QK_pre_rope_W_K=self.k_norm.weight.view(1, -1),
            rmsnorm_QK_post_rope_enabled=False,
            K_cache_transposed=False,
            active_blocks_table=block_table.to(torch.int32),
            K_cache=self.k_cache,
            V_cache=self.v_cache,
            attention_mask=mask,
            softmax_scale=self.scaling,
            update_cache=True,
            kv_cache_update_idx=meta["slot_mapping"].view(batch, new_tokens).to(torch.uint32),
            W_out=self.o_proj_weight,
            bias_out=None,
            transposed_out=False,
            out_in_sb=False,
        )
        output = output.view(tokens, self.hidden_size)

        # >>> PARALLELISM: sum the partial outputs of all ranks <<<
        if self.world_size > 1:
            output = self.tp_group.all_reduce(output)
        return output


# =============================================================================
# Section 4: MoE Experts
# Mixed: PARALLELISM (intermediate sharding, SP gather/scatter, collectives) +
#        MODEL-SPECIFIC (softmax top-k router, SiLU-gated experts)
# =============================================================================


def expert_gate_up_loader(intermediate_per_rank, num_shards, num_experts, hidden_size):
    """Loader for the stacked gate|up weight [E, H, 2 * I/tp] of all experts.

    Takes either the per-expert checkpoint tensors, listed
    ``[gate_0 .. gate_{E-1}, up_0 .. up_{E-1}]`` (each [I, H]), or one fused
    tensor: [E, 2 * I, H] (gate rows, then up rows: the layout transformers
    saves), or [E, H, 2 * I] (gate columns, then up columns: checkpoints that
    store experts [in, out], such as Aria's). The fused layout is told by the
    shape; when hidden == 2 * intermediate both shapes agree and [E, 2I, H] is
    assumed. Each rank keeps its slice of the intermediate dimension of gate
    and of up.
    """

    def transform(slices, rank):
        start = (rank % num_shards) * intermediate_per_rank
        stop = start + intermediate_per_rank
        if len(slices) == 2 * num_experts:
            gate = torch.stack([s[start:stop, :] for s in slices[:num_experts]])
            up = torch.stack([s[start:stop, :] for s in slices[num_experts:]])
        elif len(slices) == 1 and len(slices[0].get_shape()) == 3:
            fused = slices[0]
            shape = tuple(fused.get_shape())
            full = intermediate_per_rank * num_shards
            if shape[1:] != (2 * full, hidden_size) and shape[1:] == (hidden_size, 2 * full):
                # [E, H, 2I]: already [in, out]
                return torch.cat([fused[:, :, start:stop], fused[:, :, full + start : full + stop]], dim=2)
            gate = fused[:, start:stop, :]
            up = fused[:, full + start : full + stop, :]
        else:
            raise ValueError(
                f"expert gate/up weights: expected {2 * num_experts} per-expert tensors "
                f"or one fused [E, 2I, H] tensor, got {len(slices)} tensor(s)"
            )
        return torch.cat([gate.transpose(1, 2), up.transpose(1, 2)], dim=2)

    return SafetensorsWeightLoader(transform)


def expert_down_loader(intermediate_per_rank, num_shards, num_experts, hidden_size):
    """Loader for the stacked down weight [E, I/tp, H] of all experts, from
    ``[down_0 .. down_{E-1}]`` (each [H, I]) or one fused tensor, [E, H, I]
    or [E, I, H] (stored [in, out]; when hidden == intermediate both shapes
    agree and [E, H, I] is assumed)."""

    def transform(slices, rank):
        start = (rank % num_shards) * intermediate_per_rank
        stop = start + intermediate_per_rank
        if len(slices) == num_experts:
            down = torch.stack([s[:, start:stop] for s in slices])
        elif len(slices) == 1 and len(slices[0].get_shape()) == 3:
            shape = tuple(slices[0].get_shape())
            full = intermediate_per_rank * num_shards
            if shape[1:] != (hidden_size, full) and shape[1:] == (full, hidden_size):
                return slices[0][:, start:stop, :]  # [E, I, H]: already [in, out]
            down = slices[0][:, :, start:stop]
        else:
            raise ValueError(
                f"expert down weights: expected {num_experts} per-expert tensors "
                f"or one fused [E, H, I] tensor, got {len(slices)} tensor(s)"
            )
        return down.transpose(1, 2)

    return SafetensorsWeightLoader(transform)


class Qwen3MoeExperts(nn.Module):
    """The routed experts of one layer, with the norm in front of them.

    The post-attention RMSNorm lives here, not in the decoder layer, so that
    the decode kernel can fuse it with the router and the experts.
    """

    def __init__(self, config: Qwen3MoeConfig):
        super().__init__()
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size
        self.num_experts = config.num_experts
        self.num_experts_per_token = config.num_experts_per_tok
        self.intermediate_size = config.moe_intermediate_size
        # <-- MODEL-SPECIFIC: renormalize the top-k routing weights (read from the config)
        self.norm_topk_prob = config.norm_topk_prob
        self.block_size = 256
        # <-- MODEL-SPECIFIC: decode runs the fused kernel (norm, router, experts), which
        # computes softmax or sigmoid routers with an optional router bias; routing it
        # cannot express runs the prefill kernels instead (set False)
        self.fused_decode = True

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group

        # >>> PARALLELISM: every rank holds every expert, sharded on the intermediate dim <<<
        self.intermediate_size_per_rank = self.intermediate_size // self.world_size

        # <-- MODEL-SPECIFIC: pre-MoE RMSNorm (the decoder layer's post-attention norm)
        self.post_attention_layernorm = Qwen3MoeRMSNorm(
            config.hidden_size, config.rms_norm_eps, config.torch_dtype
        )
        # >>> PARALLELISM: router replicated on every rank <<<
        # <-- MODEL-SPECIFIC: router [E, H] kept in float32 (expert choice is precision-sensitive)
        self.router_weight = nn.Parameter(
            torch.empty(self.num_experts, self.hidden_size, dtype=torch.float32)
        )
        # <-- MODEL-SPECIFIC: SiLU-gated experts; gate|up stacked [E, H, 2 * I/tp], down [E, I/tp, H]
        self.gate_up_proj_weight = nn.Parameter(
            torch.empty(
                self.num_experts,
                self.hidden_size,
                2 * self.intermediate_size_per_rank,
                dtype=self.dtype,
            )
        )
        self.down_proj_weight = nn.Parameter(
            torch.empty(
                self.num_experts, self.intermediate_size_per_rank, self.hidden_size, dtype=self.dtype
            )
        )
        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: each rank loads its intermediate slice of every expert. <<<"""
        set_weight_loader(
            self.gate_up_proj_weight,
            expert_gate_up_loader(
                intermediate_per_rank=self.intermediate_size_per_rank,
                num_shards=self.world_size,
                num_experts=self.num_experts,
                hidden_size=self.hidden_size,
            ),
        )
        set_weight_loader(
            self.down_proj_weight,
            expert_down_loader(
                intermediate_per_rank=self.intermediate_size_per_rank,
                num_shards=self.world_size,
                num_experts=self.num_experts,
                hidden_size=self.hidden_size,
            ),
        )

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor, is_prefill: bool):
        if is_prefill:
            return self.forward_prefill(hidden_states, positions)
        return self.forward_decode(hidden_states)

    def _route(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Normalized hidden states [T, H] -> float32 affinities [T, E], zero
        for the experts a token does not use."""
        # <-- MODEL-SPECIFIC: float32 router logits and the top-k choice
        selected, router_logits = NF.router(
            hidden_states,
            router_weights=self.router_weight.T,
            top_k=self.num_experts_per_token,
            router_bias=None,
            activation="softmax",
            return_logits=True,
            computation_dtype=torch.float32,
        )
        # <-- MODEL-SPECIFIC: every expert's score (the router activation); chosen experts keep theirs
        scores = torch.softmax(router_logits, dim=-1)
        affinities = torch.where(selected != 0, scores, torch.zeros_like(scores))
        if self.norm_topk_prob:
            affinities = affinities / affinities.sum(dim=-1, keepdim=True)
        return affinities

    def _expert_weights(self):
        """The stacked weights in the kernels' layout: gate_up [E, H, 2, I/tp], down [E, I/tp, H]."""
        gate_up = self.gate_up_proj_weight.reshape(
            self.num_experts, self.hidden_size, 2, self.intermediate_size_per_rank
        )
        return gate_up, self.down_proj_weight

    def _experts_blockwise(self, hidden_states, expert_affinities, padding_mask=None):
        """Every expert on the tokens routed to it, in blocks: normalized
        hidden states [T, H] and affinities [T, E] in, partial sums [T, H] out."""
        affinities_masked, token_position_to_id, block_to_expert, conditions = (
            NF.build_blockwise_mapping(
                expert_affinities=expert_affinities,
                num_local_experts=self.num_experts,
                num_experts_per_token=self.num_experts_per_token,
                block_size=self.block_size,
                moe_group=self.tp_group,
                tp_degree=self.world_size,
                padding_mask=padding_mask,
            )
        )
        gate_up, down = self._expert_weights()
        return NF.moe_cte(
            implementation=MoECTEImplementation.shard_on_block,
            conditions=conditions,
            hidden_states=hidden_states,
            expert_affinities_masked=affinities_masked,
            gate_up_proj_weight=gate_up,
            down_proj_weight=down,
            # <-- MODEL-SPECIFIC: SiLU-gated experts
            activation_function=ActFnType.SiLU,
            block_size=self.block_size,
            token_position_to_id=token_position_to_id.to(torch.int32),
            block_to_expert=block_to_expert.to(torch.int32),
            expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
            skip_token=True,
            is_tensor_update_accumulating=True,
        )

    def _run_moe_block_tkg(self, hidden_states):
        """Decode in one kernel: norm, router, top-k and experts; [T, H] partial sums out."""
        tokens = hidden_states.shape[0]
        use_all_experts = tokens * self.num_experts_per_token >= self.num_experts
        rank_id = None
        if use_all_experts:
            rank_id = torch.zeros(1, 1, dtype=torch.int32, device=hidden_states.device)
        gate_up, down = self._expert_weights()
        output = NF.moe_block_tkg(
            inp=hidden_states.unsqueeze(0),
            gamma=self.post_attention_layernorm.weight.unsqueeze(0).to(torch.float32),
            router_weights=self.router_weight.T,
            expert_gate_up_weights=gate_up,
            expert_down_weights=down,
            rank_id=rank_id,
            top_k=self.num_experts_per_token,
            eps=self.post_attention_layernorm.variance_epsilon,
            # <-- MODEL-SPECIFIC: router activation over all experts, then top-k, renormalized per config
            router_act_fn=RouterActFnType.SOFTMAX,
            router_pre_norm=True,
            norm_topk_prob=self.norm_topk_prob,
            expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
            hidden_act_fn=ActFnType.SiLU,
            router_mm_dtype=nl.float32,
            is_all_expert=use_all_experts,
            skip_router_logits=True,
        )
        return output.view(tokens, self.hidden_size)

    def forward_prefill(self, hidden_states: torch.Tensor, positions: torch.Tensor):
        """This rank's SP slice [T / world_size, H] in and out."""
        hidden_states = self.post_attention_layernorm(hidden_states)
        expert_affinities = self._route(hidden_states)

        # >>> PARALLELISM: All-gather the tokens and their affinities from SP <<<
        if self.world_size > 1:
            expert_affinities = self.tp_group.all_gather(expert_affinities, dim=0)
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)

        # Real tokens end at the largest position; later rows are padding.
        last_real = torch.argmax(positions)
        padding_mask = torch.arange(positions.shape[0], device=positions.device) <= last_real
        output = self._experts_blockwise(hidden_states, expert_affinities, padding_mask)

        # >>> PARALLELISM: Reduce-scatter the partial sums back to SP <<<
        if self.world_size > 1:
            output = self.tp_group.reduce_scatter(output, dim=0)
        return output

    def forward_decode(self, hidden_states: torch.Tensor):
        """[B * S, H] in and out."""
        if self.fused_decode:
            output = self._run_moe_block_tkg(hidden_states)
        else:
            normalized = self.post_attention_layernorm(hidden_states)
            output = self._experts_blockwise(normalized, self._route(normalized))

        # >>> PARALLELISM: sum the partial outputs of all ranks <<<
        if self.world_size > 1:
            output = self.tp_group.all_reduce(output)
        return output


# =============================================================================
# Section 5: MLP Wrapper
# <-- MODEL-SPECIFIC: the feed-forward block of every layer is the MoE
# =============================================================================


class Qwen3MoeMLP(nn.Module):
    """Holds the experts; casts the input to the model dtype."""

    def __init__(self, config: Qwen3MoeConfig):
        super().__init__()
        self.dtype = config.torch_dtype
        self.experts = Qwen3MoeExperts(config)

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor, is_prefill: bool):
        return self.experts(hidden_states.to(self.dtype), positions, is_prefill=is_prefill)


# =============================================================================
# Section 6: Decoder Layer
# <-- MODEL-SPECIFIC: pre-norm residual blocks (the MoE applies its own norm)
# =============================================================================


class Qwen3MoeDecoderLayer(nn.Module):
    def __init__(self, config: Qwen3MoeConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.self_attn = Qwen3MoeAttention(config, layer_idx)
        self.mlp = Qwen3MoeMLP(config)
        self.input_layernorm = Qwen3MoeRMSNorm(
            config.hidden_size, config.rms_norm_eps, config.torch_dtype
        )

    def forward(self, hidden_states, positions, position_embeddings, attn_metadata=None):
        is_prefill = _is_prefill(attn_metadata, self.self_attn.layer_name)

        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, positions, position_embeddings, attn_metadata)
        hidden_states = residual + hidden_states

        # The post-attention norm is inside the experts (fused in the decode kernel).
        residual = hidden_states
        hidden_states = self.mlp(hidden_states, positions, is_prefill=is_prefill)
        return residual + hidden_states


# =============================================================================
# Section 7: Model Backbone
# Mixed: PARALLELISM (vocabulary-sharded embedding, SP) +
#        MODEL-SPECIFIC (final RMSNorm)
# =============================================================================


class Qwen3MoeModel(nn.Module):
    def __init__(self, config: Qwen3MoeConfig):
        super().__init__()
        self.config = config

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size

        self.embed_tokens = VocabDimShardedEmbedding(
            vocab_size=config.vocab_size,
            embed_dim=config.hidden_size,
            dtype=config.torch_dtype,
            tp_group=self.tp_group.device_group,
        )
        set_weight_loader(
            self.embed_tokens.weight,
            sharding_weight_loader(
                shard_dim=0,
                shard_size=self.embed_tokens.vocab_size_per_rank,
                num_shards=self.world_size,
                is_storage_transposed=False,
                pad_shard=True,
            ),
        )
        self.layers = nn.ModuleList(
            [Qwen3MoeDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        self.norm = Qwen3MoeRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
        self.rotary_emb = Qwen3MoeRotaryEmbedding(config)

    def forward(
        self,
        input_ids,
        positions,
        attn_metadata=None,
        rank=None,
        inputs_embeds=None,
        is_token_ids=None,
    ):
        is_prefill = _is_prefill(attn_metadata)
        # >>> PARALLELISM: prefill embeddings come back as this rank's SP slice <<<
        hidden_states = self.embed_tokens(input_ids, scatter_tokens=is_prefill, rank=rank)
        if inputs_embeds is not None:
            if is_prefill and self.world_size > 1:
                inputs_embeds = inputs_embeds.chunk(self.world_size, dim=0)[rank]
                is_token_ids = is_token_ids.chunk(self.world_size, dim=0)[rank]
            hidden_states = NF.merge_prompt_embeds(hidden_states, inputs_embeds, is_token_ids)

        position_embeddings = self.rotary_emb(
            positions, device=hidden_states.device, dtype=hidden_states.dtype
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, positions, position_embeddings, attn_metadata)
        hidden_states = self.norm(hidden_states)

        # >>> PARALLELISM: gather the SP slices for the LM head <<<
        if is_prefill and self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
        return hidden_states


# =============================================================================
# Section 8: Language Model Head, KV-cache spec and weight loading
# Mixed: PARALLELISM (vocabulary-sharded LM head) +
#        MODEL-SPECIFIC (tied embeddings, checkpoint key mapping)
# =============================================================================


class MoECheckpointKeys(NamedTuple):
    """Where one layer's MoE lives in a checkpoint."""

    module: str  # the MoE block, e.g. "model.layers.3.mlp"
    router: str  # the router module, e.g. "model.layers.3.mlp.gate"
    gate_up: list[str]  # per-expert gate then up weights, or the fused gate_up tensor
    down: list[str]  # per-expert down weights, or the fused down tensor


# <-- MODEL-SPECIFIC: checkpoint layouts of the experts:
# (MoE block, router, gate, up, down) for per-expert tensors
# "<block>.experts.<j>.<gate|up|down>.weight"; a checkpoint saved by
# transformers >= 5 stores "<block>.experts.gate_up_proj" [E, 2I, H] and
# "<block>.experts.down_proj" [E, H, I] instead. The router is a submodule
# of the block: "gate" (Qwen, DeepSeek), "router" (Aria, Granite), "gate.wg"
# (Hunyuan).
EXPERT_LAYOUTS = (
    ("mlp", "gate", "gate_proj", "up_proj", "down_proj"),
    ("mlp", "router", "gate_proj", "up_proj", "down_proj"),
    ("mlp", "gate.wg", "gate_proj", "up_proj", "down_proj"),
    ("block_sparse_moe", "gate", "w1", "w3", "w2"),
    ("block_sparse_moe", "router", "w1", "w3", "w2"),
)


def moe_checkpoint_keys(names, layer_prefix: str, num_experts: int) -> MoECheckpointKeys:
    """Find the experts of layer ``layer_prefix`` among the checkpoint's
    tensor ``names``; the first layout whose router weight is present wins."""
    for block, router, gate, up, down in EXPERT_LAYOUTS:
        module = f"{layer_prefix}.{block}"
        if f"{module}.{router}.weight" not in names:
            continue
        fused = f"{module}.experts.gate_up_proj"
        if fused in names:
            return MoECheckpointKeys(
                module, f"{module}.{router}", [fused], [f"{module}.experts.down_proj"]
            )
        experts = range(num_experts)
        return MoECheckpointKeys(
            module,
            f"{module}.{router}",
            [f"{module}.experts.{j}.{gate}.weight" for j in experts]
            + [f"{module}.experts.{j}.{up}.weight" for j in experts],
            [f"{module}.experts.{j}.{down}.weight" for j in experts],
        )
    looked_for = ", ".join(f"{layer_prefix}.{b}.{r}.weight" for b, r, *_ in EXPERT_LAYOUTS)
    raise KeyError(f"no MoE router in the checkpoint for {layer_prefix} (looked for {looked_for})")


class Qwen3MoeForCausalLM(nn.Module):
    def __init__(self, config: Qwen3MoeConfig):
        super().__init__()
        self.config = config
        self.model = Qwen3MoeModel(config)

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group

        neuron_config = config.neuron_config
        self.on_device_sampling_config = (
            neuron_config.on_device_sampling_config if neuron_config is not None else None
        )
        self.lm_head = neuron_nn.ColumnParallelLinear(
            config.hidden_size,
            config.vocab_size,
            bias=False,
            dtype=config.torch_dtype,
            gather_output=self.on_device_sampling_config is None,
            tp_group=self.tp_group.device_group,
        )
        set_weight_loader(
            self.lm_head.weight,
            sharding_weight_loader(
                shard_dim=0,
                shard_size=self.lm_head.out_features_per_rank,
                num_shards=self.lm_head.tp_size,
                is_storage_transposed=False,
            ),
        )
        self.sampler = None
        if self.on_device_sampling_config is not None:
            self.sampler = Sampler(
                self.on_device_sampling_config, process_group=self.tp_group.device_group
            )

    @classmethod
    def from_configs(
        cls, hf_config: PretrainedConfig, neuron_config: NeuronConfig | None = None
    ) -> "Qwen3MoeForCausalLM":
        return cls(Qwen3MoeConfig.from_configs(hf_config, neuron_config))

    @torch.no_grad()
    def forward(
        self,
        input_ids,
        positions,
        inputs_embeds=None,
        is_token_ids=None,
        attn_metadata=None,
        sampling_positions=None,
        sampling_params=None,
        logit_mask=None,
        rank=None,
        **kwargs,
    ):
        positions = positions.to(torch.int32)
        tokens = input_ids.shape[0]
        # >>> PARALLELISM: SP length validation <<<
        if _is_prefill(attn_metadata) and self.world_size > 1:
            if tokens <= self.world_size or tokens % self.world_size != 0:
                raise ValueError(
                    f"prefill length {tokens} must exceed and be divisible by "
                    f"the TP size {self.world_size}"
                )
        if rank is None:
            rank = self.rank

        hidden_states = self.model(
            input_ids,
            positions,
            attn_metadata=attn_metadata,
            rank=rank,
            inputs_embeds=inputs_embeds,
            is_token_ids=is_token_ids,
        )
        if sampling_positions is not None:
            hidden_states = torch.index_select(hidden_states, 0, sampling_positions)
        logits = self.lm_head(hidden_states)
        if self.sampler is None:
            return logits
        return self.sampler(logits, sampling_params, logit_mask=logit_mask, tp_rank=rank)

    def get_kv_spec(self) -> KVSpec:
        layers = [
            LayerSpec(
                name=layer.self_attn.layer_name,
                num_kv_heads=layer.self_attn.num_key_value_heads_per_rank,
                head_size=layer.self_attn.head_dim,
                dtype=layer.self_attn.dtype,
                sliding_window_size=None,
                chunk_size=None,
            )
            for layer in self.model.layers
        ]
        return KVSpec(layers=layers)

    def bind_kv_cache(self, kv_caches) -> None:
        for layer in self.model.layers:
            name = layer.self_attn.layer_name
            if name not in kv_caches:
                raise KeyError(f"no KV cache allocated for {name}")
            layer.self_attn.k_cache = kv_caches[name][0]
            layer.self_attn.v_cache = kv_caches[name][1]

    def load_weights(self, checkpoint_path, device="cpu", cache_dir=None):
        """Load this rank's shard of every parameter from a safetensors checkpoint."""
        checkpoint = SafetensorsCheckpoint(checkpoint_path, cache_dir=cache_dir)
        names = set(checkpoint.get_tensor_names())
        # <-- MODEL-SPECIFIC: Hugging Face checkpoint keys of each parameter
        mappings = {}
        for layer_id in range(len(self.model.layers)):
            prefix = f"model.layers.{layer_id}"
            moe = moe_checkpoint_keys(names, prefix, self.config.num_experts)
            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
            mappings[f"{prefix}.self_attn.qkv_proj_weight"] = [
                f"{prefix}.self_attn.q_proj.weight",
                f"{prefix}.self_attn.k_proj.weight",
                f"{prefix}.self_attn.v_proj.weight",
            ]
            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
            mappings[f"{prefix}.self_attn.q_norm.weight"] = f"{prefix}.self_attn.q_norm.weight"
            mappings[f"{prefix}.self_attn.k_norm.weight"] = f"{prefix}.self_attn.k_norm.weight"
            mappings[f"{prefix}.mlp.experts.post_attention_layernorm.weight"] = (
                f"{prefix}.post_attention_layernorm.weight"
            )
            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{moe.router}.weight"
            mappings[f"{prefix}.mlp.experts.gate_up_proj_weight"] = moe.gate_up
            mappings[f"{prefix}.mlp.experts.down_proj_weight"] = moe.down
        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
        mappings["model.norm.weight"] = "model.norm.weight"
        # <-- MODEL-SPECIFIC: tied embeddings load the LM head from the embedding
        if self.config.tie_word_embeddings:
            mappings["lm_head.weight"] = "model.embed_tokens.weight"
        else:
            mappings["lm_head.weight"] = "lm_head.weight"

        result = checkpoint.load_sharded_pipelined(
            self.rank, self.world_size, self, mappings, device
        )
        self.load_state_dict(result.state_dict, strict=False, assign=True)
        return result
