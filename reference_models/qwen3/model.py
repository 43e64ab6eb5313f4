# SPDX-License-Identifier: Apache-2.0
"""
Qwen3 for the vLLM Neuron backend (bf16)
========================================

autoport-cst reference model ``qwen3``: grouped-query attention with an
RMSNorm of each query and key head before RoPE (Qwen3's ``q_norm`` and
``k_norm``), sliding-window attention on the layers the config marks
(``layer_types``, or from ``max_window_layers`` on), a SiLU-gated MLP,
RMSNorm, and rotate-half RoPE with the default, Llama 3 or YaRN frequencies.
Tied and untied embeddings are both handled at load time.

Supported parallelism: TP, with sequence-parallel (SP) hidden states between
layers during prefill. The query/key norm weights are replicated on every
rank. (No data or context parallelism: this reference keeps the TP-only
shape of the vllm_neuron qwen3 package.)

Paths:
  prefill  NF.qkv_proj -> QK norms -> apply_rotary_pos_emb -> paged KV-cache write, then
           full:     NF.flash_attention
           chunked:  NF.segmented_attention (reads the chunk's K/V back from the cache)
           then NF.o_proj
  decode   NF.attention_decode (fused QKV, pre-RoPE QK norms, RoPE, paged attention,
           O projection) with update_cache=False: the kernel returns the step's K/V
           and the KV cache is written here

The KV cache may be FP8 (static scales, read by load_weights).

ANNOTATION GUIDE (codemods anchor on these markers; keep them when editing):
  # >>> PARALLELISM: <what> <<<    parallelism plumbing, kept across ports
  # <-- MODEL-SPECIFIC: <what>     what changes when porting another architecture
  # <-- QUANTIZATION: <what>       FP8 KV-cache handling
"""

import logging
import math

import torch
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
from vllm_neuron.utils.checkpoints import SafetensorsCheckpoint
from vllm_neuron.utils.dtype_utils import FP8_CLAMP_MAX, validate_fp8_segmented_supported
from vllm_neuron.utils.weight_loader import (
    fused_qkv_weight_loader,
    set_weight_loader,
    sharding_weight_loader,
)

from .config import Qwen3Config

logger = logging.getLogger(__name__)

_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _layer_sliding_window(config, layer_idx: int) -> int | None:
    """The attention window of one layer in tokens, or None for full attention.

    ``config.layer_types`` marks each layer "sliding_attention" or
    "full_attention"; without it, the layers from ``max_window_layers`` on slide.
    """
    if config.sliding_window is None or not config.use_sliding_window:
        return None
    if config.layer_types is not None:
        if config.layer_types[layer_idx] == "sliding_attention":
            return config.sliding_window
        return None
    if layer_idx >= config.max_window_layers:
        return config.sliding_window
    return None


# =============================================================================
# Section 1: RMS Normalization
# <-- MODEL-SPECIFIC: Qwen3 uses RMSNorm (no mean subtraction, no bias)
# =============================================================================


class Qwen3RMSNorm(nn.Module):
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
    """q: [Nq, T, Dh], k: [Nkv, T, Dh], cos/sin: [T, Dh]."""
    cos = cos.unsqueeze(0)
    sin = sin.unsqueeze(0)
    return _apply_rotary_emb(q, cos, sin), _apply_rotary_emb(k, cos, sin)


class Qwen3RotaryEmbedding(nn.Module):
    """cos/sin tables for the step's positions.

    ``__init__`` keeps Python scalars only: the model is built on the meta
    device, so a tensor computed here would never hold data. The inverse
    frequencies are computed in ``forward`` on the input's device.
    """

    def __init__(self, config: Qwen3Config):
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
        self.max_position_embeddings = config.max_position_embeddings
        self.attention_scaling = 1.0
        if self.rope_type == "yarn":
            self._setup_yarn(config, scaling)

    def _setup_yarn(self, config, scaling):
        """YaRN's frequency band and attention factor, as Python scalars: the
        band (in rotated dimensions) between beta_fast and beta_slow rotations
        over the original context blends interpolated and original frequencies."""
        original = scaling.get("original_max_position_embeddings")
        if original is None:
            original = config.original_max_position_embeddings
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

        def correction_dim(rotations):
            turns = math.log(original / (rotations * 2 * math.pi))
            return (self.head_dim * turns) / (2 * math.log(self.rope_theta))

        low = correction_dim(scaling.get("beta_fast") or 32)
        high = correction_dim(scaling.get("beta_slow") or 1)
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
# Mixed: PARALLELISM (head sharding, SP gather/scatter, collectives) +
#        MODEL-SPECIFIC (GQA, no QKV bias, per-head QK RMSNorm, sliding window, rotate-half RoPE)
# =============================================================================


