# SPDX-License-Identifier: Apache-2.0
"""
GPT-OSS for the vLLM Neuron backend (bf16)
==========================================

autoport-cst reference model ``gpt_oss``: a mixture-of-experts decoder with
expert parallelism. Grouped-query attention with biases on the Q, K, V and
output projections, a learned sink logit per query head, sliding-window
attention on the layers the config marks (every other layer in the
releases), YaRN-scaled rotary embedding; in every layer a router with a bias
whose top-k logits are turned into weights by a softmax over those k, and
experts with biases computing a clamped SwiGLU; RMSNorm everywhere.

Supported parallelism: TP (attention heads and the expert intermediate
dimension sharded), sequence-parallel (SP) hidden states between layers
during prefill, and expert parallelism (EP) inside the TP world: with EP
degree E over W ranks, EP rank k = rank // (W / E) holds experts
[k * L, (k + 1) * L) (L = experts / E), sharded over the W / E ranks of its
partition; every MoE collective still runs over the whole TP group.

Paths:
  prefill  attention: NF.qkv_proj (+ bias) -> RoPE -> paged KV-cache write
           -> NF.flash_attention (sinks, window) -> NF.o_proj (+ bias)
           experts:   RMSNorm -> NF.router (bias, top-k then softmax)
           -> [EP: NF.get_local_expert_affinities] -> NF.build_blockwise_mapping
           -> NF.moe_cte (biases, clamped Swish)
  decode   attention: NF.attention_decode (fused QKV, RoPE, paged attention with
           sinks and window mask, cache write, O projection)
           experts:   NF.moe_block_tkg (fused RMSNorm, router, top-k, local experts)

ANNOTATION GUIDE (codemods anchor on these markers; keep them when editing):
  # >>> PARALLELISM: <what> <<<    parallelism plumbing, kept across ports
  # <-- MODEL-SPECIFIC: <what>     what changes when porting another architecture
"""

import math

import nki.language as nl
import torch
from nkilib.core.moe.moe_cte.moe_cte import MoECTEImplementation
from nkilib.core.utils.common_types import ActFnType, ExpertAffinityScaleMode, RouterActFnType
from torch import nn
from transformers import PretrainedConfig
from vllm.config import get_current_vllm_config
from vllm.distributed.parallel_state import get_tp_group

import vllm_neuron.functional as NF
import vllm_neuron.nn as neuron_nn
from vllm_neuron.model.kv_cache import KVSpec, LayerSpec
from vllm_neuron.model.neuron_config import NeuronConfig
from vllm_neuron.nn.embedding import VocabDimShardedEmbedding
from vllm_neuron.nn.sampler import Sampler
from vllm_neuron.parallel.neuron_parallel_state import (
    get_neuron_ep_degree,
    get_neuron_ep_rank,
    get_neuron_ep_tp_group,
)
from vllm_neuron.utils.checkpoints import SafetensorsCheckpoint
from vllm_neuron.utils.weight_loader import (
    SafetensorsWeightLoader,
    expert_parallel_tensor_dim_loader,
    fused_qkv_weight_loader,
    scaled_bias_loader,
    set_weight_loader,
    sharding_weight_loader,
)

from .config import GptOssConfig


def _is_prefill(attn_metadata, layer_name: str = "layers.0.self_attn") -> bool:
    """Prefill when the step has more query tokens than the decode threshold."""
    if attn_metadata is None:
        return False
    meta = attn_metadata[layer_name]
    return meta["max_query_len"] > meta["decode_token_threshold"]


def _layer_sliding_window(config, layer_idx: int) -> int | None:
    """The attention window of one layer in tokens, or None for full attention.

    ``config.layer_types`` marks each layer "sliding_attention" or
    "full_attention" (the config fills it in: every even layer slides).
    """
    if config.sliding_window is None:
        return None
    if config.layer_types[layer_idx] == "sliding_attention":
        return config.sliding_window
    return None


# =============================================================================
# Section 1: RMS Normalization
# <-- MODEL-SPECIFIC: GPT-OSS uses RMSNorm with a float32 weight
# =============================================================================


