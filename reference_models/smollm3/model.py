# SPDX-License-Identifier: Apache-2.0
"""
SmolLM3 for the vLLM Neuron backend (bf16)
========================================

autoport-cst reference model ``smollm3``: a dense decoder with grouped-query
attention, rotary position embedding on every layer but the NoPE layers the
config lists, sliding-window attention on the layers ``layer_types`` marks, a
SiLU-gated MLP and RMSNorm. Tied and untied embeddings are both handled at
load time. Derived from the ``llama3`` reference by autoport-cst's codemods
(nope-layers, sliding-window), then reviewed; it keeps llama3's structure.

Supported parallelism: TP with sequence-parallel (SP) hidden states between
layers during prefill; data parallelism of the decode attention (Q/O heads
sharded over TP * attention DP), of the MLP, of the embedding and of the LM
head; decode context parallelism (DCP), with an optional context-parallel
prefill (gather-Q).

Paths:
  prefill  full:       NF.qkv_proj (fused RoPE) -> paged KV-cache write -> NF.flash_attention
           chunked:    NF.qkv_proj (fused RoPE, in-kernel cache write) -> NF.segmented_attention
           DCP:        NF.qkv_proj (fused RoPE) -> cache write -> gather Q -> NF.segmented_attention_cp
           then NF.o_proj
  decode   NF.attention_decode (fused QKV, RoPE, paged attention, cache write, O projection),
           with a decode mask, or with the in-kernel mask of the bounded-gather path (drafter)

Quantization: the decoder layer takes its attention and MLP classes from
``quantization.resolve_attention_mlp_classes``; FP8 classes fuse the
preceding RMSNorm and receive its weight (``ln_w=``, ``eps=``). This package
ships the bf16 classes only. The KV cache may be FP8 (static scales).

ANNOTATION GUIDE (codemods anchor on these markers; keep them when editing):
  # >>> PARALLELISM: <what> <<<    parallelism plumbing, kept across ports
  # <-- MODEL-SPECIFIC: <what>     what changes when porting another architecture
  # <-- QUANTIZATION: <what>       FP8 branches
"""

import logging
import math

import torch
from torch import nn
from transformers import PretrainedConfig
from vllm.config import get_current_vllm_config
from vllm.distributed.parallel_state import get_dcp_group, get_tp_group
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
    get_neuron_dcp_kv_group,
    get_neuron_dcp_tp_group,
    get_neuron_embedding_dp_group,
    get_neuron_embedding_tp_group,
    get_neuron_lm_head_dp_group,
    get_neuron_lm_head_tp_group,
    get_neuron_mlp_dp_group,
    get_neuron_mlp_tp_group,
)
from vllm_neuron.utils.checkpoints import SafetensorsCheckpoint
from vllm_neuron.utils.dtype_utils import FP8_CLAMP_MAX, validate_fp8_segmented_supported
from vllm_neuron.utils.weight_loader import (
    fused_qkv_weight_loader,
    set_weight_loader,
    sharding_weight_loader,
    with_rank_override,
)
from vllm_neuron.vllm.spec_decode.decorator import async_speculative_decoding

from .config import SmolLM3Config
from .quantization import QuantScheme, resolve_attention_mlp_classes

logger = logging.getLogger(__name__)

_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _layer_sliding_window(config, layer_idx: int) -> int | None:
    """The attention window of one layer in tokens, or None for full attention.

    ``config.layer_types`` marks each layer "sliding_attention" or
    "full_attention"; a config without it does not say which layers slide.
    """
    if config.sliding_window is None or not config.use_sliding_window:
        return None
    if config.layer_types is not None:
        if config.layer_types[layer_idx] == "sliding_attention":
            return config.sliding_window
        return None
    raise ValueError("the config sets sliding_window but no layer_types")


def _layer_uses_rope(config, layer_idx: int) -> bool:
    """Whether a layer rotates its queries and keys (some layers use no
    positional embedding at all).

    ``config.no_rope_layers`` holds 1 for a layer with RoPE and 0 for one
    without; without it, every ``no_rope_layer_interval``-th layer has none.
    """
    if config.no_rope_layers is not None:
        return bool(config.no_rope_layers[layer_idx])
    if config.no_rope_layer_interval:
        return (layer_idx + 1) % config.no_rope_layer_interval != 0
    return True


