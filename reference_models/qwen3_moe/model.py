# SPDX-License-Identifier: Apache-2.0
"""
Qwen3-MoE for the vLLM Neuron backend (bf16)
============================================

autoport-cst reference model ``qwen3_moe``: a decoder whose feed-forward
blocks are mixtures of experts. Grouped-query attention with a per-head
RMSNorm of queries and keys before rotary position embedding; a softmax
router choosing the top-k of E SiLU-gated experts, the top-k weights
renormalized when the config says so (``norm_topk_prob``); RMSNorm
everywhere; RoPE with the default, Llama 3 or YaRN frequencies.

Supported parallelism: TP with sequence-parallel (SP) hidden states between
layers during prefill; expert parallelism (EP) inside the TP world (EP rank
k holds experts [k L, (k + 1) L), sharded over the ranks of its partition;
the MoE collectives stay on the TP group); data parallelism of the decode
attention (Q/O heads over TP * attention DP), of the experts (MLP DP), of the
embedding and of the LM head.

Paths:
  prefill  attention, full:    NF.qkv_proj (fused QK norms and RoPE) -> paged KV-cache write
                               -> NF.flash_attention
           attention, chunked: NF.qkv_proj (fused QK norms, RoPE, in-kernel cache write)
                               -> NF.segmented_attention
           then NF.o_proj
           experts:  RMSNorm -> NF.router -> [EP: NF.get_local_expert_affinities]
                     -> NF.build_blockwise_mapping -> NF.moe_cte
  decode   attention: NF.attention_decode (fused QKV, QK norms, RoPE, paged attention,
                      cache write, O projection) with the step's mask, built once per
                      step by the backbone (or in the kernel from pos_ids)
           experts:   NF.moe_block_tkg (fused RMSNorm, router, top-k, local experts)

The router weight is kept in the model dtype (bf16 in production) and the
routing computed in float32. The KV cache may be FP8 (static scales).

ANNOTATION GUIDE (codemods anchor on these markers; keep them when editing):
  # >>> PARALLELISM: <what> <<<    parallelism plumbing, kept across ports
  # <-- MODEL-SPECIFIC: <what>     what changes when porting another architecture
  # <-- QUANTIZATION: <what>       FP8 KV-cache handling
"""

import logging
import math
from typing import NamedTuple

import nki.language as nl
import torch
from nkilib.core.moe.moe_cte.moe_cte import MoECTEImplementation
from nkilib.core.utils.common_types import (
    ActFnType,
    ExpertAffinityScaleMode,
    NormType,
    RouterActFnType,
)
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
    expert_parallel_grouped_loader,
    expert_parallel_tensor_dim_loader,
    fused_qkv_weight_loader,
    set_weight_loader,
    sharding_weight_loader,
    with_rank_override,
)
from vllm_neuron.vllm.spec_decode.decorator import async_speculative_decoding

from .config import Qwen3MoeConfig

logger = logging.getLogger(__name__)

