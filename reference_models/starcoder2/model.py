# SPDX-License-Identifier: Apache-2.0
"""
Starcoder2 for the vLLM Neuron backend (bf16)
=============================================

autoport-cst reference model ``starcoder2``: a dense decoder with
grouped-query attention with biases on the Q, K, V and output projections,
optional sliding-window attention, a plain (non-gated) MLP with the tanh
approximation of GELU and biases, LayerNorm with bias, and rotate-half rotary
position embedding (default frequencies, or Llama 3 frequency scaling). Tied
and untied embeddings are both handled at load time. The checkpoint calls the
MLP projections ``c_fc`` and ``c_proj``.

Supported parallelism: TP, with sequence-parallel (SP) hidden states between
layers during prefill.

Paths:
  prefill  NF.qkv_proj -> RoPE -> paged KV-cache write -> NF.flash_attention -> NF.o_proj
  decode   NF.attention_decode (fused QKV, RoPE, paged attention, cache write, O projection)

ANNOTATION GUIDE (codemods anchor on these markers; keep them when editing):
  # >>> PARALLELISM: <what> <<<    parallelism plumbing, kept across ports
  # <-- MODEL-SPECIFIC: <what>     what changes when porting another architecture
"""

import math

import torch
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
    scaled_bias_loader,
    set_weight_loader,
    sharding_weight_loader,
)

from nkilib.core.utils.common_types import ActFnType

from .config import Starcoder2Config


def _is_prefill(attn_metadata, layer_name: str = "layers.0.self_attn") -> bool:
    """Prefill when the step has more query tokens than the decode threshold."""
    if attn_metadata is None:
        return False
    meta = attn_metadata[layer_name]
    return meta["max_query_len"] > meta["decode_token_threshold"]


# =============================================================================
# Section 1: Layer Normalization
# <-- MODEL-SPECIFIC: Starcoder2 uses LayerNorm with bias (mean subtracted)
# =============================================================================


class Starcoder2LayerNorm(nn.Module):
    """LayerNorm with bias, computed in float32 and cast back to the input dtype."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        mean = hidden_states.mean(-1, keepdim=True)
        variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
        hidden_states = (hidden_states - mean) * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states + self.bias).to(input_dtype)


# =============================================================================
# Section 2: Rotary Position Embedding
# <-- MODEL-SPECIFIC: rotate-half RoPE (default frequencies, or Llama 3 frequency scaling)
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


class Starcoder2RotaryEmbedding(nn.Module):
    """cos/sin tables for the step's positions.

    ``__init__`` keeps Python scalars only: the model is built on the meta
    device, so a tensor computed here would never hold data. The inverse
    frequencies are computed in ``forward`` on the input's device.
    """

    def __init__(self, config: Starcoder2Config):
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
#        MODEL-SPECIFIC (GQA, Q/K/V and O biases, sliding window, rotate-half RoPE)
# =============================================================================


class Starcoder2Attention(nn.Module):
    """Grouped-query attention with TP head sharding and a paged KV cache."""

    def __init__(self, config: Starcoder2Config, layer_idx: int):
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
        self.sliding_window = config.sliding_window if config.use_sliding_window else None

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
        attn_output = NF.flash_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v,
            scale=self.scaling,
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


def fused_qkv_bias_loader(q_size, kv_size, num_shards, num_kv_replicas=1):
    """Loader for a fused [q | k | v] bias from separate q, k and v bias tensors.

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


# =============================================================================
# Section 4: MLP (Dense)
# Mixed: PARALLELISM (intermediate sharding, collectives) +
#        MODEL-SPECIFIC (plain GELU-tanh MLP with biases)
# =============================================================================


