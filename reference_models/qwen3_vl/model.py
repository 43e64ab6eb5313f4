# SPDX-License-Identifier: Apache-2.0
"""
Qwen3-VL for the vLLM Neuron backend (bf16)
===========================================

autoport-cst reference model ``qwen3_vl``: a vision-language model. The text
decoder is Qwen3 (grouped-query attention with an RMSNorm of each query and
key head before RoPE, SiLU-gated MLP, RMSNorm) with multimodal RoPE
(M-RoPE): every token has three positions (temporal, height, width) and the
rotary frequency pairs are dealt to them interleaved (T, H, W, T, H, W, ...;
``mrope_section`` pairs each, the rest temporal). Text tokens carry the same
position on all three rows; an image's tokens carry their (frame, row,
column) in the merged patch grid (``vision_preprocessing.mrope_positions``).

The vision tower (``vision_encoder``) turns each image into merged tokens
and deep-stack features; prefill puts the merged tokens in place of the
image placeholder tokens' embeddings and adds deep-stack level ``i`` to the
output of decoder layer ``i`` at those positions. Both are dense ``[T, H]``
tensors (zero rows for text tokens) so the compiled graph has static shapes.
A text-only request takes the text path unchanged: no vision inputs, and its
M-RoPE positions are the token positions on all three rows.

Supported parallelism: TP, with sequence-parallel (SP) hidden states between
decoder layers during prefill; the tower shards its heads over the same TP
group and runs the whole patch sequence on every rank.

Paths:
  prefill  [tower: embed_multimodal] -> embedding, merge of image tokens ->
           per layer: NF.qkv_proj -> QK norms -> M-RoPE -> paged KV-cache write ->
           NF.flash_attention (NF.segmented_attention when chunked) -> NF.o_proj,
           MLP, deep-stack add on the first layers
  decode   NF.attention_decode (fused QKV, pre-RoPE QK norms, M-RoPE cos/sin, paged
           attention, O projection) with update_cache=False; the KV cache is written here

ANNOTATION GUIDE (codemods anchor on these markers; keep them when editing):
  # >>> PARALLELISM: <what> <<<    parallelism plumbing, kept across ports
  # <-- MODEL-SPECIFIC: <what>     what changes when porting another architecture
  # <-- QUANTIZATION: <what>       FP8 KV-cache handling
"""

import logging

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

from .config import Qwen3VLConfig, Qwen3VLTextConfig
from .vision_encoder import Qwen3VLVisionModel
from .vision_preprocessing import (
    image_patch_spans,
    mrope_positions,
    patch_rotary_positions,
    position_interpolation,
)

logger = logging.getLogger(__name__)

_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)

# Hugging Face checkpoint prefixes of the two towers
HF_TEXT_PREFIX = "model.language_model"
HF_VISION_PREFIX = "model.visual"


# =============================================================================
# Section 1: RMS Normalization
# <-- MODEL-SPECIFIC: RMSNorm (no mean subtraction, no bias); the weight multiplies in the input dtype
# =============================================================================


class Qwen3VLTextRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


# =============================================================================
# Section 2: Multimodal Rotary Position Embedding (M-RoPE)
# <-- MODEL-SPECIFIC: three position rows, frequency pairs interleaved T, H, W by mrope_section
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