class Qwen3Attention(nn.Module):
    """Grouped-query attention with TP head sharding and a paged KV cache."""

    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size
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

        # <-- MODEL-SPECIFIC: fused QKV, stored [hidden, q|k|v]; O stored [q, hidden]
        self.q_size = self.num_attention_heads_per_rank * self.head_dim
        self.kv_size = self.num_key_value_heads_per_rank * self.head_dim
        qkv_size = self.q_size + 2 * self.kv_size
        self.qkv_split_indices = [self.q_size, self.q_size + self.kv_size]
        self.qkv_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, qkv_size, dtype=self.dtype)
        )
        self.o_proj_weight = nn.Parameter(
            torch.empty(self.q_size, self.hidden_size, dtype=self.dtype)
        )
        # <-- MODEL-SPECIFIC: RMSNorm of each query and key head before RoPE
        self.q_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)
        self.k_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)

        # Paged KV cache, bound by bind_kv_cache()
        self.k_cache = None
        self.v_cache = None
        # <-- QUANTIZATION: FP8 KV-cache scales, set by _load_kv_cache_scales
        # (quantize: x * scale); the floats are baked into the decode call
        self.k_scale = None
        self.v_scale = None
        self.k_scale_float = 1.0
        self.v_scale_float = 1.0

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

    def forward(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: object | None = None,
    ):
        """>>> PARALLELISM: dispatch to the prefill or decode path. <<<"""
        meta = attn_metadata[f"layers.{self.layer_idx}.self_attn"]
        if meta["max_query_len"] <= meta["decode_token_threshold"]:
            return self.forward_decode(hidden_states, positions, position_embeddings, attn_metadata)
        # >>> PARALLELISM: All-gather from SP before attention <<<
        if self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
        return self.forward_prefill(hidden_states, positions, position_embeddings, attn_metadata)

    # -- prefill ----------------------------------------------------------------

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

        qkv = NF.qkv_proj(
            hidden=hidden_states.unsqueeze(0),
            qkv_weights=self.qkv_proj_weight,
            bias=None,
        ).squeeze(0)
        q, k, v = torch.tensor_split(qkv, self.qkv_split_indices, dim=-1)
        q = q.view(tokens, self.num_attention_heads_per_rank, self.head_dim).transpose(0, 1)
        k = k.view(tokens, self.num_key_value_heads_per_rank, self.head_dim).transpose(0, 1)
        v = v.view(tokens, self.num_key_value_heads_per_rank, self.head_dim).transpose(0, 1)

        # <-- MODEL-SPECIFIC: rotate-half RoPE on all of head_dim
        cos, sin = position_embeddings
        # <-- MODEL-SPECIFIC: query and key norms before RoPE
        q = self.q_norm(q)
        k = self.k_norm(k)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)

        # >>> PARALLELISM: the paged cache [blocks, Nkv / rank, block, Dh] holds this rank's KV heads <<<
        meta = attn_metadata[f"layers.{self.layer_idx}.self_attn"]
        slot_mapping = meta["slot_mapping"]
        block_size = meta["block_size"]
        block_table = meta["block_table_tensor"]
        cached_seq_len = meta.get("cached_seq_len")
        kv_segment_size = meta.get("kv_segment_size")

        heads = self.num_key_value_heads_per_rank
        k_rows = k.reshape(-1, self.head_dim)
        v_rows = v.reshape(-1, self.head_dim)
        if self.k_cache.dtype in _FP8_DTYPES:
            # <-- QUANTIZATION: FP8 cache entries are x * scale, clamped to the FP8 range
            k_rows = (k_rows * self.k_scale).clamp(-FP8_CLAMP_MAX, FP8_CLAMP_MAX)
            v_rows = (v_rows * self.v_scale).clamp(-FP8_CLAMP_MAX, FP8_CLAMP_MAX)
        cache_index = (
            (slot_mapping // block_size).repeat(heads),
            torch.arange(heads, dtype=torch.long, device=slot_mapping.device).repeat_interleave(
                slot_mapping.shape[0]
            ),
            (slot_mapping % block_size).repeat(heads),
        )
        self.k_cache.index_put_(cache_index, k_rows.to(self.k_cache.dtype))
        self.v_cache.index_put_(cache_index, v_rows.to(self.v_cache.dtype))

        # <-- MODEL-SPECIFIC: causal attention, windowed on sliding layers, no sinks
        if kv_segment_size:
            # chunked prefill: attend over the cached tokens and the chunk's own
            # (the segmented kernel cannot read a non-packed FP8 cache)
            validate_fp8_segmented_supported(self.k_cache.dtype in _FP8_DTYPES, fp8_packed=False)
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
                tp_q=True,
                tp_out=True,
            )  # [Nq, Dh, T]
        else:
            k = k.repeat_interleave(self.num_key_value_groups, dim=0)
            v = v.repeat_interleave(self.num_key_value_groups, dim=0)
            attn_output = NF.flash_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v,
                scale=self.scaling,
                sliding_window=self.sliding_window,
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
        attn_metadata: object,
    ):
        """B sequences of S new tokens each: [B * S, H] in and out."""
        meta = attn_metadata[f"layers.{self.layer_idx}.self_attn"]
        slot_mapping = meta["slot_mapping"]
        block_size = meta["block_size"]
        block_table = meta["block_table_tensor"]
        context = meta["max_blocks_per_seq"] * block_size

        batch = block_table.shape[0]
        tokens = hidden_states.shape[0]
        new_tokens = tokens // batch
        heads = self.num_key_value_heads_per_rank
        x = hidden_states.to(self.dtype).view(batch, new_tokens, self.hidden_size)

        # Kernel RoPE layout: [Dh/2, B, S]
        cos, sin = position_embeddings
        half = self.head_dim // 2
        cos_kernel = cos[:, :half].reshape(batch, new_tokens, half).permute(2, 0, 1)
        sin_kernel = sin[:, :half].reshape(batch, new_tokens, half).permute(2, 0, 1)
        cos_kernel = cos_kernel.contiguous().to(self.dtype)
        sin_kernel = sin_kernel.contiguous().to(self.dtype)

        pos_ids = positions.view(1, tokens).to(torch.float32)
        # <-- MODEL-SPECIFIC: sliding window: mask prior positions before p - window + 1
        start_pos = None
        if self.sliding_window is not None:
            start_pos = torch.clamp(pos_ids - (self.sliding_window - 1), min=0)
        attention_mask = NF.gen_attention_decode_mask(
            pos_ids=pos_ids,
            bs=batch,
            q_head=self.num_attention_heads_per_rank,
            s_active=new_tokens,
            s_prior=context,
            start_pos=start_pos,
            block_len=block_size,
        )

        # One KV head per rank: the kernel takes the caches without the head dimension
        k_cache = self.k_cache.squeeze(1) if heads == 1 and self.k_cache.dim() == 4 else self.k_cache
        v_cache = self.v_cache.squeeze(1) if heads == 1 and self.v_cache.dim() == 4 else self.v_cache

        # <-- MODEL-SPECIFIC: the kernel's pre-RoPE QK norm with the learned gammas ([1, Dh])
        output, k_new, v_new = NF.attention_decode(
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
            active_blocks_table=block_table.to(torch.int32),
            K_cache=k_cache,
            V_cache=v_cache,
            attention_mask=attention_mask,
            # <-- QUANTIZATION: FP8 K is dequantized through the softmax scale
            softmax_scale=self.scaling / self.k_scale_float,
            sink=None,
            update_cache=False,
            # <-- QUANTIZATION: FP8 V is dequantized through the output projection
            W_out=self.o_proj_weight / self.v_scale_float,
            bias_out=None,
            transposed_out=False,
            out_in_sb=False,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            # >>> PARALLELISM: TP only: no attention data parallelism <<<
            attention_dp=1,
            attention_dp_group=None,
            attention_dp_rank=0,
            kv_needs_a2a=False,
        )

        # The step's K ([Dh, B * Nkv, S]) and V ([B, Nkv, S, Dh]), quantized by the
        # kernel when the cache is FP8, written head-major at the step's slots
        k_rows = k_new.permute(1, 2, 0).reshape(batch, heads, new_tokens, self.head_dim)
        k_rows = k_rows.transpose(0, 1).reshape(-1, self.head_dim)
        v_rows = v_new.transpose(0, 1).reshape(-1, self.head_dim)
        cache_index = (
            (slot_mapping // block_size).repeat(heads),
            torch.arange(heads, dtype=torch.long, device=slot_mapping.device).repeat_interleave(
                slot_mapping.shape[0]
            ),
            (slot_mapping % block_size).repeat(heads),
        )
        self.k_cache.index_put_(cache_index, k_rows.to(self.k_cache.dtype))
        self.v_cache.index_put_(cache_index, v_rows.to(self.v_cache.dtype))

        # >>> PARALLELISM: sum the partial outputs of all ranks <<<
        if self.world_size > 1:
            output = self.tp_group.all_reduce(output)
        return output


# =============================================================================
# Section 4: MLP (Dense)
# Mixed: PARALLELISM (intermediate sharding, collectives) +
#        MODEL-SPECIFIC (SiLU-gated MLP, no bias)
# =============================================================================


class Qwen3MLP(nn.Module):
    """down(silu(x @ gate) * (x @ up)), intermediate dimension sharded over TP."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.intermediate_size_per_rank = config.intermediate_size // self.world_size

        # <-- MODEL-SPECIFIC: gate/up/down stored transposed ([in, out])
        self.gate_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, self.intermediate_size_per_rank, dtype=self.dtype)
        )
        self.up_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, self.intermediate_size_per_rank, dtype=self.dtype)
        )
        self.down_proj_weight = nn.Parameter(
            torch.empty(self.intermediate_size_per_rank, self.hidden_size, dtype=self.dtype)
        )
        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: shard the intermediate dimension (gate and up share a loader). <<<"""
        gate_up_loader = sharding_weight_loader(
            shard_dim=1,
            shard_size=self.intermediate_size_per_rank,
            num_shards=self.world_size,
            is_storage_transposed=True,
        )
        down_loader = sharding_weight_loader(
            shard_dim=0,
            shard_size=self.intermediate_size_per_rank,
            num_shards=self.world_size,
            is_storage_transposed=True,
        )
        set_weight_loader(self.gate_proj_weight, gate_up_loader)
        set_weight_loader(self.up_proj_weight, gate_up_loader)
        set_weight_loader(self.down_proj_weight, down_loader)

    def forward(self, hidden_states: torch.Tensor, is_prefill: bool) -> torch.Tensor:
        # >>> PARALLELISM: All-gather from SP in prefill <<<
        if is_prefill and self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
        # <-- MODEL-SPECIFIC: SiLU-gated MLP
        output = NF.mlp(
            hidden_states,
            self.gate_proj_weight,
            self.up_proj_weight,
            self.down_proj_weight,
        )
        # >>> PARALLELISM: Reduce-scatter to SP (prefill) or all-reduce (decode) <<<
        if self.world_size > 1:
            if is_prefill:
                output = self.tp_group.reduce_scatter(output, dim=0)
            else:
                output = self.tp_group.all_reduce(output)
        return output


# =============================================================================
# Section 5: Decoder Layer
# <-- MODEL-SPECIFIC: pre-norm residual blocks (norm -> sublayer -> add)
# =============================================================================


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.input_layernorm = Qwen3RMSNorm(
            config.hidden_size, config.rms_norm_eps, config.torch_dtype
        )
        self.post_attention_layernorm = Qwen3RMSNorm(
            config.hidden_size, config.rms_norm_eps, config.torch_dtype
        )
        self.self_attn = Qwen3Attention(config, layer_idx=layer_idx)
        self.mlp = Qwen3MLP(config)

    def _is_decode(self, attn_metadata) -> bool:
        meta = attn_metadata[f"layers.{self.layer_idx}.self_attn"]
        return meta["max_query_len"] <= meta["decode_token_threshold"]

    def forward(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: object | None = None,
    ) -> torch.Tensor:
        is_decode = self._is_decode(attn_metadata)

        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(
            hidden_states=hidden_states,
            positions=positions,
            position_embeddings=position_embeddings,
            attn_metadata=attn_metadata,
        )
        hidden_states = residual + hidden_states

        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states, is_prefill=not is_decode)
        return residual + hidden_states