class GptOssRMSNorm(nn.Module):
    """RMSNorm computed in float32, cast back to the input dtype.

    The weight stays float32 whatever the model dtype: GPT-OSS keeps its
    norms in full precision (transformers loads them so), and rounding the
    weight to bf16 would add an error of the size of the output rounding.
    """

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=torch.float32))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)


# =============================================================================
# Section 2: Rotary Position Embedding (YaRN)
# <-- MODEL-SPECIFIC: rotate-half RoPE with YaRN frequency scaling
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


class GptOssRotaryEmbedding(nn.Module):
    """cos/sin tables for the step's positions, YaRN-scaled.

    ``__init__`` keeps Python scalars only: the model is built on the meta
    device, so a tensor computed here would never hold data. YaRN's band
    limits and attention factor are plain floats; the inverse frequencies
    are computed in ``forward`` on the input's device.
    """

    def __init__(self, config: GptOssConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.rope_theta = float(config.rope_theta)
        scaling = dict(config.rope_scaling or {})
        self.rope_type = scaling.get("rope_type", scaling.get("type")) or "default"
        # <-- MODEL-SPECIFIC: RoPE variants this model implements
        if self.rope_type not in ("default", "yarn"):
            raise NotImplementedError(f"rope_type {self.rope_type!r} is not supported")
        self.scaling_factor = 1.0
        self.attention_scaling = 1.0
        if self.rope_type == "yarn":
            self._setup_yarn(config, scaling)

    def _setup_yarn(self, config, scaling):
        """The band (in rotated dimensions) between beta_fast and beta_slow
        rotations over the original context, where interpolated and original
        frequencies are blended, and the cos/sin scale ("concentration")."""
        original = scaling.get("original_max_position_embeddings") or config.max_position_embeddings
        factor = scaling.get("factor")
        if factor is None:
            factor = config.max_position_embeddings / original
        self.scaling_factor = float(factor)

        def mscale(scale, coefficient=1.0):
            return 1.0 if scale <= 1 else 0.1 * coefficient * math.log(scale) + 1.0

        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            if scaling.get("mscale") and scaling.get("mscale_all_dim"):
                attention_factor = mscale(factor, scaling["mscale"]) / mscale(
                    factor, scaling["mscale_all_dim"]
                )
            else:
                attention_factor = mscale(factor)
        self.attention_scaling = float(attention_factor)

        def band_edge(rotations):
            turns = math.log(original / (rotations * 2 * math.pi))
            return (self.head_dim * turns) / (2 * math.log(self.rope_theta))

        low = band_edge(scaling.get("beta_fast") or 32)
        high = band_edge(scaling.get("beta_slow") or 1)
        # GPT-OSS ships truncate=False: the band edges stay fractional
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        self.yarn_low = max(low, 0)
        self.yarn_high = min(high, self.head_dim - 1)
        if self.yarn_low == self.yarn_high:
            self.yarn_high += 0.001

    def _compute_inv_freq(self, device: torch.device) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device)
        inv_freq = 1.0 / (self.rope_theta ** (exponents.to(torch.float32) / self.head_dim))
        if self.rope_type == "yarn":
            dims = torch.arange(self.head_dim // 2, dtype=torch.float32, device=device)
            ramp = (dims - self.yarn_low) / (self.yarn_high - self.yarn_low)
            keep = 1 - torch.clamp(ramp, 0, 1)
            interpolated = inv_freq / self.scaling_factor
            inv_freq = interpolated * (1 - keep) + inv_freq * keep
        return inv_freq

    def forward(
        self, position_ids: torch.Tensor, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self._compute_inv_freq(device)
        freqs = torch.outer(position_ids.to(torch.float32), inv_freq)  # [T, Dh/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, Dh]
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


# =============================================================================
# Section 3: Attention
# Mixed: PARALLELISM (head sharding, SP gather/scatter, collectives) +
#        MODEL-SPECIFIC (GQA, Q/K/V and O biases, attention sinks, sliding window)
# =============================================================================


def fused_qkv_bias_loader(q_size, kv_size, num_shards, num_kv_replicas=1):
    """Loader for a fused [q | k | v] bias from the separate q, k and v biases.

    Each rank takes its slice of the query bias, and the slice of the key and
    value biases of the KV head it holds (ranks share a KV head when there are
    fewer KV heads than ranks).
    """

    def transform(slices, rank):
        if len(slices) != 3:
            raise ValueError(f"fused QKV bias expects q, k and v tensors, got {len(slices)}")
        q_rank = rank % num_shards
        kv_rank = q_rank // num_kv_replicas
        q = slices[0][q_rank * q_size : (q_rank + 1) * q_size]
        k = slices[1][kv_rank * kv_size : (kv_rank + 1) * kv_size]
        v = slices[2][kv_rank * kv_size : (kv_rank + 1) * kv_size]
        return torch.cat([q, k, v], dim=0)

    return SafetensorsWeightLoader(transform)


class GptOssAttention(nn.Module):
    """Grouped-query attention with projection biases, per-head sinks, an
    optional sliding window, TP head sharding and a paged KV cache."""

    def __init__(self, config: GptOssConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.layer_name = f"layers.{layer_idx}.self_attn"
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size
        self.head_dim = config.head_dim
        self.num_attention_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        # <-- MODEL-SPECIFIC: sliding-window attention (window in tokens, None: full attention)
        self.sliding_window = _layer_sliding_window(config, layer_idx)

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

        # <-- MODEL-SPECIFIC: fused QKV, stored [hidden, q|k|v]; O stored [q, hidden]; both with biases
        self.qkv_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, qkv_size, dtype=self.dtype)
        )
        self.qkv_proj_bias = nn.Parameter(torch.zeros(qkv_size, dtype=self.dtype))
        self.o_proj_weight = nn.Parameter(
            torch.empty(self.q_size, self.hidden_size, dtype=self.dtype)
        )
        self.o_proj_bias = nn.Parameter(torch.zeros(self.hidden_size, dtype=self.dtype))
        # <-- MODEL-SPECIFIC: one learned sink logit per query head (float32)
        self.sinks = nn.Parameter(
            torch.zeros(self.num_attention_heads_per_rank, dtype=torch.float32)
        )

        # Paged KV cache, bound by bind_kv_cache()
        self.k_cache = None
        self.v_cache = None

        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: TP sharding of the QKV and O projections and the sinks. <<<"""
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
            self.qkv_proj_bias,
            fused_qkv_bias_loader(
                q_size=self.q_size,
                kv_size=self.kv_size,
                num_shards=self.world_size,
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
        # The O bias is added to every rank's partial sum before the reduction.
        set_weight_loader(self.o_proj_bias, scaled_bias_loader(scale=self.world_size))
        set_weight_loader(
            self.sinks,
            sharding_weight_loader(
                shard_dim=0,
                shard_size=self.num_attention_heads_per_rank,
                num_shards=self.world_size,
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
            bias=self.qkv_proj_bias.unsqueeze(0),
        ).squeeze(0)
        q, k, v = torch.tensor_split(qkv, self.qkv_split_indices, dim=-1)
        q = q.view(tokens, self.num_attention_heads_per_rank, self.head_dim).transpose(0, 1)
        k = k.view(tokens, self.num_key_value_heads_per_rank, self.head_dim).transpose(0, 1)
        v = v.view(tokens, self.num_key_value_heads_per_rank, self.head_dim).transpose(0, 1)

        # <-- MODEL-SPECIFIC: rotate-half RoPE on all of head_dim
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)

        self._write_kv_cache(k, v, meta["slot_mapping"], meta["block_size"])

        k = k.repeat_interleave(self.num_key_value_groups, dim=0)
        v = v.repeat_interleave(self.num_key_value_groups, dim=0)
        # <-- MODEL-SPECIFIC: sink logits ([Nq, 1]) and the layer's window
        attn_output = NF.flash_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v,
            scale=self.scaling,
            sink=self.sinks.unsqueeze(1),
            sliding_window=self.sliding_window,
            tp_q=False,
            tp_out=True,
        )  # [Nq, Dh, T]

        attn_output = NF.o_proj(
            attn_output.unsqueeze(0), self.o_proj_weight, self.o_proj_bias.unsqueeze(0)
        ).squeeze(0)

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

        # <-- MODEL-SPECIFIC: sliding window: mask prior positions before p - window + 1
        start_pos = None
        if self.sliding_window is not None:
            start_pos = torch.clamp(
                positions.view(1, tokens).to(torch.float32) - (self.sliding_window - 1), min=0
            )
        mask = NF.gen_attention_decode_mask(
            pos_ids=positions.view(1, tokens).to(torch.float32),
            bs=batch,
            q_head=self.num_attention_heads_per_rank,
            s_active=new_tokens,
            s_prior=context,
            start_pos=start_pos,
            block_len=block_size,
        )

        output = NF.attention_decode(
            X=x,
            W_qkv=self.qkv_proj_weight,
            bias_qkv=self.qkv_proj_bias.unsqueeze(0),
            cos=cos.to(self.dtype),
            sin=sin.to(self.dtype),
            rope_contiguous_layout=True,
            rmsnorm_X_enabled=False,
            rmsnorm_QK_pre_rope_enabled=False,
            rmsnorm_QK_post_rope_enabled=False,
            K_cache_transposed=False,
            active_blocks_table=block_table.to(torch.int32),
            K_cache=self.k_cache,
            V_cache=self.v_cache,
            attention_mask=mask,
            # <-- MODEL-SPECIFIC: sink logits, one per query head ([Nq, 1])
            sink=self.sinks.unsqueeze(1),
            softmax_scale=self.scaling,
            update_cache=True,
            kv_cache_update_idx=meta["slot_mapping"].view(batch, new_tokens).to(torch.uint32),
            W_out=self.o_proj_weight,
            bias_out=self.o_proj_bias.unsqueeze(0),
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
# Mixed: PARALLELISM (expert partitions over EP ranks, intermediate sharding,
#                     SP gather/scatter, collectives) +
#        MODEL-SPECIFIC (router with bias, top-k then softmax, clamped SwiGLU
#                        experts with biases)
# =============================================================================


def expert_gate_up_loader(intermediate_per_rank, num_shards, hidden_size):
    """Loader for the stacked gate|up weight [E, H, 2 * I/tp] of all experts.

    The checkpoint stores ``experts.gate_up_proj`` as [E, H, 2I] ([in, out])
    with gate and up interleaved along the last dimension: column 2j is gate
    unit j, column 2j + 1 up unit j. Each rank reads the contiguous columns
    of its units and lays them out as [gate | up], the kernels' order.
    """

    def transform(slices, rank):
        if len(slices) != 1 or len(slices[0].get_shape()) != 3:
            raise ValueError("expert gate/up weights: expected one [E, H, 2I] tensor")
        shape = tuple(slices[0].get_shape())
        if shape[1] != hidden_size or shape[2] != 2 * intermediate_per_rank * num_shards:
            raise ValueError(
                f"expert gate/up weights: expected [E, {hidden_size}, "
                f"{2 * intermediate_per_rank * num_shards}], got {list(shape)}"
            )
        start = (rank % num_shards) * intermediate_per_rank
        stop = start + intermediate_per_rank
        units = slices[0][:, :, 2 * start : 2 * stop]
        return torch.cat([units[:, :, 0::2], units[:, :, 1::2]], dim=2)

    return SafetensorsWeightLoader(transform)


def expert_gate_up_bias_loader(intermediate_per_rank, num_shards, up_offset):
    """Loader for the stacked gate|up bias [E, 2 * I/tp] from the interleaved
    [E, 2I] ``experts.gate_up_proj_bias``; ``up_offset`` is added to the up
    half (GPT-OSS multiplies by ``up + 1``: the kernels see ``up'`` = up + 1)."""

    def transform(slices, rank):
        if len(slices) != 1 or len(slices[0].get_shape()) != 2:
            raise ValueError("expert gate/up biases: expected one [E, 2I] tensor")
        start = (rank % num_shards) * intermediate_per_rank
        stop = start + intermediate_per_rank
        units = slices[0][:, 2 * start : 2 * stop]
        gate = units[:, 0::2]
        up = units[:, 1::2].to(torch.float32) + up_offset
        return torch.cat([gate, up.to(gate.dtype)], dim=1)

    return SafetensorsWeightLoader(transform)


def expert_down_loader(intermediate_per_rank, num_shards, hidden_size):
    """Loader for the stacked down weight [E, I/tp, H] from
    ``experts.down_proj`` [E, I, H] (stored [in, out])."""

    def transform(slices, rank):
        if len(slices) != 1 or len(slices[0].get_shape()) != 3:
            raise ValueError("expert down weights: expected one [E, I, H] tensor")
        shape = tuple(slices[0].get_shape())
        if shape[1] != intermediate_per_rank * num_shards or shape[2] != hidden_size:
            raise ValueError(
                f"expert down weights: expected [E, {intermediate_per_rank * num_shards}, "
                f"{hidden_size}], got {list(shape)}"
            )
        start = (rank % num_shards) * intermediate_per_rank
        return slices[0][:, start : start + intermediate_per_rank, :]

    return SafetensorsWeightLoader(transform)


class GptOssExperts(nn.Module):
    """The routed experts of one layer, with the norm in front of them.

    The post-attention RMSNorm lives here, not in the decoder layer, so that
    the decode kernel can fuse it with the router and the experts.

    Without expert parallelism every rank holds every expert and its slice
    of the intermediate dimension. With it, EP rank k holds experts
    [k * L, (k + 1) * L), sharded over the ``tp_degree`` ranks of its
    partition; the partial sums of all ranks (all experts, all slices) add
    up to the output, so the collectives stay on the whole TP group.
    """

    def __init__(self, config: GptOssConfig):
        super().__init__()
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size
        self.num_experts = config.num_local_experts
        self.num_experts_per_token = config.num_experts_per_tok
        self.intermediate_size = config.intermediate_size
        self.block_size = 256
        # <-- MODEL-SPECIFIC: clamped SwiGLU: g = clamp(gate, max=limit),
        # u = clamp(up, -limit, limit), g * sigmoid(alpha g) * (u + 1). The kernels'
        # Swish is x * sigmoid(1.702 x) (the factory checks alpha); the +1 is folded
        # into the up bias at load time, so the up clamp moves by 1 too.
        self.swiglu_limit = float(config.swiglu_limit)
        self.up_offset = 1.0

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group

        # >>> PARALLELISM: expert parallelism inside the TP world <<<
        self.ep_enabled = get_current_vllm_config().parallel_config.enable_expert_parallel
        if self.ep_enabled:
            self.ep_degree = get_neuron_ep_degree()
            self.ep_rank = get_neuron_ep_rank()
            self.ep_tp_group = get_neuron_ep_tp_group()
        else:
            self.ep_degree = 1
            self.ep_rank = 0
            self.ep_tp_group = self.tp_group
        if self.num_experts % self.ep_degree != 0:
            raise ValueError(
                f"{self.num_experts} experts do not split into {self.ep_degree} EP partitions"
            )
        self.tp_degree = self.ep_tp_group.world_size
        # Linear placement: EP rank k owns experts [k * L, (k + 1) * L)
        self.num_local_experts = self.num_experts // self.ep_degree
        self.local_expert_start = self.ep_rank * self.num_local_experts

        # >>> PARALLELISM: the intermediate dim sharded over the ranks of a partition <<<
        self.intermediate_size_per_rank = self.intermediate_size // self.tp_degree

        # <-- MODEL-SPECIFIC: pre-MoE RMSNorm (the decoder layer's post-attention norm)
        self.post_attention_layernorm = GptOssRMSNorm(config.hidden_size, config.rms_norm_eps)
        # >>> PARALLELISM: router replicated on every rank (not EP-sharded) <<<
        # <-- MODEL-SPECIFIC: router [E, H] and its bias [E], float32 (expert choice is precision-sensitive)
        self.router_weight = nn.Parameter(
            torch.empty(self.num_experts, self.hidden_size, dtype=torch.float32)
        )
        self.router_bias = nn.Parameter(torch.zeros(self.num_experts, dtype=torch.float32))
        # <-- MODEL-SPECIFIC: experts with biases; gate|up stacked [E_L, H, 2 * I/tp], down [E_L, I/tp, H]
        self.gate_up_proj_weight = nn.Parameter(
            torch.empty(
                self.num_local_experts,
                self.hidden_size,
                2 * self.intermediate_size_per_rank,
                dtype=self.dtype,
            )
        )
        self.gate_up_proj_bias = nn.Parameter(
            torch.zeros(self.num_local_experts, 2 * self.intermediate_size_per_rank, dtype=self.dtype)
        )
        self.down_proj_weight = nn.Parameter(
            torch.empty(
                self.num_local_experts,
                self.intermediate_size_per_rank,
                self.hidden_size,
                dtype=self.dtype,
            )
        )
        self.down_proj_bias = nn.Parameter(
            torch.zeros(self.num_local_experts, self.hidden_size, dtype=self.dtype)
        )
        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: each rank loads its experts (EP) and its intermediate slice (TP). <<<"""
        local_expert_indices = list(
            range(self.local_expert_start, self.local_expert_start + self.num_local_experts)
        )

        def local_experts(loader):
            """With EP, keep only this rank's experts of a stacked tensor."""
            if self.ep_degree > 1:
                return expert_parallel_tensor_dim_loader(local_expert_indices, loader)
            return loader

        set_weight_loader(
            self.gate_up_proj_weight,
            local_experts(
                expert_gate_up_loader(
                    intermediate_per_rank=self.intermediate_size_per_rank,
                    num_shards=self.tp_degree,
                    hidden_size=self.hidden_size,
                )
            ),
        )
        set_weight_loader(
            self.gate_up_proj_bias,
            local_experts(
                expert_gate_up_bias_loader(
                    intermediate_per_rank=self.intermediate_size_per_rank,
                    num_shards=self.tp_degree,
                    up_offset=self.up_offset,
                )
            ),
        )
        set_weight_loader(
            self.down_proj_weight,
            local_experts(
                expert_down_loader(
                    intermediate_per_rank=self.intermediate_size_per_rank,
                    num_shards=self.tp_degree,
                    hidden_size=self.hidden_size,
                )
            ),
        )
        # The down bias is added to the partial sum of each rank of a partition.
        set_weight_loader(
            self.down_proj_bias, local_experts(scaled_bias_loader(scale=self.tp_degree))
        )

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor, is_prefill: bool):
        if is_prefill:
            return self.forward_prefill(hidden_states, positions)
        return self.forward_decode(hidden_states)

    def _route(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Normalized hidden states [T, H] -> float32 affinities [T, E], zero
        for the experts a token does not use."""
        # <-- MODEL-SPECIFIC: logits with the router bias, top-k of the logits, then a
        # softmax over those k (NF.router's default order)
        return NF.router(
            hidden_states,
            router_weights=self.router_weight.T,
            top_k=self.num_experts_per_token,
            router_bias=self.router_bias,
            activation="softmax",
            computation_dtype=torch.float32,
        )

    def _local_affinities(self, expert_affinities: torch.Tensor) -> torch.Tensor:
        """>>> PARALLELISM: with EP, the columns of this rank's experts. <<<"""
        if self.ep_degree == 1:
            return expert_affinities
        local_expert_indices = torch.arange(
            self.local_expert_start,
            self.local_expert_start + self.num_local_experts,
            dtype=torch.int32,
            device=expert_affinities.device,
        )
        return NF.get_local_expert_affinities(expert_affinities, local_expert_indices)

    def _expert_weights(self):
        """The stacked weights and biases in the kernels' layout: gate_up
        [E_L, H, 2, I/tp] and [E_L, 2, I/tp], down [E_L, I/tp, H] and [E_L, H]."""
        gate_up = self.gate_up_proj_weight.reshape(
            self.num_local_experts, self.hidden_size, 2, self.intermediate_size_per_rank
        )
        gate_up_bias = self.gate_up_proj_bias.reshape(
            self.num_local_experts, 2, self.intermediate_size_per_rank
        )
        return gate_up, gate_up_bias, self.down_proj_weight, self.down_proj_bias

    def _experts_blockwise(self, hidden_states, expert_affinities, padding_mask=None):
        """This rank's experts on the tokens routed to them, in blocks:
        normalized hidden states [T, H] and local affinities [T, E_L] in,
        partial sums [T, H] out."""
        affinities_masked, token_position_to_id, block_to_expert, conditions = (
            NF.build_blockwise_mapping(
                expert_affinities=expert_affinities,
                num_local_experts=self.num_local_experts,
                num_experts_per_token=self.num_experts_per_token,
                block_size=self.block_size,
                moe_group=self.ep_tp_group,
                tp_degree=self.tp_degree,
                padding_mask=padding_mask,
            )
        )
        gate_up, gate_up_bias, down, down_bias = self._expert_weights()
        return NF.moe_cte(
            implementation=MoECTEImplementation.shard_on_block,
            conditions=conditions,
            hidden_states=hidden_states,
            expert_affinities_masked=affinities_masked,
            gate_up_proj_weight=gate_up,
            down_proj_weight=down,
            gate_and_up_proj_bias=gate_up_bias,
            down_proj_bias=down_bias,
            # <-- MODEL-SPECIFIC: clamped SwiGLU (gate clamped above, up' = up + 1 on both sides)
            activation_function=ActFnType.Swish,
            gate_clamp_upper_limit=self.swiglu_limit,
            gate_clamp_lower_limit=None,
            up_clamp_upper_limit=self.swiglu_limit + self.up_offset,
            up_clamp_lower_limit=-self.swiglu_limit + self.up_offset,
            block_size=self.block_size,
            token_position_to_id=token_position_to_id.to(torch.int32),
            block_to_expert=block_to_expert.to(torch.int32),
            expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
            skip_token=True,
            is_tensor_update_accumulating=True,
        )

    def _run_moe_block_tkg(self, hidden_states):
        """Decode in one kernel: norm, router, top-k and this rank's experts;
        [T, H] partial sums out."""
        tokens = hidden_states.shape[0]
        # >>> PARALLELISM: with EP (or enough tokens) the kernel runs all local experts of rank_id <<<
        use_all_experts = (
            tokens * self.num_experts_per_token >= self.num_local_experts or self.ep_degree > 1
        )
        rank_id = None
        if use_all_experts:
            rank_id = torch.full(
                (1, 1), self.ep_rank, dtype=torch.int32, device=hidden_states.device
            )
        gate_up, gate_up_bias, down, down_bias = self._expert_weights()
        output = NF.moe_block_tkg(
            inp=hidden_states.unsqueeze(0),
            gamma=self.post_attention_layernorm.weight.unsqueeze(0).to(torch.float32),
            router_weights=self.router_weight.T,
            expert_gate_up_weights=gate_up,
            expert_down_weights=down,
            rank_id=rank_id,
            top_k=self.num_experts_per_token,
            router_bias=self.router_bias.unsqueeze(0),
            expert_gate_up_bias=gate_up_bias,
            expert_down_bias=down_bias,
            eps=self.post_attention_layernorm.variance_epsilon,
            # <-- MODEL-SPECIFIC: top-k of the logits, then a softmax over those k
            router_act_fn=RouterActFnType.SOFTMAX,
            router_pre_norm=False,
            norm_topk_prob=False,
            expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
            # <-- MODEL-SPECIFIC: clamped SwiGLU (gate clamped above, up' = up + 1 on both sides)
            hidden_act_fn=ActFnType.Swish,
            gate_clamp_upper_limit=self.swiglu_limit,
            gate_clamp_lower_limit=None,
            up_clamp_upper_limit=self.swiglu_limit + self.up_offset,
            up_clamp_lower_limit=-self.swiglu_limit + self.up_offset,
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
        expert_affinities = self._local_affinities(expert_affinities)
        output = self._experts_blockwise(hidden_states, expert_affinities, padding_mask)

        # >>> PARALLELISM: Reduce-scatter the partial sums (all experts, all slices) back to SP <<<
        if self.world_size > 1:
            output = self.tp_group.reduce_scatter(output, dim=0)
        return output

    def forward_decode(self, hidden_states: torch.Tensor):
        """[B * S, H] in and out."""
        output = self._run_moe_block_tkg(hidden_states)

        # >>> PARALLELISM: sum the partial outputs of all ranks <<<
        if self.world_size > 1:
            output = self.tp_group.all_reduce(output)
        return output


# =============================================================================
# Section 5: MLP Wrapper
# <-- MODEL-SPECIFIC: the feed-forward block of every layer is the MoE
# =============================================================================


class GptOssMLP(nn.Module):
    """Holds the experts; casts the input to the model dtype."""

    def __init__(self, config: GptOssConfig):
        super().__init__()
        self.dtype = config.torch_dtype
        self.experts = GptOssExperts(config)

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor, is_prefill: bool):
        return self.experts(hidden_states.to(self.dtype), positions, is_prefill=is_prefill)


# =============================================================================
# Section 6: Decoder Layer
# <-- MODEL-SPECIFIC: pre-norm residual blocks (the MoE applies its own norm)
# =============================================================================


class GptOssDecoderLayer(nn.Module):
    def __init__(self, config: GptOssConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.self_attn = GptOssAttention(config, layer_idx)
        self.mlp = GptOssMLP(config)
        self.input_layernorm = GptOssRMSNorm(config.hidden_size, config.rms_norm_eps)

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


class GptOssModel(nn.Module):
    def __init__(self, config: GptOssConfig):
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
            [GptOssDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        self.norm = GptOssRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = GptOssRotaryEmbedding(config)

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


class GptOssForCausalLM(nn.Module):
    def __init__(self, config: GptOssConfig):
        super().__init__()
        self.config = config
        self.model = GptOssModel(config)

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
    ) -> "GptOssForCausalLM":
        return cls(GptOssConfig.from_configs(hf_config, neuron_config))

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
                sliding_window_size=layer.self_attn.sliding_window,
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
            experts = f"{prefix}.mlp.experts"
            if f"{experts}.gate_up_proj_blocks" in names:
                raise ValueError(
                    f"{experts}: MXFP4-quantized experts (gate_up_proj_blocks / _scales) are not "
                    "supported by this bf16 model; dequantize the checkpoint to bf16 first"
                )
            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
            mappings[f"{prefix}.self_attn.qkv_proj_weight"] = [
                f"{prefix}.self_attn.q_proj.weight",
                f"{prefix}.self_attn.k_proj.weight",
                f"{prefix}.self_attn.v_proj.weight",
            ]
            mappings[f"{prefix}.self_attn.qkv_proj_bias"] = [
                f"{prefix}.self_attn.q_proj.bias",
                f"{prefix}.self_attn.k_proj.bias",
                f"{prefix}.self_attn.v_proj.bias",
            ]
            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
            mappings[f"{prefix}.self_attn.o_proj_bias"] = f"{prefix}.self_attn.o_proj.bias"
            mappings[f"{prefix}.self_attn.sinks"] = f"{prefix}.self_attn.sinks"
            mappings[f"{prefix}.mlp.experts.post_attention_layernorm.weight"] = (
                f"{prefix}.post_attention_layernorm.weight"
            )
            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{prefix}.mlp.router.weight"
            mappings[f"{prefix}.mlp.experts.router_bias"] = f"{prefix}.mlp.router.bias"
            mappings[f"{prefix}.mlp.experts.gate_up_proj_weight"] = f"{experts}.gate_up_proj"
            mappings[f"{prefix}.mlp.experts.gate_up_proj_bias"] = f"{experts}.gate_up_proj_bias"
            mappings[f"{prefix}.mlp.experts.down_proj_weight"] = f"{experts}.down_proj"
            mappings[f"{prefix}.mlp.experts.down_proj_bias"] = f"{experts}.down_proj_bias"
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