class Qwen3VLTextRotaryEmbedding(nn.Module):
    """cos/sin ``[T, head_dim]`` for the step's M-RoPE positions ``[3, T]``
    (or ``[T]``: a text-only step, the same position on all three rows).

    Frequency pair ``j`` turns with the height row when ``j % 3 == 1`` and
    ``j < 3 * mrope_section[1]``, with the width row when ``j % 3 == 2`` and
    ``j < 3 * mrope_section[2]``, and with the temporal row otherwise.
    ``__init__`` keeps Python scalars only (the model is built on meta)."""

    def __init__(self, config: Qwen3VLTextConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.rope_theta = float(config.rope_theta)
        self.mrope_section = list(config.mrope_section)

    def _compute_inv_freq(self, device: torch.device) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device)
        return 1.0 / (self.rope_theta ** (exponents.to(torch.float32) / self.head_dim))

    def _axis_of_pair(self, device: torch.device) -> torch.Tensor:
        """[Dh/2]: the position row (0 T, 1 H, 2 W) each frequency pair reads."""
        pair = torch.arange(self.head_dim // 2, device=device)
        axis = torch.zeros_like(pair)
        for row in (1, 2):
            axis = torch.where((pair % 3 == row) & (pair < 3 * self.mrope_section[row]), row, axis)
        return axis

    def forward(
        self, position_ids: torch.Tensor, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0).expand(3, -1)
        inv_freq = self._compute_inv_freq(device)
        freqs = position_ids.to(torch.float32)[..., None] * inv_freq  # [3, T, Dh/2]
        axis = self._axis_of_pair(device)
        freqs = torch.gather(freqs, 0, axis.view(1, 1, -1).expand(1, freqs.shape[1], -1)).squeeze(0)
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, Dh]
        return emb.cos().to(dtype), emb.sin().to(dtype)


# =============================================================================
# Section 3: Attention
# Mixed: PARALLELISM (head sharding, SP gather/scatter, collectives) +
#        MODEL-SPECIFIC (GQA, no QKV bias, per-head QK RMSNorm, M-RoPE cos/sin)
# =============================================================================


