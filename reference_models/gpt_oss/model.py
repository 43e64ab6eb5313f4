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
experts with biases computing a clamped SwiGLU; RMSNorm everywhere, with
float32 weights.

Supported parallelism: TP with sequence-parallel (SP) hidden states between
layers during prefill; expert parallelism (EP) inside the TP world: with EP
degree D over W ranks, EP rank k = rank // (W / D) holds experts
[k * L, (k + 1) * L) (L = experts / D), sharded over the W / D ranks of its
partition, every MoE collective still running over the whole TP group; data
parallelism of the decode attention (Q/O heads and sinks over TP * attention
DP), of the experts (MLP DP), of the embedding and of the LM head.

Paths:
  prefill  attention, full:    NF.qkv_proj (bias, fused RoPE) -> paged KV-cache write
                               -> NF.flash_attention (sinks, window)
           attention, chunked: NF.qkv_proj (bias, fused RoPE, in-kernel cache write)
                               -> NF.segmented_attention (sinks, window)
           then NF.o_proj (+ bias)
           experts:  RMSNorm -> NF.router (bias, top-k then softmax)
                     -> [EP: NF.get_local_expert_affinities] -> NF.build_blockwise_mapping
                     -> NF.moe_cte (biases, clamped Swish)
  decode   attention: NF.attention_decode (fused QKV, RoPE, paged attention with sinks,
                      cache write, O projection) with the step's sliding-window or full
                      mask, both built once per step by the backbone (or in the kernel
                      from pos_ids / swa_start_pos_ids)
           experts:   NF.moe_block_tkg (fused RMSNorm, router, top-k, local experts)

The router weight and bias are kept in the model dtype (bf16 in production)
and the routing computed in float32. The KV cache may be FP8 (static scales).

ANNOTATION GUIDE (codemods anchor on these markers; keep them when editing):
  # >>> PARALLELISM: <what> <<<    parallelism plumbing, kept across ports
  # <-- MODEL-SPECIFIC: <what>     what changes when porting another architecture
  # <-- QUANTIZATION: <what>       FP8 KV-cache handling