_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# the MoE kernels' compute dtype for each model dtype
_NKI_DTYPES = {torch.float32: nl.float32, torch.bfloat16: nl.bfloat16, torch.float16: nl.float16}
# decode runs every local expert once the step routes at least this many
# tokens per local expert on average (the kernel then skips the selection)
_ALL_EXPERTS_LOAD = 1.0


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
# <-- MODEL-SPECIFIC: rotate-half RoPE with optional Llama 3 or YaRN frequency scaling
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
        if self.rope_type not in ("default", "llama3", "yarn"):
            raise NotImplementedError(f"rope_type {self.rope_type!r} is not supported")
        self.scaling_factor = float(scaling.get("factor", 1.0))
        self.low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
        self.high_freq_factor = float(scaling.get("high_freq_factor", 1.0))
        self.original_max_position_embeddings = int(
            scaling.get("original_max_position_embeddings", 8192)
        )
        # <-- MODEL-SPECIFIC: scalars of the RoPE variants (tensors are built in forward)
        self.attention_scaling = 1.0
        if self.rope_type == "yarn":
            self._setup_yarn(config, scaling)

    def _setup_yarn(self, config, scaling):
        """YaRN's frequency band and attention factor, as Python scalars: the
        band (in rotated dimensions) between beta_fast and beta_slow rotations
        over the original context blends interpolated and original frequencies."""
        original = scaling.get("original_max_position_embeddings")
        if original is None:
            original = config.original_max_position_embeddings or config.max_position_embeddings
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
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        self.yarn_low = max(low, 0)
        self.yarn_high = min(high, self.head_dim - 1)
        if self.yarn_low == self.yarn_high:
            self.yarn_high += 0.001

    def _compute_inv_freq(self, device: torch.device) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device)
        inv_freq = 1.0 / (self.rope_theta ** (exponents.to(torch.float32) / self.head_dim))
        if self.rope_type == "llama3":
            inv_freq = self._apply_llama3_scaling(inv_freq)
        if self.rope_type == "yarn":
            dims = torch.arange(self.head_dim // 2, dtype=torch.float32, device=device)
            ramp = (dims - self.yarn_low) / (self.yarn_high - self.yarn_low)
            extrapolation = 1 - torch.clamp(ramp, 0, 1)
            interpolated = inv_freq / self.scaling_factor
            inv_freq = interpolated * (1 - extrapolation) + inv_freq * extrapolation
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
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


# =============================================================================
# Section 3: Attention
# Mixed: PARALLELISM (head sharding over TP and attention DP, SP gather/scatter,
#        collectives) +
#        MODEL-SPECIFIC (GQA, no QKV bias, per-head QK RMSNorm, RoPE fused into the kernels)
# =============================================================================


class Qwen3MoeAttention(nn.Module):
    """Grouped-query attention with per-head QK norms and a paged KV cache.

    Sharding: Q and O heads over ``effective_q_shards = TP * attention DP``
    (the decode kernel exchanges heads across the attention-DP ranks, each of
    which attends for its own batch); K/V heads over TP (replicated when
    fewer than the TP ranks), and over attention DP too when there are
    enough of them (``kv_needs_a2a``), the cache keeping the TP share.
    """

    def __init__(self, config: Qwen3MoeConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size
        self.num_attention_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        neuron_config = config.neuron_config

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

        # <-- MODEL-SPECIFIC: fused QKV, stored [hidden, q|k|v]; O stored [q, hidden]
        self.q_size = self.num_attention_heads_per_rank * self.head_dim
        self.kv_size = self.num_kv_heads_for_weight * self.head_dim
        qkv_size = self.q_size + 2 * self.kv_size
        self.qkv_split_indices = [self.q_size, self.q_size + self.kv_size]
        o_proj_in_features = self.num_attention_heads * self.head_dim // effective_q_shards
        self.qkv_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, qkv_size, dtype=self.dtype)
        )
        self.o_proj_weight = nn.Parameter(
            torch.empty(o_proj_in_features, self.hidden_size, dtype=self.dtype)
        )
        # <-- MODEL-SPECIFIC: per-head RMSNorm of queries and keys before RoPE
        self.q_norm = Qwen3MoeRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)
        self.k_norm = Qwen3MoeRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)

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
        """>>> PARALLELISM: TP (and attention-DP) sharding of the QKV and O projections. <<<

        Q and O are sharded over TP * attention DP: their shard of rank
        ``(tp rank, attention-DP rank)`` is ``attention_dp_rank + tp_rank *
        attention_dp_size``. The fused loader takes the attention-DP position
        itself (K/V use the TP rank unless ``kv_needs_a2a``); the O loader is
        pinned to that rank with ``with_rank_override``. The QK-norm weights
        are loaded whole on every rank.
        """
        effective_q_shards = self.world_size * self.attention_dp_size
        effective_q_rank = self.attention_dp_rank + self.rank * self.attention_dp_size
        o_shard_size = self.num_attention_heads * self.head_dim // effective_q_shards
        # <-- MODEL-SPECIFIC: separate q/k/v checkpoint tensors fused on load
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
        o_loader = sharding_weight_loader(
            shard_dim=0,
            shard_size=o_shard_size,
            num_shards=effective_q_shards,
            is_storage_transposed=True,
        )
        o_loader = with_rank_override(o_loader, rank=effective_q_rank)
        set_weight_loader(self.o_proj_weight, o_loader)

    def forward(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: object | None = None,
        attn_mask: torch.Tensor | None = None,
    ):
        """>>> PARALLELISM: dispatch to the prefill or decode path. <<<

        ``attn_mask`` is the decode mask the backbone built for the step
        (None: the decode kernel builds it from the positions)."""
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

        # <-- MODEL-SPECIFIC: causal attention, no sinks, no sliding window
        if kv_segment_size:
            # Chunked prefill: the kernel also writes the rotated K and V into
            # the paged cache (bf16 only: the segmented kernel cannot read a
            # non-packed FP8 cache), and only q comes back to attend with.
            validate_fp8_segmented_supported(kv_is_fp8, fp8_packed=False)
            in_cache = (slot_mapping >= 0) & (slot_mapping < self.k_cache.shape[0] * block_size)
            kernel_slots = torch.where(in_cache, slot_mapping, torch.zeros_like(slot_mapping))
            # <-- MODEL-SPECIFIC: the kernel's pre-RoPE QK norms with the learned gammas ([1, Dh])
            q_flat, _, _ = NF.qkv_proj(
                hidden=hidden_states.unsqueeze(0),
                qkv_weights=self.qkv_proj_weight,
                bias=None,
                d_head=self.head_dim,
                cos_cache=cos_cache,
                sin_cache=sin_cache,
                num_q_heads=self.num_attention_heads_per_rank,
                num_kv_heads=self.num_kv_heads_for_weight,
                qk_norm_pre_rope_q_norm=NormType.RMS_NORM,
                qk_norm_pre_rope_k_norm=NormType.RMS_NORM,
                qk_norm_pre_rope_eps=self.q_norm.variance_epsilon,
                qk_norm_pre_rope_q_gamma=self.q_norm.weight.view(1, -1),
                qk_norm_pre_rope_k_gamma=self.k_norm.weight.view(1, -1),
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
                tp_q=True,
                tp_out=True,
            )  # [Nq, Dh, T]
        else:
            # Whole prompt: the kernel returns q|k|v; the cache is written here
            # and flash attention takes the step's K/V directly.
            qkv = NF.qkv_proj(
                hidden=hidden_states.unsqueeze(0),
                qkv_weights=self.qkv_proj_weight,
                bias=None,
                d_head=self.head_dim,
                cos_cache=cos_cache,
                sin_cache=sin_cache,
                num_q_heads=self.num_attention_heads_per_rank,
                num_kv_heads=self.num_kv_heads_for_weight,
                qk_norm_pre_rope_q_norm=NormType.RMS_NORM,
                qk_norm_pre_rope_k_norm=NormType.RMS_NORM,
                qk_norm_pre_rope_eps=self.q_norm.variance_epsilon,
                qk_norm_pre_rope_q_gamma=self.q_norm.weight.view(1, -1),
                qk_norm_pre_rope_k_gamma=self.k_norm.weight.view(1, -1),
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
                tp_q=False,
                tp_out=True,
            )  # [Nq, Dh, T]

        attn_output = NF.o_proj(attn_output.unsqueeze(0), self.o_proj_weight, None).squeeze(0)

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
        meta = attn_metadata[f"layers.{self.layer_idx}.self_attn"]
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

        # <-- MODEL-SPECIFIC: causal mask over the prior and active tokens, from
        # the backbone; without one the kernel builds it from the positions
        pos_ids = None
        if attn_mask is None:
            pos_ids = positions.view(local_batch, new_tokens).to(torch.float32)

        cache_is_fp8 = self.k_cache.dtype in _FP8_DTYPES
        # <-- MODEL-SPECIFIC: the kernel's pre-RoPE QK norm with the learned gammas ([1, Dh])
        output = NF.attention_decode(
            X=x,
            X_hidden_dim_actual=self.hidden_size,
            rmsnorm_X_enabled=False,
            W_qkv=self.qkv_proj_weight,
            bias_qkv=None,
            rmsnorm_QK_pre_rope_enabled=True,
            rmsnorm_QK_pre_rope_eps=self.q_norm.variance_epsilon,
            rmsnorm_QK_pre_rope_W_Q=self.q_norm.weight.view(1, -1),
            rmsnorm_QK_pre_rope_W_K=self.k_norm.weight.view(1, -1),
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
            # <-- QUANTIZATION: FP8 K is dequantized through the softmax scale
            softmax_scale=self.scaling / self.k_scale_float,
            sink=None,
            update_cache=True,
            kv_cache_update_idx=slot_mapping.view(local_batch, new_tokens).to(torch.uint32),
            # <-- QUANTIZATION: FP8 V is dequantized through the output projection
            W_out=self.o_proj_weight / self.v_scale_float,
            bias_out=None,
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
#        MODEL-SPECIFIC (softmax top-k router, SiLU-gated experts)
# =============================================================================


def expert_gate_up_loader(intermediate_per_rank, num_shards, num_experts, hidden_size):
    """Loader for the stacked gate|up weight [E, H, 2 * I/tp] of ``num_experts`` experts.

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
    """Loader for the stacked down weight [E, I/tp, H] of ``num_experts``
    experts, from ``[down_0 .. down_{E-1}]`` (each [H, I]) or one fused
    tensor, [E, H, I] or [E, I, H] (stored [in, out]; when hidden ==
    intermediate both shapes agree and [E, H, I] is assumed)."""

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


def local_experts_loader(local_expert_indices, loader, total_num_experts):
    """>>> PARALLELISM: with EP, ``loader`` (built for this rank's experts) sees only them. <<<

    A fused checkpoint tensor holds every expert on dim 0 and goes through
    ``expert_parallel_tensor_dim_loader``; per-expert tensors, listed grouped
    by item (``[gate_0 .. gate_{E-1}, up_0 .. up_{E-1}]``), go through
    ``expert_parallel_grouped_loader``."""
    stacked = expert_parallel_tensor_dim_loader(local_expert_indices, loader)
    per_expert = expert_parallel_grouped_loader(local_expert_indices, loader, total_num_experts)

    def transform(slices, rank):
        chosen = stacked if len(slices) == 1 else per_expert
        return chosen.load(slices, rank)

    return SafetensorsWeightLoader(transform)


class Qwen3MoeExperts(nn.Module):
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

    def __init__(self, config: Qwen3MoeConfig):
        super().__init__()
        self.dtype = config.torch_dtype
        self.compute_dtype = _NKI_DTYPES[self.dtype]
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
                "Qwen3MoeExperts: expert parallelism across data-parallel replicas (cross-DP EP) "
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
        self.post_attention_layernorm = Qwen3MoeRMSNorm(
            config.hidden_size, config.rms_norm_eps, config.torch_dtype
        )
        # >>> PARALLELISM: router replicated on every rank (not EP-sharded) <<<
        # <-- MODEL-SPECIFIC: router [E, H] in the model dtype; the routing runs in float32
        self.router_weight = nn.Parameter(
            torch.empty(self.num_experts, self.hidden_size, dtype=self.dtype)
        )
        # <-- MODEL-SPECIFIC: SiLU-gated experts; gate|up stacked [E_L, H, 2 * I/t], down [E_L, I/t, H]
        self.gate_up_proj_weight = nn.Parameter(
            torch.empty(
                self.num_local_experts,
                self.hidden_size,
                2 * self.intermediate_size_per_rank,
                dtype=self.dtype,
            )
        )
        self.down_proj_weight = nn.Parameter(
            torch.empty(
                self.num_local_experts,
                self.intermediate_size_per_rank,
                self.hidden_size,
                dtype=self.dtype,
            )
        )
        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: each rank loads its experts (EP) and its intermediate slice. <<<

        The loaders are built for this rank's experts; with EP they see only
        those (``local_experts_loader``), with MLP DP they read the slice of
        this rank's place in the MLP TP group. The router is loaded whole."""
        local_expert_indices = list(
            range(self.local_expert_start, self.local_expert_start + self.num_local_experts)
        )
        gate_up_loader = expert_gate_up_loader(
            intermediate_per_rank=self.intermediate_size_per_rank,
            num_shards=self.tp_degree,
            num_experts=self.num_local_experts,
            hidden_size=self.hidden_size,
        )
        down_loader = expert_down_loader(
            intermediate_per_rank=self.intermediate_size_per_rank,
            num_shards=self.tp_degree,
            num_experts=self.num_local_experts,
            hidden_size=self.hidden_size,
        )
        if self.ep_degree > 1:
            gate_up_loader = local_experts_loader(local_expert_indices, gate_up_loader, self.num_experts)
            down_loader = local_experts_loader(local_expert_indices, down_loader, self.num_experts)
        if self.mlp_dp_size > 1:
            gate_up_loader = with_rank_override(gate_up_loader, rank=self.mlp_tp_rank)
            down_loader = with_rank_override(down_loader, rank=self.mlp_tp_rank)
        set_weight_loader(self.gate_up_proj_weight, gate_up_loader)
        set_weight_loader(self.down_proj_weight, down_loader)

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
        # <-- MODEL-SPECIFIC: float32 router logits and the top-k choice
        selected, router_logits = NF.router(
            hidden_states=hidden_states,
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
        """The stacked weights in the kernels' layout: gate_up [E_L, H, 2, I/t], down [E_L, I/t, H]."""
        gate_up = self.gate_up_proj_weight.reshape(
            self.num_local_experts, self.hidden_size, 2, self.intermediate_size_per_rank
        )
        return gate_up, self.down_proj_weight

    def _experts_blockwise(self, hidden_states, expert_affinities, padding_mask=None):
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
        output = self._experts_blockwise(hidden_states, expert_affinities, padding_mask)

        # >>> PARALLELISM: Reduce-scatter the partial sums (all experts, all slices) back to SP <<<
        if self.world_size > 1:
            output = self.tp_group.reduce_scatter(output, dim=0)
        return output

    def forward_decode(self, hidden_states: torch.Tensor, rank=None):
        """[B * S, H] in and out (the batches of every MLP-DP rank)."""
        if self.fused_decode:
            output = self._run_moe_block_tkg(hidden_states)
        else:
            normalized = self.post_attention_layernorm(hidden_states)
            affinities = self._local_affinities(self._route(normalized))
            output = self._experts_blockwise(normalized, affinities)

        # >>> PARALLELISM: sum the partial outputs of all ranks <<<
        if self.moe_group.world_size > 1:
            output = self.moe_group.all_reduce(output)
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


def _precompute_decode_attn_mask(attn_metadata, positions: torch.Tensor, q_heads: int) -> torch.Tensor:
    """The causal decode mask of the step ([S_ctx, B, q_heads, S]), the same
    for every layer: built once by the backbone instead of in each layer.
    ``q_heads`` are the heads a rank attends with after the attention-DP
    exchange."""
    meta = attn_metadata["layers.0.self_attn"]
    block_size = meta["block_size"]
    local_batch = meta["block_table_tensor"].shape[0]
    new_tokens = positions.shape[0] // local_batch
    # <-- MODEL-SPECIFIC: causal mask over the prior and active tokens, no window
    return NF.gen_attention_decode_mask(
        pos_ids=positions.reshape(1, local_batch * new_tokens).to(torch.float32),
        bs=local_batch,
        q_head=q_heads,
        s_active=new_tokens,
        s_prior=meta["max_blocks_per_seq"] * block_size,
        start_pos=None,
        block_len=block_size,
    )


class Qwen3MoeDecoderLayer(nn.Module):
    """Pre-norm decoder layer: a decode ``forward`` (with the DP batch
    transitions) and a ``_forward_prefill`` (SP layout). The post-attention
    norm lives in the experts (fused in the decode kernel)."""

    def __init__(self, config: Qwen3MoeConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        # <-- MODEL-SPECIFIC: pre-attention RMSNorm
        self.input_layernorm = Qwen3MoeRMSNorm(
            config.hidden_size, config.rms_norm_eps, config.torch_dtype
        )
        self.self_attn = Qwen3MoeAttention(config, layer_idx=layer_idx)
        self.mlp = Qwen3MoeMLP(config)

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
#        MODEL-SPECIFIC (final RMSNorm, decode mask, Eagle3 auxiliary hidden states)
# =============================================================================


class Qwen3MoeModel(nn.Module):
    def __init__(self, config: Qwen3MoeConfig):
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
            [Qwen3MoeDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        # <-- MODEL-SPECIFIC: final RMSNorm
        self.norm = Qwen3MoeRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
        self.rotary_emb = Qwen3MoeRotaryEmbedding(config)

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
        # <-- MODEL-SPECIFIC: the decode mask, the same for every layer, built once per step
        attn_mask = None
        if not is_prefill:
            attn_mask = _precompute_decode_attn_mask(
                attn_metadata, positions, self.layers[0].self_attn.num_q_heads_after_a2a
            )

        aux_hidden_states = []
        for layer_idx, layer in enumerate(self.layers):
            if layer_idx in self.aux_hidden_state_layers:
                aux_hidden_states.append(hidden_states)
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
class Qwen3MoeForCausalLM(nn.Module, SupportsEagle3):
    def __init__(self, config: Qwen3MoeConfig):
        super().__init__()
        self.config = config
        self.model = Qwen3MoeModel(config)
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
    ) -> "Qwen3MoeForCausalLM":
        return cls(Qwen3MoeConfig.from_configs(hf_config, neuron_config))

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
        layers = [
            LayerSpec(
                name=f"layers.{layer_idx}.self_attn",
                num_kv_heads=layer.self_attn.num_key_value_heads_per_rank,
                head_size=layer.self_attn.head_dim,
                dtype=layer.self_attn.dtype,
                sliding_window_size=None,
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
            moe = moe_checkpoint_keys(names, prefix, self.config.num_experts)
            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
            mappings[f"{prefix}.self_attn.qkv_proj_weight"] = [
                f"{prefix}.self_attn.q_proj.weight",
                f"{prefix}.self_attn.k_proj.weight",
                f"{prefix}.self_attn.v_proj.weight",
            ]
            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
            # <-- MODEL-SPECIFIC: QK-norm weights, the same on every rank
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