def _window_start(pos_ids, window):
    """The first position each query of a sliding-window layer sees,
    ``pos_ids - window + 1`` clamped at 0 (None: full attention, or no positions)."""
    if window is None or pos_ids is None:
        return None
    return torch.clamp(pos_ids - (window - 1), min=0)


# =============================================================================
# Section 1: RMS Normalization
# <-- MODEL-SPECIFIC: SmolLM3 uses RMSNorm (no mean subtraction, no bias)
# =============================================================================


class SmolLM3RMSNorm(nn.Module):
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
# <-- MODEL-SPECIFIC: rotate-half RoPE with optional llama3-type frequency scaling
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


class SmolLM3RotaryEmbedding(nn.Module):
    """cos/sin tables for the step's positions.

    ``__init__`` keeps Python scalars only: the model is built on the meta
    device, so a tensor computed here would never hold data. The inverse
    frequencies are computed in ``forward`` on the input's device.
    """

    def __init__(self, config: SmolLM3Config):
        super().__init__()
        self.head_dim = config.head_dim
        self.rope_parameters = dict(config.rope_parameters)
        self.rope_theta = float(self.rope_parameters["rope_theta"])
        rope_type = self.rope_parameters.get("rope_type")
        # <-- MODEL-SPECIFIC: RoPE variants this model implements
        if rope_type == "llama3":
            self.scaling_factor = float(self.rope_parameters.get("factor", 1.0))
            self.low_freq_factor = float(self.rope_parameters.get("low_freq_factor", 1.0))
            self.high_freq_factor = float(self.rope_parameters.get("high_freq_factor", 1.0))
            self.original_max_position_embeddings = int(
                self.rope_parameters.get("original_max_position_embeddings", 8192)
            )
        elif rope_type not in (None, "default"):
            raise NotImplementedError(f"rope_type {rope_type!r} is not supported (default, llama3)")

    def _compute_inv_freq(self, device: torch.device) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device)
        inv_freq = 1.0 / (self.rope_theta ** (exponents.to(torch.float32) / self.head_dim))
        if self.rope_parameters.get("rope_type") == "llama3":
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
# Mixed: PARALLELISM (head sharding over TP and attention DP, SP gather/scatter,
#        DCP, collectives) +
#        MODEL-SPECIFIC (GQA, no QKV bias, RoPE fused into the kernels)
# =============================================================================