class Qwen3VLTextAttention(nn.Module):
    """Grouped-query attention with TP head sharding and a paged KV cache."""

    def __init__(self, config: Qwen3VLTextConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size
        self.num_attention_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        # <-- MODEL-SPECIFIC: full attention on every layer
        self.sliding_window = None

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
        self.num_key_value_groups = self.num_attention_heads_per_rank // self.num_key_value_heads_per_rank

        # <-- MODEL-SPECIFIC: fused QKV, stored [hidden, q|k|v]; O stored [q, hidden]
        self.q_size = self.num_attention_heads_per_rank * self.head_dim
        self.kv_size = self.num_key_value_heads_per_rank * self.head_dim
        qkv_size = self.q_size + 2 * self.kv_size
        self.qkv_split_indices = [self.q_size, self.q_size + self.kv_size]
        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size, dtype=self.dtype))
        self.o_proj_weight = nn.Parameter(torch.empty(self.q_size, self.hidden_size, dtype=self.dtype))
        # <-- MODEL-SPECIFIC: RMSNorm of each query and key head before RoPE
        self.q_norm = Qwen3VLTextRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)
        self.k_norm = Qwen3VLTextRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)

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

        # <-- MODEL-SPECIFIC: rotate-half M-RoPE on all of head_dim (cos/sin from the 3-D positions)
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
        attention_mask = NF.gen_attention_decode_mask(
            pos_ids=pos_ids,
            bs=batch,
            q_head=self.num_attention_heads_per_rank,
            s_active=new_tokens,
            s_prior=context,
            start_pos=None,
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


class Qwen3VLTextMLP(nn.Module):
    """down(silu(x @ gate) * (x @ up)), intermediate dimension sharded over TP."""

    def __init__(self, config: Qwen3VLTextConfig):
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


class Qwen3VLTextDecoderLayer(nn.Module):
    def __init__(self, config: Qwen3VLTextConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.input_layernorm = Qwen3VLTextRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
        self.post_attention_layernorm = Qwen3VLTextRMSNorm(
            config.hidden_size, config.rms_norm_eps, config.torch_dtype
        )
        self.self_attn = Qwen3VLTextAttention(config, layer_idx=layer_idx)
        self.mlp = Qwen3VLTextMLP(config)

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
#        MODEL-SPECIFIC (image tokens merged into the embeddings, deep-stack adds, final RMSNorm)
# =============================================================================


class Qwen3VLTextModel(nn.Module):
    def __init__(self, config: Qwen3VLTextConfig):
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
            [Qwen3VLTextDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        # <-- MODEL-SPECIFIC: final RMSNorm
        self.norm = Qwen3VLTextRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
        self.rotary_emb = Qwen3VLTextRotaryEmbedding(config)

    def _sp_rows(self, tensor: torch.Tensor | None, rows: int, dim: int = 0) -> torch.Tensor | None:
        """>>> PARALLELISM: this rank's SP slice of a per-token prefill tensor <<<"""
        if tensor is None or self.world_size == 1:
            return tensor
        return tensor.narrow(dim, self.rank * rows, rows)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        rotary_position_ids: torch.Tensor | None = None,
        attn_metadata: object | None = None,
        rank: torch.Tensor | None = None,
        vision_embeds: torch.Tensor | None = None,
        vision_mask: torch.Tensor | None = None,
        deepstack_embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``vision_embeds`` ``[T, H]`` and ``deepstack_embeds`` ``[levels, T, H]``
        hold the tower's rows at the image tokens (``vision_mask`` ``[T]``) and
        zeros elsewhere; all three are None for a text-only step."""
        first = attn_metadata["layers.0.self_attn"]
        is_prefill = first["max_query_len"] > first["decode_token_threshold"]

        # >>> PARALLELISM: prefill embeddings come back as this rank's SP slice <<<
        hidden_states = self.embed_tokens(input_ids, scatter_tokens=is_prefill, rank=rank)
        rows = hidden_states.shape[0]
        # <-- MODEL-SPECIFIC: image features replace the placeholder tokens' embeddings
        has_vision = is_prefill and vision_embeds is not None and vision_mask is not None
        if has_vision:
            mask = self._sp_rows(vision_mask, rows).unsqueeze(-1)
            features = self._sp_rows(vision_embeds, rows).to(hidden_states.dtype)
            hidden_states = torch.where(mask, features, hidden_states)
            if deepstack_embeds is not None:
                deepstack_embeds = self._sp_rows(deepstack_embeds, rows, dim=1)

        if rotary_position_ids is None:
            rotary_position_ids = positions
        position_embeddings = self.rotary_emb(
            rotary_position_ids, device=hidden_states.device, dtype=hidden_states.dtype
        )
        for layer_idx, layer in enumerate(self.layers):
            hidden_states = layer(
                hidden_states,
                positions=positions,
                position_embeddings=position_embeddings,
                attn_metadata=attn_metadata,
            )
            # <-- MODEL-SPECIFIC: deep-stack level i is added after decoder layer i (zero rows: text)
            if has_vision and deepstack_embeds is not None and layer_idx < deepstack_embeds.shape[0]:
                hidden_states = hidden_states + deepstack_embeds[layer_idx].to(hidden_states.dtype)
        hidden_states = self.norm(hidden_states)

        # >>> PARALLELISM: gather the SP slices for the LM head <<<
        if is_prefill and self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
        return hidden_states, []


# =============================================================================
# Section 7: Multimodal model: vision tower, LM head, M-RoPE positions, KV-cache spec, weights
# Mixed: PARALLELISM (vocabulary-sharded LM head) +
#        MODEL-SPECIFIC (the tower's inputs and outputs, checkpoint key mapping)
# =============================================================================


def _mask_padded_vocabulary(logits: torch.Tensor, vocab_size: int, rank) -> torch.Tensor:
    """This LM-head rank's logits ``[N, V_padded / tp]`` with the columns of
    the vocabulary's padding (ids from ``vocab_size`` on) at -inf, so that a
    sampler over the shards never picks one."""
    width = logits.shape[-1]
    columns = torch.arange(width, device=logits.device) + rank * width
    return logits.masked_fill(columns >= vocab_size, float("-inf"))


class Qwen3VLForConditionalGeneration(nn.Module):
    def __init__(self, config: Qwen3VLConfig):
        super().__init__()
        self.config = config
        self.text_config = config.text_config
        self.vision_config = config.vision_config
        self.visual = Qwen3VLVisionModel(config.vision_config)
        self.language_model = Qwen3VLTextModel(config.text_config)
        neuron_config = config.neuron_config

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group

        self.on_device_sampling_config = (
            neuron_config.on_device_sampling_config if neuron_config is not None else None
        )
        self._gather_logits = neuron_config is not None and (
            neuron_config.max_logprobs != 0 or neuron_config.debug_logits_dir is not None
        )
        # >>> PARALLELISM: the vocabulary padded to a multiple of the TP size <<<
        # (ColumnParallelLinear shards evenly: the last shard ends in zero rows, whose
        # logits forward drops or masks)
        self.vocab_size = self.text_config.vocab_size
        padded_vocab_size = -(-self.text_config.vocab_size // self.world_size) * self.world_size
        # <-- MODEL-SPECIFIC: no LM-head bias; a tied LM head loads the embedding (load_weights)
        self.lm_head = neuron_nn.ColumnParallelLinear(
            self.text_config.hidden_size,
            padded_vocab_size,
            bias=False,
            dtype=self.text_config.torch_dtype,
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
            self.sampler = Sampler(self.on_device_sampling_config, process_group=self.tp_group.device_group)

    @classmethod
    def from_configs(
        cls, hf_config: PretrainedConfig, neuron_config: NeuronConfig | None = None
    ) -> "Qwen3VLForConditionalGeneration":
        return cls(Qwen3VLConfig.from_configs(hf_config, neuron_config))

    # -- host side: M-RoPE positions and the tower's inputs ---------------------------

    def get_mrope_input_positions(
        self, input_tokens: list[int], image_grid_thw=None
    ) -> tuple[torch.Tensor, int]:
        """``([3, T], delta)`` for a prompt; decode step ``n`` (sequence index
        ``n``) has position ``n + delta`` on all three rows."""
        return mrope_positions(
            list(input_tokens),
            image_grid_thw,
            self.config.image_token_id,
            self.vision_config.spatial_merge_size,
        )

    def embed_multimodal(
        self, pixel_values: torch.Tensor, image_grid_thw
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The tower on the prompt's images: (merged tokens ``[N, H]``,
        deep-stack features ``[levels, N, H]``), images in prompt order."""
        merge = self.vision_config.spatial_merge_size
        indices, weights = position_interpolation(
            image_grid_thw, merge, self.vision_config.num_position_embeddings
        )
        return self.visual(
            pixel_values,
            patch_positions=patch_rotary_positions(image_grid_thw, merge),
            interp_indices=indices,
            interp_weights=weights,
            frame_spans=image_patch_spans(image_grid_thw),
        )

    def _scatter_vision(
        self, input_ids: torch.Tensor, embeds: torch.Tensor, deepstack: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Dense per-token rows: the i-th image token takes the i-th merged token."""
        mask = input_ids == self.config.image_token_id
        order = (torch.cumsum(mask.to(torch.int64), dim=0) - 1).clamp(min=0)
        dense = torch.where(mask.unsqueeze(-1), embeds[order], torch.zeros_like(embeds[order]))
        dense_deepstack = torch.where(mask.view(1, -1, 1), deepstack[:, order], 0.0)
        return dense, mask, dense_deepstack

    # -- forward ----------------------------------------------------------------------

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
        rotary_position_ids: torch.Tensor | None = None,
        vision_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ):
        """``rotary_position_ids`` ``[3, T]``: the M-RoPE positions (None: a
        text-only step, ``positions`` on all three rows). ``vision_embeddings``:
        ``embed_multimodal``'s output for this prefill's images (None: no image)."""
        positions = positions.to(torch.int32)
        first = attn_metadata["layers.0.self_attn"]
        is_prefill = first["max_query_len"] > first["decode_token_threshold"]
        tokens = input_ids.shape[0]
        # >>> PARALLELISM: SP length validation <<<
        if is_prefill and (tokens <= self.world_size or tokens % self.world_size != 0):
            raise ValueError(
                f"prefill length {tokens} must exceed and be divisible by the TP size {self.world_size}"
            )

        vision_embeds = vision_mask = deepstack_embeds = None
        if is_prefill and vision_embeddings is not None and first.get("kv_segment_size"):
            # <-- MODEL-SPECIFIC: the merge hands out the tower's rows from the call's first image token on
            raise NotImplementedError("a prompt with images must be prefilled in one call, not in segments")
        if is_prefill and vision_embeddings is not None:
            vision_embeds, vision_mask, deepstack_embeds = self._scatter_vision(input_ids, *vision_embeddings)
        hidden_states, _ = self.language_model(
            input_ids,
            positions,
            rotary_position_ids=rotary_position_ids,
            attn_metadata=attn_metadata,
            rank=rank,
            vision_embeds=vision_embeds,
            vision_mask=vision_mask,
            deepstack_embeds=deepstack_embeds,
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

    # -- KV cache ---------------------------------------------------------------------

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
            for layer_idx, layer in enumerate(self.language_model.layers)
        ]
        return KVSpec(layers=layers)

    def bind_kv_cache(self, kv_caches) -> None:
        for layer_idx, layer in enumerate(self.language_model.layers):
            name = f"layers.{layer_idx}.self_attn"
            if name not in kv_caches:
                raise KeyError(f"no KV cache allocated for {name}")
            layer.self_attn.k_cache = kv_caches[name][0]
            layer.self_attn.v_cache = kv_caches[name][1]

    # -- weights ----------------------------------------------------------------------

    def _text_mappings(self) -> dict:
        # <-- MODEL-SPECIFIC: Hugging Face checkpoint keys of the text decoder
        mappings = {}
        for layer_id in range(len(self.language_model.layers)):
            prefix = f"language_model.layers.{layer_id}"
            source = f"{HF_TEXT_PREFIX}.layers.{layer_id}"
            mappings[f"{prefix}.input_layernorm.weight"] = f"{source}.input_layernorm.weight"
            mappings[f"{prefix}.post_attention_layernorm.weight"] = (
                f"{source}.post_attention_layernorm.weight"
            )
            mappings[f"{prefix}.self_attn.qkv_proj_weight"] = [
                f"{source}.self_attn.q_proj.weight",
                f"{source}.self_attn.k_proj.weight",
                f"{source}.self_attn.v_proj.weight",
            ]
            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{source}.self_attn.o_proj.weight"
            mappings[f"{prefix}.self_attn.q_norm.weight"] = f"{source}.self_attn.q_norm.weight"
            mappings[f"{prefix}.self_attn.k_norm.weight"] = f"{source}.self_attn.k_norm.weight"
            mappings[f"{prefix}.mlp.gate_proj_weight"] = f"{source}.mlp.gate_proj.weight"
            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{source}.mlp.up_proj.weight"
            mappings[f"{prefix}.mlp.down_proj_weight"] = f"{source}.mlp.down_proj.weight"
        mappings["language_model.embed_tokens.weight"] = f"{HF_TEXT_PREFIX}.embed_tokens.weight"
        mappings["language_model.norm.weight"] = f"{HF_TEXT_PREFIX}.norm.weight"
        # <-- MODEL-SPECIFIC: tied embeddings load the LM head from the embedding
        if self.text_config.tie_word_embeddings:
            mappings["lm_head.weight"] = f"{HF_TEXT_PREFIX}.embed_tokens.weight"
        else:
            mappings["lm_head.weight"] = "lm_head.weight"
        return mappings

    def _vision_mappings(self) -> dict:
        # <-- MODEL-SPECIFIC: Hugging Face checkpoint keys of the vision tower
        mappings = {
            "visual.patch_embed_weight": f"{HF_VISION_PREFIX}.patch_embed.proj.weight",
            "visual.patch_embed_bias": f"{HF_VISION_PREFIX}.patch_embed.proj.bias",
            "visual.pos_embed": f"{HF_VISION_PREFIX}.pos_embed.weight",
        }
        for block_id in range(len(self.visual.blocks)):
            prefix = f"visual.blocks.{block_id}"
            source = f"{HF_VISION_PREFIX}.blocks.{block_id}"
            for norm in ("norm1", "norm2"):
                mappings[f"{prefix}.{norm}.weight"] = f"{source}.{norm}.weight"
                mappings[f"{prefix}.{norm}.bias"] = f"{source}.{norm}.bias"
            mappings[f"{prefix}.attn.qkv_proj_weight"] = f"{source}.attn.qkv.weight"
            mappings[f"{prefix}.attn.qkv_proj_bias"] = f"{source}.attn.qkv.bias"
            mappings[f"{prefix}.attn.o_proj_weight"] = f"{source}.attn.proj.weight"
            mappings[f"{prefix}.attn.o_proj_bias"] = f"{source}.attn.proj.bias"
            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{source}.mlp.linear_fc1.weight"
            mappings[f"{prefix}.mlp.up_proj_bias"] = f"{source}.mlp.linear_fc1.bias"
            mappings[f"{prefix}.mlp.down_proj_weight"] = f"{source}.mlp.linear_fc2.weight"
            mappings[f"{prefix}.mlp.down_proj_bias"] = f"{source}.mlp.linear_fc2.bias"
        mergers = [("merger", "merger")] + [
            (f"deepstack_merger_list.{i}", f"deepstack_merger_list.{i}")
            for i in range(len(self.visual.deepstack_merger_list))
        ]
        for name, source in mergers:
            for part in ("norm.weight", "norm.bias"):
                mappings[f"visual.{name}.{part}"] = f"{HF_VISION_PREFIX}.{source}.{part}"
            for linear in ("linear_fc1", "linear_fc2"):
                mappings[f"visual.{name}.{linear}_weight"] = f"{HF_VISION_PREFIX}.{source}.{linear}.weight"
                mappings[f"visual.{name}.{linear}_bias"] = f"{HF_VISION_PREFIX}.{source}.{linear}.bias"
        return mappings

    def load_weights(self, checkpoint_path: str, device: torch.device, cache_dir: str | None):
        """Load this rank's shard of every parameter of both towers from a
        safetensors checkpoint, then the FP8 KV-cache scales."""
        mappings = {**self._text_mappings(), **self._vision_mappings()}
        checkpoint = SafetensorsCheckpoint(checkpoint_path, cache_dir)
        result = checkpoint.load_sharded_pipelined(self.rank, self.world_size, self, mappings, device)
        state = result.state_dict
        for name, tensor in state.items():
            if tensor.dtype != self.text_config.torch_dtype:
                state[name] = tensor.to(self.text_config.torch_dtype)
        self._load_kv_cache_scales(checkpoint, device)
        self.load_state_dict(state, strict=False, assign=True)
        return result

    def load_weights_lite(self, checkpoint_path: str, device: torch.device, cache_dir: str | None):
        """For CPU compilation: only the KV-cache scale floats."""
        checkpoint = SafetensorsCheckpoint(checkpoint_path, cache_dir)
        checkpoint._ensure_indexed()
        self._load_kv_cache_scales(checkpoint, device)

    def _load_kv_cache_scales(self, checkpoint: SafetensorsCheckpoint, device: torch.device) -> None:
        """With an FP8 KV cache, each attention's ``k_scale``/``v_scale`` ([1, 1])
        and their floats; the cache write multiplies, so the reciprocal is kept."""
        from vllm_neuron.utils.dtype_utils import QUANTIZED_KV_CACHE_DTYPES

        if get_current_vllm_config().cache_config.cache_dtype not in QUANTIZED_KV_CACHE_DTYPES:
            return
        for layer_id, layer in enumerate(self.language_model.layers):
            attn = layer.self_attn
            for scale_name in ("k_scale", "v_scale"):
                key = f"{HF_TEXT_PREFIX}.layers.{layer_id}.self_attn.{scale_name}"
                if key in checkpoint._tensor_name_to_file:
                    stored = checkpoint._get_slice(key)[:].to(dtype=torch.bfloat16, device=device)
                    value = 1.0 / stored
                else:
                    value = torch.ones(1, dtype=torch.bfloat16, device=device)
                setattr(attn, scale_name, value.reshape(1, 1))
            # load time: .item() is allowed here
            attn.k_scale_float = attn.k_scale.item()
            attn.v_scale_float = attn.v_scale.item()