class Starcoder2MLP(nn.Module):
    """c_proj(gelu_tanh(x @ c_fc + b_fc)) + b_proj, intermediate dimension sharded over TP.

    The checkpoint's ``c_fc`` and ``c_proj`` are held as ``up_proj_*`` and
    ``down_proj_*`` (the names ``NF.mlp`` gives them)."""

    def __init__(self, config: Starcoder2Config):
        super().__init__()
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.intermediate_size_per_rank = config.intermediate_size // self.world_size

        # <-- MODEL-SPECIFIC: up/down stored transposed ([in, out]), with biases
        self.up_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, self.intermediate_size_per_rank, dtype=self.dtype)
        )
        self.up_proj_bias = nn.Parameter(
            torch.zeros(self.intermediate_size_per_rank, dtype=self.dtype)
        )
        self.down_proj_weight = nn.Parameter(
            torch.empty(self.intermediate_size_per_rank, self.hidden_size, dtype=self.dtype)
        )
        self.down_proj_bias = nn.Parameter(torch.zeros(self.hidden_size, dtype=self.dtype))
        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: shard the intermediate dimension. <<<"""
        set_weight_loader(
            self.up_proj_weight,
            sharding_weight_loader(
                shard_dim=1,
                shard_size=self.intermediate_size_per_rank,
                num_shards=self.world_size,
                is_storage_transposed=True,
            ),
        )
        set_weight_loader(
            self.up_proj_bias,
            sharding_weight_loader(
                shard_dim=0,
                shard_size=self.intermediate_size_per_rank,
                num_shards=self.world_size,
            ),
        )
        set_weight_loader(
            self.down_proj_weight,
            sharding_weight_loader(
                shard_dim=0,
                shard_size=self.intermediate_size_per_rank,
                num_shards=self.world_size,
                is_storage_transposed=True,
            ),
        )
        # The down bias is added to every rank's partial sum before the reduction.
        set_weight_loader(self.down_proj_bias, scaled_bias_loader(scale=self.world_size))

    def forward(self, hidden_states: torch.Tensor, is_prefill: bool) -> torch.Tensor:
        # >>> PARALLELISM: All-gather from SP in prefill <<<
        if is_prefill and self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
        # <-- MODEL-SPECIFIC: plain MLP (no gate; the up weight fills the gate slot) with GELU-tanh
        output = NF.mlp(
            hidden_states.to(self.dtype),
            self.up_proj_weight,
            self.up_proj_weight,
            self.down_proj_weight,
            act_fn=ActFnType.GELU_Tanh_Approx,
            skip_gate=True,
            up_b=self.up_proj_bias.unsqueeze(0),
            down_b=self.down_proj_bias.unsqueeze(0),
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


class Starcoder2DecoderLayer(nn.Module):
    def __init__(self, config: Starcoder2Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.self_attn = Starcoder2Attention(config, layer_idx)
        self.mlp = Starcoder2MLP(config)
        self.input_layernorm = Starcoder2LayerNorm(
            config.hidden_size, config.norm_epsilon, config.torch_dtype
        )
        self.post_attention_layernorm = Starcoder2LayerNorm(
            config.hidden_size, config.norm_epsilon, config.torch_dtype
        )

    def forward(self, hidden_states, positions, position_embeddings, attn_metadata=None):
        is_prefill = _is_prefill(attn_metadata, self.self_attn.layer_name)

        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, positions, position_embeddings, attn_metadata)
        hidden_states = residual + hidden_states

        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states, is_prefill=is_prefill)
        return residual + hidden_states


# =============================================================================
# Section 6: Model Backbone
# Mixed: PARALLELISM (vocabulary-sharded embedding, SP) +
#        MODEL-SPECIFIC (final LayerNorm)
# =============================================================================


class Starcoder2Model(nn.Module):
    def __init__(self, config: Starcoder2Config):
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
            [Starcoder2DecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        self.norm = Starcoder2LayerNorm(config.hidden_size, config.norm_epsilon, config.torch_dtype)
        self.rotary_emb = Starcoder2RotaryEmbedding(config)

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
# Section 7: Language Model Head, KV-cache spec and weight loading
# Mixed: PARALLELISM (vocabulary-sharded LM head) +
#        MODEL-SPECIFIC (tied embeddings, checkpoint key mapping)
# =============================================================================


class Starcoder2ForCausalLM(nn.Module):
    def __init__(self, config: Starcoder2Config):
        super().__init__()
        self.config = config
        self.model = Starcoder2Model(config)

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
    ) -> "Starcoder2ForCausalLM":
        return cls(Starcoder2Config.from_configs(hf_config, neuron_config))

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
        # <-- MODEL-SPECIFIC: Hugging Face checkpoint keys of each parameter
        mappings = {}
        for layer_id in range(len(self.model.layers)):
            prefix = f"model.layers.{layer_id}"
            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
            mappings[f"{prefix}.input_layernorm.bias"] = f"{prefix}.input_layernorm.bias"
            mappings[f"{prefix}.post_attention_layernorm.weight"] = (
                f"{prefix}.post_attention_layernorm.weight"
            )
            mappings[f"{prefix}.post_attention_layernorm.bias"] = (
                f"{prefix}.post_attention_layernorm.bias"
            )
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
            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.c_fc.weight"
            mappings[f"{prefix}.mlp.up_proj_bias"] = f"{prefix}.mlp.c_fc.bias"
            mappings[f"{prefix}.mlp.down_proj_weight"] = f"{prefix}.mlp.c_proj.weight"
            mappings[f"{prefix}.mlp.down_proj_bias"] = f"{prefix}.mlp.c_proj.bias"
        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
        mappings["model.norm.weight"] = "model.norm.weight"
        mappings["model.norm.bias"] = "model.norm.bias"
        # <-- MODEL-SPECIFIC: tied embeddings load the LM head from the embedding
        if self.config.tie_word_embeddings:
            mappings["lm_head.weight"] = "model.embed_tokens.weight"
        else:
            mappings["lm_head.weight"] = "lm_head.weight"

        checkpoint = SafetensorsCheckpoint(checkpoint_path, cache_dir=cache_dir)
        result = checkpoint.load_sharded_pipelined(
            self.rank, self.world_size, self, mappings, device
        )
        self.load_state_dict(result.state_dict, strict=False, assign=True)
        return result