def _interleaved_rows(x: torch.Tensor, width: int, interleave: int, index: int) -> torch.Tensor:
    """The rows of ``x`` (dim 0) that context-parallel rank ``index`` of
    ``width`` holds: runs of ``interleave`` rows dealt to the ranks in turn."""
    rows = x.shape[0]
    grouped = x.reshape(rows // (width * interleave), width, interleave, *x.shape[1:])
    return grouped[:, index].reshape(-1, *x.shape[1:])


def _interleave_order(total: int, width: int, interleave: int, device: torch.device) -> torch.Tensor:
    """For each position ``p < total``, its row in the rank-major gather of
    the interleaved shares (rank ``r``'s ``total / width`` rows after those of
    ranks ``0 .. r-1``)."""
    local = total // width
    p = torch.arange(total, device=device)
    owner = (p // interleave) % width
    row_in_share = (p // (width * interleave)) * interleave + p % interleave
    return owner * local + row_in_share


class SmolLM3Attention(nn.Module):
    """Grouped-query attention with a paged KV cache.

    Sharding: Q and O heads over ``effective_q_shards = TP * attention DP``
    (the decode kernel exchanges heads across the attention-DP ranks, each of
    which attends for its own batch); K/V heads over TP (replicated when
    fewer than the TP ranks), and over attention DP too when there are
    enough of them (``kv_needs_a2a``), the cache keeping the TP share.
    """

    def __init__(self, config: SmolLM3Config, layer_idx: int):
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
        # <-- MODEL-SPECIFIC: this layer rotates q and k (False: no positional embedding)
        self.use_rope = _layer_uses_rope(config, layer_idx)
        neuron_config = config.neuron_config

        # >>> PARALLELISM: decode context parallelism (DCP) groups <<<
        dcp_group = get_dcp_group()
        self.dcp_size = dcp_group.world_size
        self.dcp_group = dcp_group if self.dcp_size > 1 else None
        self.cp_kv_group = get_neuron_dcp_kv_group()
        self.apply_prefill_dcp = neuron_config.apply_prefill_dcp if neuron_config else False

        # >>> PARALLELISM: TP group setup <<<
        full_tp_group = get_tp_group()
        if self.apply_prefill_dcp and self.dcp_size > 1:
            # Context-parallel prefill: heads are sharded over the ranks that
            # hold the same tokens (dcp_tp_group), tokens over cp_kv_group;
            # world_group gathers the whole SP sequence first.
            self.tp_group = get_neuron_dcp_tp_group()
            self.world_group = full_tp_group
        else:
            self.tp_group = full_tp_group
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group

        # >>> PARALLELISM: this rank's token share under DCP <<<
        ranks_per_share = full_tp_group.world_size // max(self.dcp_size, 1)
        self.cp_chunk_idx = full_tp_group.rank_in_group // ranks_per_share if self.dcp_size > 1 else 0
        parallel_config = get_current_vllm_config().parallel_config
        self.cp_kv_cache_interleave_size = getattr(parallel_config, "cp_kv_cache_interleave_size", 1)

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

        # Paged KV cache, bound by bind_kv_cache()
        self.k_cache = None
        self.v_cache = None
        # FP8 KV-cache scales, set by _load_kv_cache_scales (quantize: x * scale);
        # the floats are baked into the decode kernel call (no .item() in forward)
        self.register_buffer("k_scale", None, persistent=False)
        self.register_buffer("v_scale", None, persistent=False)
        self.k_scale_float = 1.0
        self.v_scale_float = 1.0

        # Set by an Eagle3 drafter: decode reads the prior KV only up to the
        # step's longest context (kernel-built mask, max_context_len).
        self.bounded_gather = False

        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: TP (and attention-DP) sharding of the QKV and O projections. <<<

        Q and O are sharded over TP * attention DP: their shard of rank
        ``(tp rank, attention-DP rank)`` is ``attention_dp_rank + tp_rank *
        attention_dp_size``. The fused loader takes the attention-DP position
        itself (K/V use the TP rank unless ``kv_needs_a2a``); the O loader is
        pinned to that rank with ``with_rank_override``.
        """
        effective_q_shards = self.world_size * self.attention_dp_size
        effective_q_rank = self.attention_dp_rank + self.rank * self.attention_dp_size
        o_shard_size = self.num_attention_heads * self.head_dim // effective_q_shards
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
                attention_dp_rank=self.attention_dp_rank,
                attention_dp_size=self.attention_dp_size,
                kv_sharded_across_attention_dp=self.kv_needs_a2a,
            ),
        )
        set_weight_loader(
            self.o_proj_weight,
            with_rank_override(
                sharding_weight_loader(
                    shard_dim=0,
                    shard_size=o_shard_size,
                    num_shards=effective_q_shards,
                    is_storage_transposed=True,
                ),
                rank=effective_q_rank,
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
        # <-- MODEL-SPECIFIC: no positional embedding: rotate by angle zero
        if not self.use_rope:
            cos, sin = position_embeddings
            position_embeddings = (torch.ones_like(cos), torch.zeros_like(sin))
        meta = attn_metadata[f"layers.{self.layer_idx}.self_attn"]
        if meta["max_query_len"] <= meta["decode_token_threshold"]:
            return self.forward_decode(hidden_states, positions, position_embeddings, attn_metadata)

        if self.apply_prefill_dcp and self.dcp_size > 1:
            # >>> PARALLELISM: DCP prefill: gather the whole sequence, keep this rank's share <<<
            hidden_states = self.world_group.all_gather(hidden_states, dim=0)
            share = (self.dcp_size, self.cp_kv_cache_interleave_size, self.cp_chunk_idx)
            hidden_states = _interleaved_rows(hidden_states, *share)
            cos, sin = position_embeddings
            position_embeddings = (_interleaved_rows(cos, *share), _interleaved_rows(sin, *share))
            positions = _interleaved_rows(positions, *share)
        elif self.world_size > 1:
            # >>> PARALLELISM: All-gather from SP before attention <<<
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

        # >>> PARALLELISM: the paged cache holds this rank's KV heads <<<
        meta = attn_metadata[f"layers.{self.layer_idx}.self_attn"]
        slot_mapping = meta["slot_mapping"]
        block_size = meta["block_size"]
        block_table = meta["block_table_tensor"]
        cached_seq_len = meta.get("cached_seq_len")
        kv_segment_size = meta.get("kv_segment_size")
        kv_is_fp8 = self.k_cache.dtype in _FP8_DTYPES

        # <-- MODEL-SPECIFIC: rotate-half RoPE, applied by the QKV kernel
        cos, sin = position_embeddings
        cos_cache = cos.unsqueeze(0)
        sin_cache = sin.unsqueeze(0)

        if kv_segment_size and self.dcp_size <= 1:
            # Chunked prefill: the kernel also writes the rotated K and V into
            # the paged cache (bf16 only: the segmented kernel cannot read a
            # non-packed FP8 cache), and only q comes back to attend with.
            validate_fp8_segmented_supported(kv_is_fp8, fp8_packed=False)
            in_cache = (slot_mapping >= 0) & (slot_mapping < self.k_cache.shape[0] * block_size)
            kernel_slots = torch.where(in_cache, slot_mapping, torch.zeros_like(slot_mapping))
            q_flat, _, _ = NF.qkv_proj(
                hidden=hidden_states.unsqueeze(0),
                qkv_weights=self.qkv_proj_weight,
                bias=None,
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
            k = v = None
        else:
            qkv = NF.qkv_proj(
                hidden=hidden_states.unsqueeze(0),
                qkv_weights=self.qkv_proj_weight,
                bias=None,
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

        def _write_kv_cache(k_new, v_new, slots):
            """Write [Nkv, T, Dh] K/V at ``slots`` of the cache [blocks, Nkv, block, Dh]."""
            heads = self.num_key_value_heads_per_rank
            k_rows = k_new.reshape(-1, self.head_dim)
            v_rows = v_new.reshape(-1, self.head_dim)
            if self.k_cache.dtype in _FP8_DTYPES:
                # <-- QUANTIZATION: FP8 cache entries are x * scale, clamped to the FP8 range
                k_rows = (k_rows * self.k_scale).clamp(-FP8_CLAMP_MAX, FP8_CLAMP_MAX)
                v_rows = (v_rows * self.v_scale).clamp(-FP8_CLAMP_MAX, FP8_CLAMP_MAX)
            index = (
                (slots // block_size).repeat(heads),
                torch.arange(heads, dtype=torch.long, device=slots.device).repeat_interleave(slots.shape[0]),
                (slots % block_size).repeat(heads),
            )
            self.k_cache.index_put_(index, k_rows.to(self.k_cache.dtype))
            self.v_cache.index_put_(index, v_rows.to(self.v_cache.dtype))

        # <-- MODEL-SPECIFIC: causal attention, no sinks, no sliding window
        if self.dcp_size > 1:
            # >>> PARALLELISM: DCP prefill (gather-Q): each rank holds the K/V of its tokens <<<
            _write_kv_cache(k, v, slot_mapping)
            local_tokens = q.shape[1]
            q_all = self.cp_kv_group.all_gather(q.contiguous(), dim=1)
            # rank-major gather -> sequence order
            order = _interleave_order(
                local_tokens * self.dcp_size, self.dcp_size, self.cp_kv_cache_interleave_size, q.device
            )
            q_all = q_all[:, order, :]
            local_prior = None if cached_seq_len is None else cached_seq_len // self.dcp_size
            # <-- MODEL-SPECIFIC: sliding window: a path whose kernel cannot mask it refuses
            if self.sliding_window is not None:
                raise NotImplementedError(
                    "sliding-window attention: NF.segmented_attention_cp (context-parallel prefill) takes no window"
                )
            attn_output = NF.segmented_attention_cp(
                q=q_all,
                k_local=k,
                v_local=v,
                k_cache=self.k_cache,
                v_cache=self.v_cache,
                block_tables=block_table,
                prior_tokens=local_prior,
                block_size=block_size,
                cp_rank=self.cp_chunk_idx,
                cp_world_size=self.dcp_size,
                cp_kv_cache_interleave_size=self.cp_kv_cache_interleave_size,
                cp_group=self.cp_kv_group,
                scale=self.scaling,
                tp_q=True,
                tp_out=True,
            )  # [Nq, Dh, T_local]
        elif kv_segment_size:
            # the chunk's K/V are in the cache already (written by the QKV kernel)
            # <-- MODEL-SPECIFIC: sliding window: a path whose kernel cannot mask it refuses
            if self.sliding_window is not None and self.sliding_window % block_size != 0:
                raise NotImplementedError(
                    "sliding-window attention: NF.segmented_attention needs a window of whole KV-cache blocks"
                )
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
            _write_kv_cache(k, v, slot_mapping)
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

    def _dcp_decode_mask_inputs(self, cached_seq_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """>>> PARALLELISM: DCP decode: how many of the prior slots this rank
        holds, and whether it owns the step's token. <<<

        The context is dealt to the DCP ranks in runs of ``interleave`` tokens;
        of the first ``n`` tokens, rank ``r`` holds ``interleave`` per whole
        round plus its part of the last, partial round. The active token
        (position ``n``) belongs to the rank whose run it falls in; only that
        rank counts it, so the merge across ranks sees it once."""
        interleave = self.cp_kv_cache_interleave_size
        width = self.dcp_size
        rank = self.dcp_group.rank_in_group
        n = cached_seq_len.to(torch.float32)
        rounds = torch.div(n, interleave * width, rounding_mode="floor")
        rest = n - rounds * interleave * width
        local_filled = rounds * interleave + torch.clamp(rest - rank * interleave, min=0, max=interleave)
        owner = torch.div(rest, interleave, rounding_mode="floor") % width
        dcp_active_mask = (owner == rank).to(torch.float32)
        return local_filled, dcp_active_mask

    def forward_decode(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: object,
    ):
        """B sequences of S new tokens each: [B * S, H] in and out.

        With attention DP the rows hold the batches of every attention-DP
        rank (the decoder layer gathered them); the block table, positions
        and slots are this rank's."""
        meta = attn_metadata[f"layers.{self.layer_idx}.self_attn"]
        slot_mapping = meta["slot_mapping"]
        block_size = meta["block_size"]
        block_table = meta["block_table_tensor"]
        context = meta["max_blocks_per_seq"] * block_size

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

        # >>> PARALLELISM: DCP decode: the context is interleaved over the DCP ranks <<<
        dcp_decode_active = self.dcp_size > 1 and not self.apply_prefill_dcp
        mask_q_heads = self.num_q_heads_after_a2a * (self.dcp_size if dcp_decode_active else 1)
        local_filled = None
        dcp_active_mask = None
        if dcp_decode_active:
            local_filled, dcp_active_mask = self._dcp_decode_mask_inputs(meta["cached_seq_len"])

        pos_ids = positions.view(1, local_batch * new_tokens)
        if self.bounded_gather:
            # The kernel builds the mask from pos_ids and reads the prior KV
            # only up to the longest context of the step.
            if dcp_decode_active:
                raise NotImplementedError("bounded_gather decode does not support DCP")
            max_context_len = (positions.max() + 1).reshape(1).to(torch.int32)
            pos_ids = pos_ids.to(torch.float32)
            attention_mask = None
        else:
            # <-- MODEL-SPECIFIC: causal mask over the prior and active tokens
            # <-- MODEL-SPECIFIC: sliding window: a path whose kernel cannot mask it refuses
            if self.sliding_window is not None and local_filled is not None:
                raise NotImplementedError(
                    "sliding-window attention: the context-parallel decode mask (local_filled_slots) takes no window"
                )
            # <-- MODEL-SPECIFIC: sliding window: mask prior positions before p - window + 1
            start_pos = None
            if self.sliding_window is not None:
                start_pos = torch.clamp(pos_ids.to(torch.float32) - (self.sliding_window - 1), min=0)
            attention_mask = NF.gen_attention_decode_mask(
                pos_ids=pos_ids.to(torch.float32),
                bs=local_batch,
                q_head=mask_q_heads,
                s_active=new_tokens,
                s_prior=context,
                start_pos=start_pos,
                block_len=block_size,
                local_filled_slots=local_filled,
                dcp_active_mask=dcp_active_mask,
            )
            pos_ids = None
            max_context_len = None

        cache_is_fp8 = self.k_cache.dtype in _FP8_DTYPES
        output = NF.attention_decode(
            X=x,
            X_hidden_dim_actual=self.hidden_size,
            rmsnorm_X_enabled=False,
            W_qkv=self.qkv_proj_weight,
            bias_qkv=None,
            rmsnorm_QK_pre_rope_enabled=False,
            rmsnorm_QK_post_rope_enabled=False,
            cos=cos_kernel,
            sin=sin_kernel,
            rope_contiguous_layout=True,
            K_cache_transposed=False,
            active_blocks_table=block_table,
            K_cache=self.k_cache,
            V_cache=self.v_cache,
            attention_mask=attention_mask,
            pos_ids=pos_ids,
            swa_start_pos_ids=_window_start(pos_ids, self.sliding_window),
            max_context_len=max_context_len,
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
            dcp_size=self.dcp_size if dcp_decode_active else 1,
            dcp_group=self.dcp_group if dcp_decode_active else None,
        )

        # >>> PARALLELISM: sum the partial outputs over the TP * attention-DP supergroup <<<
        output = self.attn_tp_group.all_reduce(output)
        return output


# =============================================================================
# Section 4: MLP (Dense)
# Mixed: PARALLELISM (intermediate sharding over TP * MLP DP, collectives) +
#        MODEL-SPECIFIC (SiLU-gated MLP, no bias)
# =============================================================================


class SmolLM3MLP(nn.Module):
    """down(silu(x @ gate) * (x @ up)); the intermediate dimension is sharded
    over the MLP TP group (TP * MLP DP)."""

    def __init__(self, config: SmolLM3Config):
        super().__init__()
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size
        neuron_config = config.neuron_config

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group

        # >>> PARALLELISM: MLP data parallelism: the MLP TP group spans TP * MLP DP <<<
        self.mlp_dp_size = neuron_config.mlp_dp_size if neuron_config else 1
        self.mlp_tp_group = get_neuron_mlp_tp_group()
        self.mlp_tp_size = self.mlp_tp_group.world_size
        self.mlp_tp_rank = self.mlp_tp_group.rank_in_group
        self.mlp_dp_group = get_neuron_mlp_dp_group()
        self.intermediate_size_per_rank = config.intermediate_size // self.mlp_tp_size

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
        """>>> PARALLELISM: shard the intermediate dimension over the MLP TP group. <<<

        gate and up share one loader; both loaders read the shard of this
        rank's place in the MLP TP group."""
        gate_up_loader = sharding_weight_loader(
            shard_dim=1,
            shard_size=self.intermediate_size_per_rank,
            num_shards=self.mlp_tp_size,
            is_storage_transposed=True,
        )
        down_loader = sharding_weight_loader(
            shard_dim=0,
            shard_size=self.intermediate_size_per_rank,
            num_shards=self.mlp_tp_size,
            is_storage_transposed=True,
        )
        gate_up_loader = with_rank_override(gate_up_loader, rank=self.mlp_tp_rank)
        down_loader = with_rank_override(down_loader, rank=self.mlp_tp_rank)
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
        # >>> PARALLELISM: Reduce-scatter to SP (prefill) or all-reduce over the MLP TP group (decode) <<<
        if is_prefill:
            if self.world_size > 1:
                output = self.tp_group.reduce_scatter(output, dim=0)
        else:
            output = self.mlp_tp_group.all_reduce(output)
        return output


# =============================================================================
# Section 5: Decoder Layer
# Mixed: PARALLELISM (decode batch transitions between DP groups) +
#        MODEL-SPECIFIC (pre-norm residual blocks: norm -> sublayer -> add)
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


class SmolLM3DecoderLayer(nn.Module):
    """Pre-norm decoder layer: a decode ``forward`` (with the DP batch
    transitions and the FP8 branches of both sublayers) and a
    ``_forward_prefill`` (SP layout, FP8 branch of the MLP)."""

    def __init__(self, config: SmolLM3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        # <-- MODEL-SPECIFIC: pre-attention and pre-MLP RMSNorm
        self.input_layernorm = SmolLM3RMSNorm(
            config.hidden_size, config.rms_norm_eps, config.torch_dtype
        )
        self.post_attention_layernorm = SmolLM3RMSNorm(
            config.hidden_size, config.rms_norm_eps, config.torch_dtype
        )
        # <-- QUANTIZATION: the sublayer classes of this layer's scheme (bf16 without one)
        attn_cls, mlp_cls = resolve_attention_mlp_classes(config.quant_spec, layer_idx)
        self.self_attn = attn_cls(config, layer_idx=layer_idx)
        self.mlp = mlp_cls(config)
        quant_spec = config.quant_spec
        self._attn_scheme = (
            quant_spec.get_scheme(layer_idx, prefix="self_attn") if quant_spec else QuantScheme.NONE
        )
        self._mlp_scheme = (
            quant_spec.get_scheme(layer_idx, prefix="mlp") if quant_spec else QuantScheme.NONE
        )
        self.rms_norm_eps = config.rms_norm_eps

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
    ) -> torch.Tensor:
        if not self._is_decode(attn_metadata):
            return self._forward_prefill(hidden_states, positions, position_embeddings, attn_metadata)

        # >>> PARALLELISM: decode rows arrive in the MLP-DP state; attention runs in the attention-DP one <<<
        hidden_states = _dp_transition(hidden_states, self.mlp_dp_group, self.attn_dp_group)

        residual = hidden_states
        if self._attn_scheme is QuantScheme.FP8_STATIC_PER_TENSOR:
            # <-- QUANTIZATION: the FP8 attention fuses the input norm with its activation quantization
            hidden_states = self.self_attn(
                hidden_states=hidden_states,
                positions=positions,
                position_embeddings=position_embeddings,
                attn_metadata=attn_metadata,
                ln_w=self.input_layernorm.weight,
                eps=self.rms_norm_eps,
            )
        else:
            # <-- MODEL-SPECIFIC: pre-attention RMSNorm
            hidden_states = self.input_layernorm(hidden_states)
            hidden_states = self.self_attn(
                hidden_states=hidden_states,
                positions=positions,
                position_embeddings=position_embeddings,
                attn_metadata=attn_metadata,
            )
        hidden_states = residual + hidden_states

        # >>> PARALLELISM: back to the MLP-DP state <<<
        hidden_states = _dp_transition(hidden_states, self.attn_dp_group, self.mlp_dp_group)

        residual = hidden_states
        if self._mlp_scheme is QuantScheme.FP8_STATIC_PER_TENSOR:
            # <-- QUANTIZATION: the FP8 MLP fuses the pre-MLP norm with its activation quantization
            hidden_states = self.mlp(
                hidden_states,
                is_prefill=False,
                ln_w=self.post_attention_layernorm.weight,
                eps=self.rms_norm_eps,
            )
        else:
            # <-- MODEL-SPECIFIC: pre-MLP RMSNorm
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states = self.mlp(hidden_states, is_prefill=False)
        return residual + hidden_states

    def _forward_prefill(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: object | None = None,
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

        residual = hidden_states
        if self._mlp_scheme is QuantScheme.FP8_STATIC_PER_TENSOR:
            # <-- QUANTIZATION: the FP8 MLP applies the pre-MLP norm itself
            hidden_states = self.mlp(
                hidden_states,
                is_prefill=True,
                ln_w=self.post_attention_layernorm.weight,
                eps=self.rms_norm_eps,
            )
        else:
            # <-- MODEL-SPECIFIC: pre-MLP RMSNorm
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states = self.mlp(hidden_states, is_prefill=True)
        return residual + hidden_states


# =============================================================================
# Section 6: Model Backbone
# Mixed: PARALLELISM (vocabulary-sharded embedding with embedding DP, SP) +
#        MODEL-SPECIFIC (final RMSNorm, Eagle3 auxiliary hidden states)
# =============================================================================


class SmolLM3Model(nn.Module):
    def __init__(self, config: SmolLM3Config):
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
            [SmolLM3DecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        # <-- MODEL-SPECIFIC: final RMSNorm
        self.norm = SmolLM3RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
        self.rotary_emb = SmolLM3RotaryEmbedding(config)

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
        aux_hidden_states = []
        for layer_idx, layer in enumerate(self.layers):
            if layer_idx in self.aux_hidden_state_layers:
                aux_hidden_states.append(hidden_states)
            hidden_states = layer(
                hidden_states,
                positions=positions,
                position_embeddings=position_embeddings,
                attn_metadata=attn_metadata,
            )
        hidden_states = self.norm(hidden_states)

        # >>> PARALLELISM: gather the SP slices for the LM head (and the drafter) <<<
        if is_prefill and self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
            aux_hidden_states = [self.tp_group.all_gather(aux, dim=0) for aux in aux_hidden_states]
        return hidden_states, aux_hidden_states


# =============================================================================
# Section 7: Language Model Head, KV-cache spec and weight loading
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
class SmolLM3ForCausalLM(nn.Module, SupportsEagle3):
    def __init__(self, config: SmolLM3Config):
        super().__init__()
        self.config = config
        self.model = SmolLM3Model(config)
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
    ) -> "SmolLM3ForCausalLM":
        return cls(SmolLM3Config.from_configs(hf_config, neuron_config))

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