"""

import logging
import math

import nki.language as nl
import torch
from nkilib.core.moe.moe_cte.moe_cte import MoECTEImplementation
from nkilib.core.utils.common_types import ActFnType, ExpertAffinityScaleMode, RouterActFnType
from torch import nn
from transformers import PretrainedConfig
from vllm.config import get_current_vllm_config
from vllm.distributed.parallel_state import get_tp_group
from vllm.model_executor.models.interfaces import SupportsEagle3

import vllm_neuron.functional as NF
import vllm_neuron.nn as neuron_nn
from vllm_neuron.model.kv_cache import KVSpec, LayerSpec
from vllm_neuron.model.neuron_config import NeuronConfig
from vllm_neuron.nn.embedding import VocabDimShardedEmbedding
from vllm_neuron.nn.sampler import Sampler
from vllm_neuron.parallel.neuron_parallel_state import (
    get_neuron_attention_dp_group,
    get_neuron_attention_dp_rank,
    get_neuron_attention_tp_group,
    get_neuron_embedding_dp_group,
    get_neuron_embedding_tp_group,
    get_neuron_ep_degree,
    get_neuron_ep_rank,
    get_neuron_ep_tp_group,
    get_neuron_lm_head_dp_group,
    get_neuron_lm_head_tp_group,
    get_neuron_mlp_dp_group,
    get_neuron_mlp_tp_group,
)
from vllm_neuron.utils.checkpoints import SafetensorsCheckpoint
from vllm_neuron.utils.dtype_utils import FP8_CLAMP_MAX, validate_fp8_segmented_supported
from vllm_neuron.utils.weight_loader import (
    SafetensorsWeightLoader,
    expert_parallel_tensor_dim_loader,
    fused_qkv_weight_loader,
    scaled_bias_loader,
    set_weight_loader,
    sharding_weight_loader,
    with_rank_override,
)
from vllm_neuron.vllm.spec_decode.decorator import async_speculative_decoding

from .config import GptOssConfig

logger = logging.getLogger(__name__)

_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# the MoE kernels' compute dtype for each model dtype
_NKI_DTYPES = {torch.float32: nl.float32, torch.bfloat16: nl.bfloat16, torch.float16: nl.float16}
# decode runs every local expert once the step routes at least this many
# tokens per local expert on average (the kernel then skips the selection)
_ALL_EXPERTS_LOAD = 1.0


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


def _refuse_trimmed_block_table(meta, layer_name: str) -> None:
    """A runner that trims the block tables of sliding layers to the window
    passes ``swa_kv_pos_offset``; the decode masks here assume whole tables."""
    if meta.get("swa_kv_pos_offset") is not None:
        raise NotImplementedError(
            f"{layer_name}: block tables trimmed to the sliding window (swa_kv_pos_offset) are not supported"
        )


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
    """q: [Nq, T, Dh], k: [Nkv, T, Dh], cos/sin: [T, Dh].

    This model rotates q and k inside the kernels (``NF.qkv_proj`` with
    ``cos_cache``/``sin_cache`` in prefill, ``NF.attention_decode`` in decode);
    the function is kept for ports that rotate outside them."""
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
# Mixed: PARALLELISM (head sharding over TP and attention DP, SP gather/scatter,
#        collectives) +
#        MODEL-SPECIFIC (GQA, Q/K/V and O biases, attention sinks, sliding window,
#        RoPE fused into the kernels)
# =============================================================================


def fused_qkv_bias_loader(
    q_size,
    kv_size,
    num_shards,
    num_kv_replicas=1,
    attention_dp_rank=0,
    attention_dp_size=1,
    kv_sharded_across_attention_dp=False,
):
    """Loader for a fused [q | k | v] bias from the separate q, k and v
    biases, sharded like ``fused_qkv_weight_loader`` shards the weight.

    The query bias is cut at this rank's Q shard over TP * attention DP
    (``attention_dp_rank + tp_rank * attention_dp_size``); the key and value
    biases at the KV head this rank holds (ranks share one when there are
    fewer KV heads than ranks), or at the Q shard when the K/V heads are
    sharded over attention DP too.
    """

    def transform(slices, rank):
        if len(slices) != 3:
            raise ValueError(f"fused QKV bias expects q, k and v tensors, got {len(slices)}")
        tp_rank = rank % num_shards
        q_rank = attention_dp_rank + tp_rank * attention_dp_size
        kv_rank = q_rank if kv_sharded_across_attention_dp else tp_rank // num_kv_replicas
        q = slices[0][q_rank * q_size : (q_rank + 1) * q_size]
        k = slices[1][kv_rank * kv_size : (kv_rank + 1) * kv_size]
        v = slices[2][kv_rank * kv_size : (kv_rank + 1) * kv_size]
        return torch.cat([q, k, v], dim=0)

    return SafetensorsWeightLoader(transform)


class GptOssAttention(nn.Module):
    """Grouped-query attention with projection biases, per-head sinks, an
    optional sliding window and a paged KV cache.

    Sharding: Q and O heads over ``effective_q_shards = TP * attention DP``
    (the decode kernel exchanges heads across the attention-DP ranks, each of
    which attends for its own batch); K/V heads over TP (replicated when
    fewer than the TP ranks), and over attention DP too when there are
    enough of them (``kv_needs_a2a``), the cache keeping the TP share. Each
    rank keeps the sinks of every head it attends with after the exchange
    (its TP share of the heads).
    """

    def __init__(self, config: GptOssConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size
        self.num_attention_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        neuron_config = config.neuron_config
        # <-- MODEL-SPECIFIC: sliding-window attention (window in tokens, None: full attention)
        self.sliding_window = _layer_sliding_window(config, layer_idx)

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group

        # >>> PARALLELISM: attention data parallelism (decode Q/O over TP * attention DP) <<<
        self.attention_dp_size = neuron_config.attention_dp_size if neuron_config else 1
        self.attention_dp_group = get_neuron_attention_dp_group()
        self.attention_dp_rank = get_neuron_attention_dp_rank()
        # the TP * attention-DP supergroup that sums the decode output
        self.attn_tp_group = get_neuron_attention_tp_group()
        effective_q_shards = self.world_size * self.attention_dp_size

        # >>> PARALLELISM: Head sharding calculation <<<
        self.num_attention_heads_per_rank = self.num_attention_heads // effective_q_shards
        # the cache holds the TP share of the KV heads, whatever attention DP does
        if self.world_size >= self.num_key_value_heads:
            self.num_key_value_heads_per_rank = 1
            self.num_kv_replicas = self.world_size // self.num_key_value_heads
        else:
            self.num_key_value_heads_per_rank = self.num_key_value_heads // self.world_size
            self.num_kv_replicas = 1
        # K/V weights sharded over attention DP too when the heads divide
        # evenly; the decode kernel then exchanges K/V like Q (all-to-all)
        self.kv_needs_a2a = (
            self.attention_dp_size > 1
            and self.num_key_value_heads > self.world_size
            and self.num_key_value_heads % effective_q_shards == 0
        )
        if self.kv_needs_a2a:
            self.num_kv_heads_for_weight = self.num_key_value_heads // effective_q_shards
        else:
            self.num_kv_heads_for_weight = self.num_key_value_heads_per_rank
        self.num_key_value_groups = self.num_attention_heads_per_rank // self.num_kv_heads_for_weight
        # heads the decode attention sees after the attention-DP exchange
        self.num_q_heads_after_a2a = self.num_attention_heads_per_rank * self.attention_dp_size

        # <-- MODEL-SPECIFIC: fused QKV, stored [hidden, q|k|v]; O stored [q, hidden]; both with biases
        self.q_size = self.num_attention_heads_per_rank * self.head_dim
        self.kv_size = self.num_kv_heads_for_weight * self.head_dim
        qkv_size = self.q_size + 2 * self.kv_size
        self.qkv_split_indices = [self.q_size, self.q_size + self.kv_size]
        o_proj_in_features = self.num_attention_heads * self.head_dim // effective_q_shards
        self.qkv_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, qkv_size, dtype=self.dtype)
        )
        self.qkv_proj_bias = nn.Parameter(torch.zeros(qkv_size, dtype=self.dtype))
        self.o_proj_weight = nn.Parameter(
            torch.empty(o_proj_in_features, self.hidden_size, dtype=self.dtype)
        )
        self.o_proj_bias = nn.Parameter(torch.zeros(self.hidden_size, dtype=self.dtype))
        # <-- MODEL-SPECIFIC: one learned sink logit per query head (float32), for
        # every head this rank attends with after the attention-DP exchange
        self.sinks = nn.Parameter(torch.zeros(self.num_q_heads_after_a2a, dtype=torch.float32))

        # Paged KV cache, bound by bind_kv_cache()
        self.k_cache = None
        self.v_cache = None
        # <-- QUANTIZATION: FP8 KV-cache scales, set by _load_kv_cache_scales
        # (quantize: x * scale); the floats are baked into the decode call
        self.register_buffer("k_scale", None, persistent=False)
        self.register_buffer("v_scale", None, persistent=False)
        self.k_scale_float = 1.0
        self.v_scale_float = 1.0

        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: TP (and attention-DP) sharding of the QKV and O projections and the sinks. <<<

        Q and O (and their biases) are sharded over TP * attention DP: their
        shard of rank ``(tp rank, attention-DP rank)`` is ``attention_dp_rank
        + tp_rank * attention_dp_size``. The fused loaders take the
        attention-DP position themselves (K/V use the TP rank unless
        ``kv_needs_a2a``); the O loader is pinned to that rank with
        ``with_rank_override``. The sinks are the TP share of the heads: the
        Q shards of every attention-DP rank at this TP position.
        """
        effective_q_shards = self.world_size * self.attention_dp_size
        effective_q_rank = self.attention_dp_rank + self.rank * self.attention_dp_size
        o_shard_size = self.num_attention_heads * self.head_dim // effective_q_shards
        # <-- MODEL-SPECIFIC: separate q/k/v checkpoint tensors (weights and biases) fused on load
        qkv_loader = fused_qkv_weight_loader(
            q_size=self.q_size,
            kv_size=self.kv_size,
            shard_dim=1,
            num_shards=self.world_size,
            is_storage_transposed=True,
            num_kv_replicas=self.num_kv_replicas,
            attention_dp_rank=self.attention_dp_rank,
            attention_dp_size=self.attention_dp_size,
            kv_sharded_across_attention_dp=self.kv_needs_a2a,
        )
        set_weight_loader(self.qkv_proj_weight, qkv_loader)
        qkv_bias_loader = fused_qkv_bias_loader(
            q_size=self.q_size,
            kv_size=self.kv_size,
            num_shards=self.world_size,
            num_kv_replicas=self.num_kv_replicas,
            attention_dp_rank=self.attention_dp_rank,
            attention_dp_size=self.attention_dp_size,
            kv_sharded_across_attention_dp=self.kv_needs_a2a,
        )
        set_weight_loader(self.qkv_proj_bias, qkv_bias_loader)
        o_loader = sharding_weight_loader(
            shard_dim=0,
            shard_size=o_shard_size,
            num_shards=effective_q_shards,
            is_storage_transposed=True,
        )
        o_loader = with_rank_override(o_loader, rank=effective_q_rank)
        set_weight_loader(self.o_proj_weight, o_loader)
        # The O bias is added to every rank's partial sum before the reduction.
        o_bias_loader = scaled_bias_loader(scale=effective_q_shards)
        set_weight_loader(self.o_proj_bias, o_bias_loader)
        sinks_loader = sharding_weight_loader(
            shard_dim=0,
            shard_size=self.num_q_heads_after_a2a,
            num_shards=self.world_size,
        )
        set_weight_loader(self.sinks, sinks_loader)

    def forward(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: object | None = None,
        attn_mask: torch.Tensor | None = None,
    ):
        """>>> PARALLELISM: dispatch to the prefill or decode path. <<<

        ``attn_mask`` is the decode mask the backbone built for the step and
        this layer's window (None: the decode kernel builds it from the
        positions)."""
        meta = attn_metadata[f"layers.{self.layer_idx}.self_attn"]
        if meta["max_query_len"] <= meta["decode_token_threshold"]:
            return self.forward_decode(
                hidden_states, positions, position_embeddings, attn_mask, attn_metadata
            )
        # >>> PARALLELISM: All-gather from SP before attention <<<
        if self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
        return self.forward_prefill(hidden_states, positions, position_embeddings, attn_metadata)

    # -- prefill ----------------------------------------------------------------

    def _write_paged_kv_cache(self, k, v, slot_mapping, block_size):
        """Write k, v ([Nkv, T, Dh]) at ``slot_mapping`` of the paged cache
        [blocks, Nkv, block, Dh]."""
        heads = self.num_key_value_heads_per_rank
        k_rows = k.reshape(-1, self.head_dim)
        v_rows = v.reshape(-1, self.head_dim)
        if self.k_cache.dtype in _FP8_DTYPES:
            # <-- QUANTIZATION: FP8 cache entries are x * scale, clamped to the FP8 range
            k_rows = (k_rows * self.k_scale).clamp(-FP8_CLAMP_MAX, FP8_CLAMP_MAX)
            v_rows = (v_rows * self.v_scale).clamp(-FP8_CLAMP_MAX, FP8_CLAMP_MAX)
        index = (
            (slot_mapping // block_size).repeat(heads),
            torch.arange(heads, dtype=torch.long, device=slot_mapping.device).repeat_interleave(
                slot_mapping.shape[0]
            ),
            (slot_mapping % block_size).repeat(heads),
        )
        self.k_cache.index_put_(index, k_rows.to(self.k_cache.dtype))
        self.v_cache.index_put_(index, v_rows.to(self.v_cache.dtype))

    def _own_sinks(self) -> torch.Tensor:
        """The sink logits ([Nq, 1]) of the heads this rank projects itself
        (its Q shard; prefill attends without the attention-DP exchange)."""
        first = self.attention_dp_rank * self.num_attention_heads_per_rank
        return self.sinks[first : first + self.num_attention_heads_per_rank].unsqueeze(1)

    def forward_prefill(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: object | None = None,
    ) -> torch.Tensor:
        """One sequence (or one chunk of it) of T tokens: [T, H] in,
        [T / world_size, H] out (SP)."""
        if attn_metadata is None:
            return torch.zeros_like(hidden_states)
        hidden_states = hidden_states.to(self.dtype)
        tokens = hidden_states.shape[0]

        # >>> PARALLELISM: the paged cache holds this rank's KV heads <<<
        meta = attn_metadata[f"layers.{self.layer_idx}.self_attn"]
        slot_mapping = meta["slot_mapping"]
        block_size = meta["block_size"]
        block_table = meta["block_table_tensor"]
        cached_seq_len = meta.get("cached_seq_len")
        kv_segment_size = meta.get("kv_segment_size")
        kv_is_fp8 = self.k_cache.dtype in _FP8_DTYPES

        # <-- MODEL-SPECIFIC: rotate-half RoPE, applied by the QKV kernel ([1, T, Dh] tables)
        cos, sin = position_embeddings
        cos_cache = cos.unsqueeze(0)
        sin_cache = sin.unsqueeze(0)

        # <-- MODEL-SPECIFIC: causal attention with sink logits ([Nq, 1]) and the layer's window
        if kv_segment_size:
            # Chunked prefill: the kernel also writes the rotated K and V into
            # the paged cache (bf16 only: the segmented kernel cannot read a
            # non-packed FP8 cache), and only q comes back to attend with.
            validate_fp8_segmented_supported(kv_is_fp8, fp8_packed=False)
            in_cache = (slot_mapping >= 0) & (slot_mapping < self.k_cache.shape[0] * block_size)
            kernel_slots = torch.where(in_cache, slot_mapping, torch.zeros_like(slot_mapping))
            q_flat, _, _ = NF.qkv_proj(
                hidden=hidden_states.unsqueeze(0),
                qkv_weights=self.qkv_proj_weight,
                bias=self.qkv_proj_bias.unsqueeze(0),
                d_head=self.head_dim,
                cos_cache=cos_cache,
                sin_cache=sin_cache,
                num_q_heads=self.num_attention_heads_per_rank,
                num_kv_heads=self.num_kv_heads_for_weight,
                k_cache=self.k_cache,
                v_cache=self.v_cache,
                use_block_kv=True,
                block_size=block_size,
                slot_mapping=kernel_slots.to(torch.int32),
            )
            q = q_flat.squeeze(0).view(tokens, self.num_attention_heads_per_rank, self.head_dim)
            q = q.transpose(0, 1)
            # the chunk's K/V are in the cache already (written by the QKV kernel)
            attn_output = NF.segmented_attention(
                q,
                k_cache=self.k_cache,
                v_cache=self.v_cache,
                block_tables=block_table,
                prior_tokens=cached_seq_len,
                block_size=block_size,
                kv_segment_size=kv_segment_size,
                scale=self.scaling,
                sliding_window=self.sliding_window,
                sink=self._own_sinks(),
                tp_q=True,
                tp_out=True,
            )  # [Nq, Dh, T]
        else:
            # Whole prompt: the kernel returns q|k|v; the cache is written here
            # and flash attention takes the step's K/V directly.
            qkv = NF.qkv_proj(
                hidden=hidden_states.unsqueeze(0),
                qkv_weights=self.qkv_proj_weight,
                bias=self.qkv_proj_bias.unsqueeze(0),
                d_head=self.head_dim,
                cos_cache=cos_cache,
                sin_cache=sin_cache,
                num_q_heads=self.num_attention_heads_per_rank,
                num_kv_heads=self.num_kv_heads_for_weight,
            ).squeeze(0)
            q, k, v = torch.tensor_split(qkv, self.qkv_split_indices, dim=-1)
            q = q.view(tokens, self.num_attention_heads_per_rank, self.head_dim).transpose(0, 1)
            k = k.view(tokens, self.num_key_value_heads_per_rank, self.head_dim).transpose(0, 1)
            v = v.view(tokens, self.num_key_value_heads_per_rank, self.head_dim).transpose(0, 1)
            self._write_paged_kv_cache(k, v, slot_mapping, block_size)
            k = k.repeat_interleave(self.num_key_value_groups, dim=0)
            v = v.repeat_interleave(self.num_key_value_groups, dim=0)
            attn_output = NF.flash_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v,
                scale=self.scaling,
                sink=self._own_sinks(),
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

    # -- decode -----------------------------------------------------------------

    def forward_decode(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attn_mask: torch.Tensor | None,
        attn_metadata: object,
    ):
        """B sequences of S new tokens each: [B * S, H] in and out.

        With attention DP the rows hold the batches of every attention-DP
        rank (the decoder layer gathered them); the block table, positions
        and slots are this rank's."""
        layer_name = f"layers.{self.layer_idx}.self_attn"
        meta = attn_metadata[layer_name]
        slot_mapping = meta["slot_mapping"]
        block_table = meta["block_table_tensor"]

        local_batch = block_table.shape[0]
        # >>> PARALLELISM: the gathered batch of the attention-DP ranks <<<
        batch = local_batch * self.attention_dp_size
        tokens = hidden_states.shape[0]
        new_tokens = tokens // batch
        x = hidden_states.to(self.dtype).view(batch, new_tokens, self.hidden_size)

        # Kernel RoPE layout [Dh/2, B, S], for this rank's batch
        cos, sin = position_embeddings
        half = self.head_dim // 2
        cos_kernel = cos[:, :half].reshape(local_batch, new_tokens, half).permute(2, 0, 1)
        sin_kernel = sin[:, :half].reshape(local_batch, new_tokens, half).permute(2, 0, 1)
        cos_kernel = cos_kernel.contiguous().to(self.dtype)
        sin_kernel = sin_kernel.contiguous().to(self.dtype)

        # <-- MODEL-SPECIFIC: the step's mask from the backbone; without one the
        # kernel builds it from the positions, masking prior positions before
        # p - window + 1 on sliding layers
        pos_ids = None
        swa_start_pos_ids = None
        if attn_mask is None:
            pos_ids = positions.view(local_batch, new_tokens).to(torch.float32)
            if self.sliding_window is not None:
                _refuse_trimmed_block_table(meta, layer_name)
                swa_start_pos_ids = torch.clamp(pos_ids - (self.sliding_window - 1), min=0)

        cache_is_fp8 = self.k_cache.dtype in _FP8_DTYPES
        output = NF.attention_decode(
            X=x,
            X_hidden_dim_actual=self.hidden_size,
            rmsnorm_X_enabled=False,
            W_qkv=self.qkv_proj_weight,
            bias_qkv=self.qkv_proj_bias.unsqueeze(0),
            rmsnorm_QK_pre_rope_enabled=False,
            rmsnorm_QK_post_rope_enabled=False,
            cos=cos_kernel,
            sin=sin_kernel,
            rope_contiguous_layout=True,
            K_cache_transposed=False,
            active_blocks_table=block_table,
            K_cache=self.k_cache,
            V_cache=self.v_cache,
            attention_mask=attn_mask,
            pos_ids=pos_ids,
            swa_start_pos_ids=swa_start_pos_ids,
            # <-- MODEL-SPECIFIC: sink logits of every head after the attention-DP exchange ([Nq, 1])
            sink=self.sinks.unsqueeze(1),
            # <-- QUANTIZATION: FP8 K is dequantized through the softmax scale
            softmax_scale=self.scaling / self.k_scale_float,
            update_cache=True,
            kv_cache_update_idx=slot_mapping.view(local_batch, new_tokens).to(torch.uint32),
            # <-- QUANTIZATION: FP8 V is dequantized through the output projection
            W_out=self.o_proj_weight / self.v_scale_float,
            bias_out=self.o_proj_bias.unsqueeze(0),
            transposed_out=False,
            out_in_sb=False,
            k_scale=self.k_scale if cache_is_fp8 else None,
            v_scale=self.v_scale if cache_is_fp8 else None,
            attention_dp=self.attention_dp_size,
            attention_dp_group=self.attention_dp_group.device_group if self.attention_dp_group else None,
            attention_dp_rank=self.attention_dp_rank,
            kv_needs_a2a=self.kv_needs_a2a,
        )

        # >>> PARALLELISM: sum the partial outputs over the TP * attention-DP supergroup <<<
        output = self.attn_tp_group.all_reduce(output)
        return output


# =============================================================================
# Section 4: MoE Experts
# Mixed: PARALLELISM (expert partitions over EP ranks, intermediate sharding,
#                     SP gather/scatter, collectives) +
#        MODEL-SPECIFIC (router with bias, top-k then softmax, clamped SwiGLU
#                        experts with biases)
# =============================================================================


def expert_gate_up_loader(intermediate_per_rank, num_shards, hidden_size):
    """Loader for the stacked gate|up weight [E, H, 2 * I/t] of the experts it is given.

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
    """Loader for the stacked gate|up bias [E, 2 * I/t] from the interleaved
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
    """Loader for the stacked down weight [E, I/t, H] from
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
    of the intermediate dimension (over the MLP TP group: TP * MLP DP). With
    it, EP rank k holds experts [k * L, (k + 1) * L), sharded over the
    ``tp_degree`` ranks of its partition; the partial sums of all ranks (all
    experts, all slices) add up to the output, so the collectives stay on the
    whole TP group.
    """

    def __init__(self, config: GptOssConfig):
        super().__init__()
        self.dtype = config.torch_dtype
        self.compute_dtype = _NKI_DTYPES[self.dtype]
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
        neuron_config = config.neuron_config

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group

        # >>> PARALLELISM: MLP data parallelism: the MLP TP group spans TP * MLP DP <<<
        self.mlp_dp_size = neuron_config.mlp_dp_size if neuron_config else 1
        self.mlp_tp_group = get_neuron_mlp_tp_group()
        self.mlp_tp_rank = self.mlp_tp_group.rank_in_group

        # >>> PARALLELISM: expert parallelism inside the TP world <<<
        parallel_config = get_current_vllm_config().parallel_config
        self.ep_enabled = parallel_config.enable_expert_parallel
        if self.ep_enabled and parallel_config.data_parallel_size > 1:
            raise NotImplementedError(
                "GptOssExperts: expert parallelism across data-parallel replicas (cross-DP EP) "
                "is not supported; EP runs inside the TP world"
            )
        if self.ep_enabled:
            self.ep_degree = get_neuron_ep_degree()
            self.ep_rank = get_neuron_ep_rank()
            self.ep_tp_group = get_neuron_ep_tp_group()
            self.tp_degree = self.ep_tp_group.world_size
        else:
            self.ep_degree = 1
            self.ep_rank = 0
            self.ep_tp_group = self.tp_group
            self.tp_degree = self.mlp_tp_group.world_size
        # the group summing the experts' partial outputs in decode
        self.moe_group = self.tp_group if self.ep_enabled else self.mlp_tp_group
        if self.num_experts % self.ep_degree != 0:
            raise ValueError(
                f"{self.num_experts} experts do not split into {self.ep_degree} EP partitions"
            )
        # Linear placement: EP rank k owns experts [k * L, (k + 1) * L)
        self.num_local_experts = self.num_experts // self.ep_degree
        self.local_expert_start = self.ep_rank * self.num_local_experts

        # >>> PARALLELISM: the intermediate dim sharded over the ranks of a partition <<<
        self.intermediate_size_per_rank = self.intermediate_size // self.tp_degree

        # <-- MODEL-SPECIFIC: pre-MoE RMSNorm (the decoder layer's post-attention norm)
        self.post_attention_layernorm = GptOssRMSNorm(config.hidden_size, config.rms_norm_eps)
        # >>> PARALLELISM: router replicated on every rank (not EP-sharded) <<<
        # <-- MODEL-SPECIFIC: router [E, H] and its bias [E] in the model dtype; the routing runs in float32
        self.router_weight = nn.Parameter(
            torch.empty(self.num_experts, self.hidden_size, dtype=self.dtype)
        )
        self.router_bias = nn.Parameter(torch.zeros(self.num_experts, dtype=self.dtype))
        # <-- MODEL-SPECIFIC: experts with biases; gate|up stacked [E_L, H, 2 * I/t], down [E_L, I/t, H]
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
        """>>> PARALLELISM: each rank loads its experts (EP) and its intermediate slice. <<<

        The loaders are built for this rank's experts; with EP they see only
        those (``expert_parallel_tensor_dim_loader`` on the stacked
        checkpoint tensors), with MLP DP they read the slice of this rank's
        place in the MLP TP group. The router is loaded whole."""
        local_expert_indices = list(
            range(self.local_expert_start, self.local_expert_start + self.num_local_experts)
        )
        gate_up_loader = expert_gate_up_loader(
            intermediate_per_rank=self.intermediate_size_per_rank,
            num_shards=self.tp_degree,
            hidden_size=self.hidden_size,
        )
        gate_up_bias_loader = expert_gate_up_bias_loader(
            intermediate_per_rank=self.intermediate_size_per_rank,
            num_shards=self.tp_degree,
            up_offset=self.up_offset,
        )
        down_loader = expert_down_loader(
            intermediate_per_rank=self.intermediate_size_per_rank,
            num_shards=self.tp_degree,
            hidden_size=self.hidden_size,
        )
        # The down bias is added to the partial sum of each rank of a partition.
        down_bias_loader = scaled_bias_loader(scale=self.tp_degree)
        if self.ep_degree > 1:
            gate_up_loader = expert_parallel_tensor_dim_loader(local_expert_indices, gate_up_loader)
            gate_up_bias_loader = expert_parallel_tensor_dim_loader(local_expert_indices, gate_up_bias_loader)
            down_loader = expert_parallel_tensor_dim_loader(local_expert_indices, down_loader)
            down_bias_loader = expert_parallel_tensor_dim_loader(local_expert_indices, down_bias_loader)
        if self.mlp_dp_size > 1:
            gate_up_loader = with_rank_override(gate_up_loader, rank=self.mlp_tp_rank)
            gate_up_bias_loader = with_rank_override(gate_up_bias_loader, rank=self.mlp_tp_rank)
            down_loader = with_rank_override(down_loader, rank=self.mlp_tp_rank)
        set_weight_loader(self.gate_up_proj_weight, gate_up_loader)
        set_weight_loader(self.gate_up_proj_bias, gate_up_bias_loader)
        set_weight_loader(self.down_proj_weight, down_loader)
        set_weight_loader(self.down_proj_bias, down_bias_loader)

    def forward(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor,
        is_decode: bool,
        rank: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if is_decode:
            return self.forward_decode(hidden_states, rank)
        return self.forward_prefill(hidden_states, positions, rank)

    def _route(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Normalized hidden states [T, H] -> float32 affinities [T, E], zero
        for the experts a token does not use."""
        # <-- MODEL-SPECIFIC: logits with the router bias, top-k of the logits, then a
        # softmax over those k (NF.router's default order)
        return NF.router(
            hidden_states=hidden_states,
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
        [E_L, H, 2, I/t] and [E_L, 2, I/t], down [E_L, I/t, H] and [E_L, H]."""
        gate_up = self.gate_up_proj_weight.reshape(
            self.num_local_experts, self.hidden_size, 2, self.intermediate_size_per_rank
        )
        gate_up_bias = self.gate_up_proj_bias.reshape(
            self.num_local_experts, 2, self.intermediate_size_per_rank
        )
        return gate_up, gate_up_bias, self.down_proj_weight, self.down_proj_bias

    def _experts_blockwise(self, hidden_states, expert_affinities, padding_mask=None, rank=None):
        """This rank's experts on the tokens routed to them, in blocks:
        normalized hidden states [T, H] and local affinities [T, E_L] in,
        partial sums [T, H] out."""
        # >>> PARALLELISM: the mapping is built over the ranks sharing this rank's experts <<<
        affinities_masked, token_position_to_id, block_to_expert, conditions = (
            NF.build_blockwise_mapping(
                expert_affinities=expert_affinities,
                num_local_experts=self.num_local_experts,
                num_experts_per_token=self.num_experts_per_token,
                block_size=self.block_size,
                moe_group=self.ep_tp_group,
                tp_degree=self.tp_degree,
                padding_mask=padding_mask,
                rank=rank,
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
            down_proj_bias=down_bias.unsqueeze(1),
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
            compute_dtype=self.compute_dtype,
        )

    def _run_moe_block_tkg(self, hidden_states):
        """Decode in one kernel: norm, router, top-k and this rank's experts;
        [T, H] partial sums out."""
        tokens = hidden_states.shape[0]
        # >>> PARALLELISM: with EP (or enough tokens) the kernel runs all local experts of rank_id <<<
        expert_load = tokens * self.num_experts_per_token / self.num_local_experts
        use_all_experts = expert_load >= _ALL_EXPERTS_LOAD or self.ep_degree > 1
        rank_id = None
        if use_all_experts:
            rank_id = torch.full((1, 1), self.ep_rank, dtype=torch.int32, device=hidden_states.device)
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
            hidden_actual=self.hidden_size,
            is_all_expert=use_all_experts,
            skip_router_logits=True,
        )
        return output.view(tokens, self.hidden_size)

    def forward_prefill(self, hidden_states: torch.Tensor, positions: torch.Tensor, rank=None):
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
        output = self._experts_blockwise(hidden_states, expert_affinities, padding_mask, rank)

        # >>> PARALLELISM: Reduce-scatter the partial sums (all experts, all slices) back to SP <<<
        if self.world_size > 1:
            output = self.tp_group.reduce_scatter(output, dim=0)
        return output

    def forward_decode(self, hidden_states: torch.Tensor, rank=None):
        """[B * S, H] in and out (the batches of every MLP-DP rank)."""
        output = self._run_moe_block_tkg(hidden_states)

        # >>> PARALLELISM: sum the partial outputs of all ranks <<<
        if self.moe_group.world_size > 1:
            output = self.moe_group.all_reduce(output)
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

    def forward(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor,
        is_decode: bool,
        rank: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.experts(
            hidden_states.to(self.dtype), positions=positions, is_decode=is_decode, rank=rank
        )


# =============================================================================
# Section 6: Decoder Layer
# Mixed: PARALLELISM (decode batch transitions between DP groups) +
#        MODEL-SPECIFIC (pre-norm residual blocks; the MoE applies its own norm)
# =============================================================================


def _dp_transition(x: torch.Tensor, current_group, target_group, dim: int = 0) -> torch.Tensor:
    """>>> PARALLELISM: move a decode batch from one DP gathered state to another. <<<

    ``x`` holds the batches of ``current_group``'s ranks (concatenated on
    ``dim``); the result holds those of ``target_group``'s. DP groups are
    nested, so a smaller target keeps a contiguous run of batches and a
    larger one gathers this rank's own batch over the target group."""
    current = current_group.world_size
    target = target_group.world_size
    if current == target:
        return x
    per_rank = x.shape[dim] // current
    if current > target:
        first = (current_group.rank_in_group // target) * target
        return x.narrow(dim, first * per_rank, target * per_rank)
    own = x.narrow(dim, current_group.rank_in_group * per_rank, per_rank)
    return target_group.all_gather(own, dim=dim)


def _decode_attn_mask(attn_metadata, layer_idx: int, positions, q_heads: int, window: int | None):
    """The decode mask ([S_ctx, B, q_heads, S]) of the layers like
    ``layer_idx``: causal over the prior and active tokens, and with a
    ``window`` masking prior positions before p - window + 1."""
    layer_name = f"layers.{layer_idx}.self_attn"
    meta = attn_metadata[layer_name]
    block_size = meta["block_size"]
    local_batch = meta["block_table_tensor"].shape[0]
    new_tokens = positions.shape[0] // local_batch
    pos_ids = positions.reshape(1, local_batch * new_tokens).to(torch.float32)
    start_pos = None
    if window is not None:
        _refuse_trimmed_block_table(meta, layer_name)
        start_pos = torch.clamp(pos_ids - (window - 1), min=0)
    return NF.gen_attention_decode_mask(
        pos_ids=pos_ids,
        bs=local_batch,
        q_head=q_heads,
        s_active=new_tokens,
        s_prior=meta["max_blocks_per_seq"] * block_size,
        start_pos=start_pos,
        block_len=block_size,
    )


def _precompute_decode_attn_masks(attn_metadata, positions, q_heads: int, windows: list[int | None]):
    """The step's two decode masks, built once by the backbone instead of in
    each layer: ``(sliding, full)`` for the sliding-window layers and the
    full-attention layers (``windows`` holds each layer's window; a mask no
    layer uses is None). ``q_heads`` are the heads a rank attends with after
    the attention-DP exchange."""
    sliding = next((index for index, window in enumerate(windows) if window is not None), None)
    full = next((index for index, window in enumerate(windows) if window is None), None)
    sliding_mask = None
    if sliding is not None:
        sliding_mask = _decode_attn_mask(attn_metadata, sliding, positions, q_heads, windows[sliding])
    full_mask = None
    if full is not None:
        full_mask = _decode_attn_mask(attn_metadata, full, positions, q_heads, None)
    return sliding_mask, full_mask


class GptOssDecoderLayer(nn.Module):
    """Pre-norm decoder layer: a decode ``forward`` (with the DP batch
    transitions) and a ``_forward_prefill`` (SP layout). The post-attention
    norm lives in the experts (fused in the decode kernel)."""

    def __init__(self, config: GptOssConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        # <-- MODEL-SPECIFIC: pre-attention RMSNorm
        self.input_layernorm = GptOssRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = GptOssAttention(config, layer_idx=layer_idx)
        self.mlp = GptOssMLP(config)

        # >>> PARALLELISM: DP groups of the decode batch transitions <<<
        self.attn_dp_group = get_neuron_attention_dp_group()
        self.mlp_dp_group = get_neuron_mlp_dp_group()

    def _is_decode(self, attn_metadata) -> bool:
        meta = attn_metadata[f"layers.{self.layer_idx}.self_attn"]
        return meta["max_query_len"] <= meta["decode_token_threshold"]

    def forward(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: object | None = None,
        attn_mask: torch.Tensor | None = None,
        rank: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not self._is_decode(attn_metadata):
            return self._forward_prefill(
                hidden_states, positions, position_embeddings, attn_metadata, rank
            )

        # >>> PARALLELISM: decode rows arrive in the MLP-DP state; attention runs in the attention-DP one <<<
        hidden_states = _dp_transition(hidden_states, self.mlp_dp_group, self.attn_dp_group)

        residual = hidden_states
        # <-- MODEL-SPECIFIC: pre-attention RMSNorm
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(
            hidden_states=hidden_states,
            positions=positions,
            position_embeddings=position_embeddings,
            attn_metadata=attn_metadata,
            attn_mask=attn_mask,
        )
        hidden_states = residual + hidden_states

        # >>> PARALLELISM: back to the MLP-DP state <<<
        hidden_states = _dp_transition(hidden_states, self.attn_dp_group, self.mlp_dp_group)

        # The post-attention norm is inside the experts (fused in the decode kernel).
        residual = hidden_states
        hidden_states = self.mlp(hidden_states, positions=positions, is_decode=True, rank=rank)
        return residual + hidden_states

    def _forward_prefill(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: object | None = None,
        rank: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Prefill: rows are this rank's SP slice of the sequence."""
        residual = hidden_states
        # <-- MODEL-SPECIFIC: pre-attention RMSNorm
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(
            hidden_states=hidden_states,
            positions=positions,
            position_embeddings=position_embeddings,
            attn_metadata=attn_metadata,
        )
        hidden_states = residual + hidden_states

        # The post-attention norm is inside the experts.
        residual = hidden_states
        hidden_states = self.mlp(hidden_states, positions=positions, is_decode=False, rank=rank)
        return residual + hidden_states


# =============================================================================
# Section 7: Model Backbone
# Mixed: PARALLELISM (vocabulary-sharded embedding with embedding DP, SP) +
#        MODEL-SPECIFIC (final RMSNorm, decode masks, Eagle3 auxiliary hidden states)
# =============================================================================


class GptOssModel(nn.Module):
    def __init__(self, config: GptOssConfig):
        super().__init__()
        self.config = config
        neuron_config = config.neuron_config

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group

        # >>> PARALLELISM: embedding data parallelism: the embedding TP group spans TP * embedding DP <<<
        self.embedding_dp_size = neuron_config.embedding_dp_size if neuron_config else 1
        embedding_tp_group = get_neuron_embedding_tp_group()
        self.embedding_tp_rank = embedding_tp_group.rank_in_group
        self.embedding_dp_group = get_neuron_embedding_dp_group()
        self.mlp_dp_group = get_neuron_mlp_dp_group()

        # >>> PARALLELISM: vocabulary-sharded embedding <<<
        self.embed_tokens = VocabDimShardedEmbedding(
            vocab_size=config.vocab_size,
            embed_dim=config.hidden_size,
            dtype=config.torch_dtype,
            tp_group=embedding_tp_group.device_group,
        )
        embedding_loader = sharding_weight_loader(
            shard_dim=0,
            shard_size=self.embed_tokens.vocab_size_per_rank,
            num_shards=self.embed_tokens.tp_size,
            is_storage_transposed=False,
            pad_shard=True,
        )
        embedding_loader = with_rank_override(embedding_loader, rank=self.embedding_tp_rank)
        set_weight_loader(self.embed_tokens.weight, embedding_loader)

        self.layers = nn.ModuleList(
            [GptOssDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        # <-- MODEL-SPECIFIC: final RMSNorm
        self.norm = GptOssRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = GptOssRotaryEmbedding(config)

        # Eagle3: indices of the layers whose inputs the drafter reads (set by the drafter)
        self.aux_hidden_state_layers = []

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: object | None = None,
        rank: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        is_token_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        first = attn_metadata["layers.0.self_attn"]
        is_prefill = first["max_query_len"] > first["decode_token_threshold"]

        # >>> PARALLELISM: embedding DP (decode): look up every embedding-DP rank's tokens <<<
        if not is_prefill and self.embedding_dp_size > 1:
            input_ids = self.embedding_dp_group.all_gather(input_ids, dim=0)
        # the rank tensor keeps the vocabulary offsets a runtime value; shift it
        # to this rank's place in the embedding TP group
        embedding_rank = rank
        if rank is not None and self.embedding_dp_size > 1:
            embedding_rank = rank + (self.embedding_tp_rank - self.rank)
        # >>> PARALLELISM: prefill embeddings come back as this rank's SP slice <<<
        hidden_states = self.embed_tokens(input_ids, scatter_tokens=is_prefill, rank=embedding_rank)
        if not is_prefill:
            # >>> PARALLELISM: embedding-DP state -> MLP-DP state for the decoder layers <<<
            hidden_states = _dp_transition(hidden_states, self.embedding_dp_group, self.mlp_dp_group)

        # >>> PARALLELISM: prompt embeddings cut to the SP slice <<<
        if is_prefill and self.world_size > 1 and inputs_embeds is not None and is_token_ids is not None:
            rows = hidden_states.shape[0]
            inputs_embeds = inputs_embeds[self.rank * rows : (self.rank + 1) * rows]
            is_token_ids = is_token_ids[self.rank * rows : (self.rank + 1) * rows]
        hidden_states = NF.merge_prompt_embeds(hidden_states, inputs_embeds, is_token_ids)

        position_embeddings = self.rotary_emb(
            positions, device=hidden_states.device, dtype=hidden_states.dtype
        )
        # <-- MODEL-SPECIFIC: a sliding-window and a full decode mask, built once per step
        sliding_mask = None
        full_mask = None
        if not is_prefill:
            sliding_mask, full_mask = _precompute_decode_attn_masks(
                attn_metadata,
                positions,
                self.layers[0].self_attn.num_q_heads_after_a2a,
                [layer.self_attn.sliding_window for layer in self.layers],
            )

        aux_hidden_states = []
        for layer_idx, layer in enumerate(self.layers):
            if layer_idx in self.aux_hidden_state_layers:
                aux_hidden_states.append(hidden_states)
            # <-- MODEL-SPECIFIC: each layer takes the mask of its kind
            attn_mask = sliding_mask if layer.self_attn.sliding_window is not None else full_mask
            hidden_states = layer(
                hidden_states,
                positions=positions,
                position_embeddings=position_embeddings,
                attn_metadata=attn_metadata,
                attn_mask=attn_mask,
                rank=rank,
            )
        hidden_states = self.norm(hidden_states)

        # >>> PARALLELISM: gather the SP slices for the LM head (and the drafter) <<<
        if is_prefill and self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
            aux_hidden_states = [self.tp_group.all_gather(aux, dim=0) for aux in aux_hidden_states]
        return hidden_states, aux_hidden_states


# =============================================================================
# Section 8: Language Model Head, KV-cache spec and weight loading
# Mixed: PARALLELISM (vocabulary-sharded LM head with LM-head DP) +
#        MODEL-SPECIFIC (tied embeddings, checkpoint key mapping)
# =============================================================================


def _own_rows(sampled, rows: slice):
    """This LM-head-DP rank's rows of the sampler's output: its tokens, or a
    tuple led by them."""
    if isinstance(sampled, tuple):
        return tuple(tensor[rows] for tensor in sampled)
    return sampled[rows]


def _mask_padded_vocabulary(logits: torch.Tensor, vocab_size: int, rank) -> torch.Tensor:
    """This LM-head rank's logits ``[N, V_padded / tp]`` with the columns of
    the vocabulary's padding (ids from ``vocab_size`` on) at -inf, so that a
    sampler over the shards never picks one."""
    width = logits.shape[-1]
    columns = torch.arange(width, device=logits.device) + rank * width
    return logits.masked_fill(columns >= vocab_size, float("-inf"))


@async_speculative_decoding
class GptOssForCausalLM(nn.Module, SupportsEagle3):
    def __init__(self, config: GptOssConfig):
        super().__init__()
        self.config = config
        self.model = GptOssModel(config)
        neuron_config = config.neuron_config

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group

        # >>> PARALLELISM: LM-head data parallelism: the LM-head TP group spans TP * LM-head DP <<<
        self.lm_head_dp_size = neuron_config.lm_head_dp_size if neuron_config else 1
        self.lm_head_tp_group = get_neuron_lm_head_tp_group()
        self.lm_head_dp_group = get_neuron_lm_head_dp_group()
        self.mlp_dp_group = get_neuron_mlp_dp_group()

        self.on_device_sampling_config = (
            neuron_config.on_device_sampling_config if neuron_config is not None else None
        )
        # full logits are gathered when logprobs or logit dumps are asked for
        self._gather_logits = neuron_config is not None and (
            neuron_config.max_logprobs != 0 or neuron_config.debug_logits_dir is not None
        )

        # >>> PARALLELISM: the vocabulary padded to a multiple of the LM-head TP size <<<
        # (ColumnParallelLinear shards evenly: the last shard ends in zero rows, whose
        # logits forward drops or masks)
        self.vocab_size = config.vocab_size
        lm_head_shards = self.lm_head_tp_group.world_size
        padded_vocab_size = -(-config.vocab_size // lm_head_shards) * lm_head_shards
        # <-- MODEL-SPECIFIC: no LM-head bias; a tied LM head loads the embedding (load_weights)
        self.lm_head = neuron_nn.ColumnParallelLinear(
            config.hidden_size,
            padded_vocab_size,
            bias=False,
            dtype=config.torch_dtype,
            gather_output=self.on_device_sampling_config is None,
            tp_group=self.lm_head_tp_group.device_group,
        )
        lm_head_loader = sharding_weight_loader(
            shard_dim=0,
            shard_size=self.lm_head.out_features_per_rank,
            num_shards=self.lm_head.tp_size,
            is_storage_transposed=False,
            pad_shard=True,
        )
        lm_head_loader = with_rank_override(lm_head_loader, rank=self.lm_head_tp_group.rank_in_group)
        set_weight_loader(self.lm_head.weight, lm_head_loader)

        self.sampler = None
        if self.on_device_sampling_config is not None:
            self.sampler = Sampler(
                self.on_device_sampling_config, process_group=self.lm_head_tp_group.device_group
            )

    @classmethod
    def from_configs(
        cls, hf_config: PretrainedConfig, neuron_config: NeuronConfig | None = None
    ) -> "GptOssForCausalLM":
        return cls(GptOssConfig.from_configs(hf_config, neuron_config))

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
        is_token_ids: torch.Tensor | None = None,
        attn_metadata: object | None = None,
        sampling_positions: torch.Tensor | None = None,
        sampling_params: torch.Tensor | None = None,
        spec_decode_metadata=None,
        logit_mask: torch.Tensor | None = None,
        rank: torch.Tensor | None = None,
        **kwargs,
    ):
        positions = positions.to(torch.int32)
        first = attn_metadata["layers.0.self_attn"]
        is_prefill = first["max_query_len"] > first["decode_token_threshold"]
        tokens = input_ids.shape[0]
        # >>> PARALLELISM: SP length validation <<<
        if is_prefill and (tokens <= self.world_size or tokens % self.world_size != 0):
            raise ValueError(
                f"prefill length {tokens} must exceed and be divisible by the TP size {self.world_size}"
            )

        hidden_states, aux_hidden_states = self.model(
            input_ids,
            positions,
            attn_metadata=attn_metadata,
            rank=rank,
            inputs_embeds=inputs_embeds,
            is_token_ids=is_token_ids,
        )

        # >>> PARALLELISM: decode rows come back in the MLP-DP state: keep this rank's batch <<<
        mlp_dp = self.mlp_dp_group.world_size
        if mlp_dp > 1:
            rows = hidden_states.shape[0] // mlp_dp
            first_row = self.mlp_dp_group.rank_in_group * rows
            hidden_states = hidden_states[first_row : first_row + rows]
        if sampling_positions is not None:
            hidden_states = torch.index_select(hidden_states, 0, sampling_positions)

        # >>> PARALLELISM: LM-head DP: compute the logits of every LM-head-DP rank's rows <<<
        if self.lm_head_dp_size > 1:
            hidden_states = self.lm_head_dp_group.all_gather(hidden_states, dim=0)
        logits = self.lm_head(hidden_states)
        gathered_logits = None
        if self._gather_logits:
            gathered_logits = (
                logits if self.lm_head.gather_output else self.lm_head_tp_group.all_gather(logits, dim=1)
            )
            # >>> PARALLELISM: the padded vocabulary's logits dropped <<<
            gathered_logits = gathered_logits[:, : self.vocab_size]
        own_rows = slice(None)
        if self.lm_head_dp_size > 1:
            # >>> PARALLELISM: back to this rank's rows <<<
            rows = logits.shape[0] // self.lm_head_dp_size
            first_row = self.lm_head_dp_group.rank_in_group * rows
            own_rows = slice(first_row, first_row + rows)
            if gathered_logits is not None:
                gathered_logits = gathered_logits[own_rows]

        # Eagle3: the drafter reads the auxiliary hidden states as one tensor
        aux = torch.cat(aux_hidden_states, dim=-1) if aux_hidden_states else None
        if self.sampler is None:
            # >>> PARALLELISM: the padded vocabulary's logits dropped <<<
            logits = logits[own_rows, : self.vocab_size]
            return logits if aux is None else (logits, aux)

        # >>> PARALLELISM: this shard's place in the LM-head TP group, the sampler's group: its
        # padding mask, the sampler's id offset and its logit_mask columns are at this rank <<<
        lm_head_rank = self.lm_head_tp_group.rank_in_group
        if rank is not None:
            lm_head_rank = rank + (lm_head_rank - self.rank)
        # >>> PARALLELISM: the padded vocabulary's columns of this shard never sampled <<<
        if self.lm_head.out_features != self.vocab_size:
            logits = _mask_padded_vocabulary(logits, self.vocab_size, lm_head_rank)
        # >>> PARALLELISM: LM-head DP: the sampler reduces over the LM-head TP group, whose ranks
        # hold the rows of different LM-head-DP ranks once cut back to their own: it samples every
        # LM-head-DP rank's rows (their sampling parameters gathered alike), this rank keeps its own <<<
        if self.lm_head_dp_size > 1 and sampling_params is not None:
            sampling_params = self.lm_head_dp_group.all_gather(sampling_params, dim=0)
        if self.lm_head_dp_size > 1 and logit_mask is not None:
            logit_mask = self.lm_head_dp_group.all_gather(logit_mask, dim=0)
        sampled_tokens = self.sampler(logits, sampling_params, logit_mask=logit_mask, tp_rank=lm_head_rank)
        if self.lm_head_dp_size > 1:
            sampled_tokens = _own_rows(sampled_tokens, own_rows)
        if spec_decode_metadata is not None:
            from vllm_neuron.nn.rejection_sampler import rejection_sampler

            accepted = rejection_sampler(spec_decode_metadata, sampled_tokens)
            return accepted if aux is None else (accepted, aux, gathered_logits)
        if aux is not None:
            return sampled_tokens, aux, gathered_logits
        return sampled_tokens, gathered_logits

    # -- Eagle3 -------------------------------------------------------------------

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        if layers is not None:
            self.model.aux_hidden_state_layers = list(layers)

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        if self.model.aux_hidden_state_layers:
            return tuple(self.model.aux_hidden_state_layers)
        count = len(self.model.layers)
        return (2, count // 2, count - 3)

    # -- KV cache -------------------------------------------------------------------

    def get_kv_spec(self) -> KVSpec:
        # >>> PARALLELISM: per-rank KV heads <<<
        # <-- MODEL-SPECIFIC: the window of each sliding layer
        layers = [
            LayerSpec(
                name=f"layers.{layer_idx}.self_attn",
                num_kv_heads=layer.self_attn.num_key_value_heads_per_rank,
                head_size=layer.self_attn.head_dim,
                dtype=layer.self_attn.dtype,
                sliding_window_size=layer.self_attn.sliding_window,
                chunk_size=None,
            )
            for layer_idx, layer in enumerate(self.model.layers)
        ]
        return KVSpec(layers=layers)

    def bind_kv_cache(self, kv_caches) -> None:
        for layer_idx, layer in enumerate(self.model.layers):
            name = f"layers.{layer_idx}.self_attn"
            if name not in kv_caches:
                raise KeyError(f"no KV cache allocated for {name}")
            layer.self_attn.k_cache = kv_caches[name][0]
            layer.self_attn.v_cache = kv_caches[name][1]

    # -- weights --------------------------------------------------------------------

    def load_weights(self, checkpoint_path: str, device: torch.device, cache_dir: str | None):
        """Load this rank's shard of every parameter from a safetensors
        checkpoint (each tensor in its parameter's dtype), then the FP8
        KV-cache scales."""
        checkpoint = SafetensorsCheckpoint(checkpoint_path, cache_dir)
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
        self._load_kv_cache_scales(checkpoint, device)
        self.load_state_dict(result.state_dict, strict=False, assign=True)
        return result

    def load_weights_lite(self, checkpoint_path: str, device: torch.device, cache_dir: str | None):
        """For CPU compilation: only what becomes a compile-time constant (the
        KV-cache scale floats); the weights stay on the meta device."""
        checkpoint = SafetensorsCheckpoint(checkpoint_path, cache_dir)
        checkpoint._ensure_indexed()
        self._load_kv_cache_scales(checkpoint, device)

    def _load_kv_cache_scales(self, checkpoint: SafetensorsCheckpoint, device: torch.device) -> None:
        """With an FP8 KV cache, each attention's ``k_scale``/``v_scale``
        ([1, 1], 1.0 when the checkpoint has none) and their floats.

        Checkpoints store the dequantization scale (x = q * s); the cache write
        multiplies, so the reciprocal is kept."""
        from vllm_neuron.utils.dtype_utils import QUANTIZED_KV_CACHE_DTYPES

        if get_current_vllm_config().cache_config.cache_dtype not in QUANTIZED_KV_CACHE_DTYPES:
            return
        for layer_id, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            for scale_name in ("k_scale", "v_scale"):
                key = f"model.layers.{layer_id}.self_attn.{scale_name}"
                if key in checkpoint._tensor_name_to_file:
                    stored = checkpoint._get_slice(key)[:].to(dtype=torch.bfloat16, device=device)
                    value = 1.0 / stored
                else:
                    value = torch.ones(1, dtype=torch.bfloat16, device=device)
                setattr(attn, scale_name, value.reshape(1, 1))
            # load time: .item() is allowed here
            attn.k_scale_float = attn.k_scale.item()
            attn.v_scale_float = attn.v_scale.item()