# =============================================================================
# Section 6: Model Backbone
# Mixed: PARALLELISM (vocabulary-sharded embedding, SP) +
#        MODEL-SPECIFIC (final RMSNorm)
# =============================================================================


class Qwen3Model(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group

        # >>> PARALLELISM: vocabulary-sharded embedding <<<
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
            [Qwen3DecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        # <-- MODEL-SPECIFIC: final RMSNorm
        self.norm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
        self.rotary_emb = Qwen3RotaryEmbedding(config)

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

        # >>> PARALLELISM: prefill embeddings come back as this rank's SP slice <<<
        hidden_states = self.embed_tokens(input_ids, scatter_tokens=is_prefill, rank=rank)
        # >>> PARALLELISM: prompt embeddings cut to the SP slice <<<
        if is_prefill and self.world_size > 1 and inputs_embeds is not None and is_token_ids is not None:
            rows = hidden_states.shape[0]
            inputs_embeds = inputs_embeds[self.rank * rows : (self.rank + 1) * rows]
            is_token_ids = is_token_ids[self.rank * rows : (self.rank + 1) * rows]
        hidden_states = NF.merge_prompt_embeds(hidden_states, inputs_embeds, is_token_ids)

        position_embeddings = self.rotary_emb(
            positions, device=hidden_states.device, dtype=hidden_states.dtype
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                positions=positions,
                position_embeddings=position_embeddings,
                attn_metadata=attn_metadata,
            )
        hidden_states = self.norm(hidden_states)

        # >>> PARALLELISM: gather the SP slices for the LM head <<<
        if is_prefill and self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
        return hidden_states, []


# =============================================================================
# Section 7: Language Model Head, KV-cache spec and weight loading
# Mixed: PARALLELISM (vocabulary-sharded LM head) +
#        MODEL-SPECIFIC (tied embeddings, checkpoint key mapping)
# =============================================================================


def _mask_padded_vocabulary(logits: torch.Tensor, vocab_size: int, rank) -> torch.Tensor:
    """This LM-head rank's logits ``[N, V_padded / tp]`` with the columns of
    the vocabulary's padding (ids from ``vocab_size`` on) at -inf, so that a
    sampler over the shards never picks one."""
    width = logits.shape[-1]
    columns = torch.arange(width, device=logits.device) + rank * width
    return logits.masked_fill(columns >= vocab_size, float("-inf"))


class Qwen3ForCausalLM(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        self.model = Qwen3Model(config)
        neuron_config = config.neuron_config

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group

        self.on_device_sampling_config = (
            neuron_config.on_device_sampling_config if neuron_config is not None else None
        )
        # full logits are gathered when logprobs or logit dumps are asked for
        self._gather_logits = neuron_config is not None and (
            neuron_config.max_logprobs != 0 or neuron_config.debug_logits_dir is not None
        )
        # >>> PARALLELISM: the vocabulary padded to a multiple of the TP size <<<
        # (ColumnParallelLinear shards evenly: the last shard ends in zero rows, whose
        # logits forward drops or masks)
        self.vocab_size = config.vocab_size
        padded_vocab_size = -(-config.vocab_size // self.world_size) * self.world_size
        # <-- MODEL-SPECIFIC: no LM-head bias; a tied LM head loads the embedding (load_weights)
        self.lm_head = neuron_nn.ColumnParallelLinear(
            config.hidden_size,
            padded_vocab_size,
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
                pad_shard=True,
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
    ) -> "Qwen3ForCausalLM":
        return cls(Qwen3Config.from_configs(hf_config, neuron_config))

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

        hidden_states, _ = self.model(
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
            # >>> PARALLELISM: the padded vocabulary's logits dropped <<<
            return logits[:, : self.vocab_size]
        # >>> PARALLELISM: the padded vocabulary's columns of this shard never sampled <<<
        if self.lm_head.out_features != self.vocab_size:
            logits = _mask_padded_vocabulary(
                logits, self.vocab_size, self.rank if rank is None else rank
            )

        sampled_tokens = self.sampler(logits, sampling_params, logit_mask=logit_mask, tp_rank=rank)
        gathered_logits = None
        if self._gather_logits:
            gathered_logits = (
                logits if self.lm_head.gather_output else self.tp_group.all_gather(logits, dim=1)
            )
            # >>> PARALLELISM: the padded vocabulary's logits dropped <<<
            gathered_logits = gathered_logits[:, : self.vocab_size]
        if spec_decode_metadata is not None:
            from vllm_neuron.nn.rejection_sampler import rejection_sampler

            return rejection_sampler(spec_decode_metadata, sampled_tokens)
        return sampled_tokens, gathered_logits

    # -- KV cache -------------------------------------------------------------------

    def get_kv_spec(self) -> KVSpec:
        # >>> PARALLELISM: per-rank KV heads <<<
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
        checkpoint, then the FP8 KV-cache scales."""
        # <-- MODEL-SPECIFIC: Hugging Face checkpoint keys of each parameter
        mappings = {}
        for layer_id in range(len(self.model.layers)):
            prefix = f"model.layers.{layer_id}"
            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
            mappings[f"{prefix}.post_attention_layernorm.weight"] = (
                f"{prefix}.post_attention_layernorm.weight"
            )
            mappings[f"{prefix}.self_attn.qkv_proj_weight"] = [
                f"{prefix}.self_attn.q_proj.weight",
                f"{prefix}.self_attn.k_proj.weight",
                f"{prefix}.self_attn.v_proj.weight",
            ]
            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
            # <-- MODEL-SPECIFIC: QK-norm weights, the same on every rank
            mappings[f"{prefix}.self_attn.q_norm.weight"] = f"{prefix}.self_attn.q_norm.weight"
            mappings[f"{prefix}.self_attn.k_norm.weight"] = f"{prefix}.self_attn.k_norm.weight"
            mappings[f"{prefix}.mlp.gate_proj_weight"] = f"{prefix}.mlp.gate_proj.weight"
            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
            mappings[f"{prefix}.mlp.down_proj_weight"] = f"{prefix}.mlp.down_proj.weight"
        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
        mappings["model.norm.weight"] = "model.norm.weight"
        # <-- MODEL-SPECIFIC: tied embeddings load the LM head from the embedding
        if self.config.tie_word_embeddings:
            mappings["lm_head.weight"] = "model.embed_tokens.weight"
        else:
            mappings["lm_head.weight"] = "lm_head.weight"

        checkpoint = SafetensorsCheckpoint(checkpoint_path, cache_dir)
        result = checkpoint.load_sharded_pipelined(
            self.rank, self.world_size, self, mappings, device
        )
        state = result.state_dict
        for name, tensor in state.items():
            if tensor.dtype != self.config.torch_dtype:
                state[name] = tensor.to(self.config.torch_dtype)
        self._load_kv_cache_scales(checkpoint, device)
        self.load_state_dict(state, strict=False, assign=True)
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
