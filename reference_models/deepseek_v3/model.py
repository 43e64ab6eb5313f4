# SPDX-License-Identifier: Apache-2.0
"""
DeepSeek-V3 for the vLLM Neuron backend (bf16)
==============================================

autoport-cst reference model ``deepseek_v3``: a decoder with multi-latent
attention (MLA) and DeepSeek mixture-of-experts blocks.

Attention: queries from the hidden state through an optional low-rank
projection (``q_a_proj``, RMSNorm, ``q_b_proj``; ``q_proj`` when
``q_lora_rank`` is None), each head split into a part without position
(``qk_nope_head_dim``) and a rotated part (``qk_rope_head_dim``). Keys and
values come from one compressed latent per token (``kv_a_proj_with_mqa``:
``kv_lora_rank`` latent values, RMSNorm, plus one rotated key shared by all
heads), expanded per head by ``kv_b_proj``. The paged cache holds that latent
row (latent and rotated key), not K/V. Interleaved RoPE (pairs (x0, x1),
(x2, x3), ...) or rotate-half, with the default, Llama 3 or YaRN frequencies;
YaRN's ``mscale_all_dim`` enters the softmax scale (squared).

Mixture of experts: the first ``first_k_dense_replace`` layers have a dense
SiLU-gated MLP; the others a router with sigmoid scores in float32, a
per-expert correction bias used to choose the experts (not to weight them),
group-limited choice (the ``topk_group`` best of ``n_group`` groups, a group
scored by the sum of its two best biased scores), the top-k weights
renormalized (``norm_topk_prob``) and scaled by ``routed_scaling_factor``,
plus always-on shared experts.

Supported parallelism: TP with sequence-parallel (SP) hidden states between
layers during prefill; attention heads sharded over TP (the latent
projections and the latent cache replicated: one latent per token); experts'
intermediate dimension sharded over TP, or expert parallelism (EP) inside the
TP world (EP rank k holds experts [k L, (k + 1) L), sharded over the ranks of
its partition; the MoE collectives stay on the TP group). Under attention / MLP / embedding /
LM-head data parallelism each DP replica runs this TP model on its own batch
(weights replicated over the replicas, no batch exchange). An FP8 KV cache
is not implemented (refused where the engine asks for it).

Paths:
  prefill  attention: queries, latents (RMSNorm, RoPE) -> latent cache write
                      -> K/V expanded per head (kv_b_proj) -> NF.flash_attention -> NF.o_proj;
                      a chunk with cached tokens (kv_segment_size set) expands every row of
                      its sequence read back from the cache and attends by position
           MLP:       NF.mlp (dense layers)
           experts:   float32 router, group-limited top-k -> NF.build_blockwise_mapping
                      -> NF.moe_cte, plus the shared experts (NF.mlp)
  decode   attention: queries, latents -> latent cache write -> queries absorbed into the
                      latent space (NF.mla_absorb with kv_b_proj's key half)
                      -> NF.mla_decode_attention over the latent rows
                      -> NF.mla_absorb with the value half -> NF.o_proj
           MLP / experts: as in prefill (the fused decode kernel cannot express
                      the biased group-limited router)

ANNOTATION GUIDE (codemods anchor on these markers; keep them when editing):
  # >>> PARALLELISM: <what> <<<    parallelism plumbing, kept across ports
  # <-- MODEL-SPECIFIC: <what>     what changes when porting another architecture
"""

import logging
import math
from typing import NamedTuple

import nki.language as nl
import torch
from nkilib.core.moe.moe_cte.moe_cte import MoECTEImplementation
from nkilib.core.utils.common_types import ActFnType, ExpertAffinityScaleMode
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
from vllm_neuron.utils.dtype_utils import QUANTIZED_KV_CACHE_DTYPES
from vllm_neuron.utils.weight_loader import (
    SafetensorsWeightLoader,
    expert_parallel_grouped_loader,
    expert_parallel_tensor_dim_loader,
    set_weight_loader,
    sharding_weight_loader,
)

from .config import DeepseekV3Config

logger = logging.getLogger(__name__)

# the MoE kernels' compute dtype for each model dtype
_NKI_DTYPES = {torch.float32: nl.float32, torch.bfloat16: nl.bfloat16, torch.float16: nl.float16}


# <-- MODEL-SPECIFIC: the latent norms (q_a_layernorm, kv_a_layernorm) use RMSNorm's default
#     epsilon, not rms_norm_eps (DeepSeek-V2/V3 and GLM-4-MoE-Lite build them without one)
LATENT_NORM_EPS = 1e-6


def _replicated_linear_loader() -> SafetensorsWeightLoader:
    """A linear weight stored [in, out], the whole checkpoint tensor on every rank."""
    return SafetensorsWeightLoader(lambda slices, rank: slices[0][:, :].T)


# =============================================================================
# Section 1: RMS Normalization
# <-- MODEL-SPECIFIC: RMSNorm (no mean subtraction, no bias)
# =============================================================================


class DeepseekV3RMSNorm(nn.Module):
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
# <-- MODEL-SPECIFIC: interleaved (or rotate-half) RoPE on the qk_rope_head_dim part,
#     default, Llama 3 or YaRN frequencies; YaRN's mscale_all_dim in the softmax scale
# =============================================================================


def yarn_mscale(scale: float, coefficient: float = 1.0) -> float:
    """YaRN's attention magnitude factor for a context stretched by ``scale``."""
    return 1.0 if scale <= 1 else 0.1 * coefficient * math.log(scale) + 1.0


def softmax_scale(config: DeepseekV3Config) -> float:
    """``qk_head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2``
    for a scaled RoPE that sets ``mscale_all_dim``."""
    scale = config.qk_head_dim**-0.5
    scaling = dict(config.rope_scaling or {})
    rope_type = scaling.get("rope_type", scaling.get("type")) or "default"
    if rope_type != "default" and scaling.get("mscale_all_dim"):
        factor = yarn_mscale(float(scaling["factor"]), float(scaling["mscale_all_dim"]))
        scale = scale * factor * factor
    return scale


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Rotate ``x [..., T, d]`` by ``cos``/``sin [T, d]`` (each frequency twice).

    Interleaved: pair (x[2i], x[2i+1]) turns by frequency i, and the result
    lists the pairs' first then second components (the order the queries and
    the keys share; their dot products are those of the interleaved layout).
    Otherwise pair (x[i], x[i + d/2])."""
    if not interleave:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin
    half = x.shape[-1] // 2
    cos, sin = cos[..., :half], sin[..., :half]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat((even * cos - odd * sin, odd * cos + even * sin), dim=-1)


class DeepseekV3RotaryEmbedding(nn.Module):
    """cos/sin tables of the rotated dimensions for the step's positions.

    ``__init__`` keeps Python scalars only: the model is built on the meta
    device, so a tensor computed here would never hold data. The inverse
    frequencies are computed in ``forward`` on the input's device.
    """

    def __init__(self, config: DeepseekV3Config):
        super().__init__()
        self.head_dim = config.qk_rope_head_dim
        self.rope_theta = float(config.rope_theta)
        scaling = dict(config.rope_scaling or {})
        self.rope_type = scaling.get("rope_type", scaling.get("type")) or "default"
        # <-- MODEL-SPECIFIC: RoPE variants this model implements
        if self.rope_type not in ("default", "llama3", "yarn"):
            raise NotImplementedError(f"rope_type {self.rope_type!r} is not supported")
        self.scaling_factor = float(scaling.get("factor", 1.0))
        self.low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
        self.high_freq_factor = float(scaling.get("high_freq_factor", 1.0))
        self.original_max_position_embeddings = int(scaling.get("original_max_position_embeddings", 8192))
        self.attention_scaling = 1.0
        if self.rope_type == "yarn":
            self._setup_yarn(config, scaling)

    def _setup_yarn(self, config, scaling):
        """YaRN's frequency band and cos/sin factor, as Python scalars: the
        band (in rotated dimensions) between beta_fast and beta_slow rotations
        over the original context blends interpolated and original frequencies."""
        original = scaling.get("original_max_position_embeddings")
        if original is None:
            original = config.original_max_position_embeddings or config.max_position_embeddings
        factor = scaling.get("factor")
        if factor is None:
            factor = config.max_position_embeddings / original
        self.scaling_factor = float(factor)

        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            if scaling.get("mscale") and scaling.get("mscale_all_dim"):
                attention_factor = yarn_mscale(factor, scaling["mscale"]) / yarn_mscale(
                    factor, scaling["mscale_all_dim"]
                )
            else:
                attention_factor = yarn_mscale(factor)
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
        smooth = (original / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        blended = (1 - smooth) * slowed / self.scaling_factor + smooth * slowed
        in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(in_band, blended, slowed)

    def forward(
        self, position_ids: torch.Tensor, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self._compute_inv_freq(device)
        freqs = torch.outer(position_ids.to(torch.float32), inv_freq)  # [T, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, d]
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


# =============================================================================
# Section 3: Multi-latent attention
# Mixed: PARALLELISM (heads sharded over TP, latents replicated, SP gather/scatter) +
#        MODEL-SPECIFIC (query LoRA, latent KV with a shared rotated key, latent cache,
#        absorbed decode)
# =============================================================================


class DeepseekV3Attention(nn.Module):
    """Multi-latent attention with a paged latent cache.

    Sharding: query heads, ``kv_b_proj`` (per-head expansion) and the O
    projection over TP; ``q_a_proj``, ``kv_a_proj_with_mqa`` and their norms
    replicated (they compute per-token latents), and so is the latent cache
    (one row per token on every rank).
    """

    def __init__(self, config: DeepseekV3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        # <-- MODEL-SPECIFIC: multi-latent attention dimensions
        self.q_lora_rank = config.q_lora_rank
        self.kv_lora_rank = config.kv_lora_rank
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.qk_head_dim = config.qk_head_dim
        self.v_head_dim = config.v_head_dim
        self.rope_interleave = config.rope_interleave
        self.latent_width = self.kv_lora_rank + self.qk_rope_head_dim
        self.scaling = softmax_scale(config)

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group
        if self.num_heads % self.world_size != 0:
            raise ValueError(f"{self.num_heads} attention heads do not split over TP {self.world_size}")
        # >>> PARALLELISM: query heads over TP; the latent is per token, replicated <<<
        self.num_heads_per_rank = self.num_heads // self.world_size

        dtype = self.dtype
        heads = self.num_heads_per_rank
        # <-- MODEL-SPECIFIC: queries through a low-rank projection and its RMSNorm (query LoRA)
        if self.q_lora_rank is not None:
            self.q_a_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.q_lora_rank, dtype=dtype))
            self.q_a_layernorm = DeepseekV3RMSNorm(self.q_lora_rank, LATENT_NORM_EPS, dtype)
            self.q_b_proj_weight = nn.Parameter(
                torch.empty(self.q_lora_rank, heads * self.qk_head_dim, dtype=dtype)
            )
        else:
            self.q_proj_weight = nn.Parameter(
                torch.empty(self.hidden_size, heads * self.qk_head_dim, dtype=dtype)
            )
        # <-- MODEL-SPECIFIC: the KV latent and the shared rotated key, [in, out]
        self.kv_a_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.latent_width, dtype=dtype))
        self.kv_a_layernorm = DeepseekV3RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS, dtype)
        # per-head expansion of the latent, as stored: [heads * (nope + v), kv_lora_rank]
        self.kv_b_proj_weight = nn.Parameter(
            torch.empty(heads * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank, dtype=dtype)
        )
        self.o_proj_weight = nn.Parameter(torch.empty(heads * self.v_head_dim, self.hidden_size, dtype=dtype))
        self.latent_cache = None
        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: head-sharded query, expansion and O weights; replicated latent weights. <<<"""
        heads = self.num_heads_per_rank
        if self.q_lora_rank is not None:
            set_weight_loader(self.q_a_proj_weight, _replicated_linear_loader())
            q_weight = self.q_b_proj_weight
        else:
            q_weight = self.q_proj_weight
        set_weight_loader(
            q_weight,
            sharding_weight_loader(
                shard_dim=1,
                shard_size=heads * self.qk_head_dim,
                num_shards=self.world_size,
                is_storage_transposed=True,
            ),
        )
        set_weight_loader(self.kv_a_proj_weight, _replicated_linear_loader())
        set_weight_loader(
            self.kv_b_proj_weight,
            sharding_weight_loader(
                shard_dim=0,
                shard_size=heads * (self.qk_nope_head_dim + self.v_head_dim),
                num_shards=self.world_size,
                is_storage_transposed=False,
            ),
        )
        set_weight_loader(
            self.o_proj_weight,
            sharding_weight_loader(
                shard_dim=0,
                shard_size=heads * self.v_head_dim,
                num_shards=self.world_size,
                is_storage_transposed=True,
            ),
        )

    def forward(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor,
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

    # -- shared by both phases ----------------------------------------------------

    def _queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """[T, H] -> this rank's queries ([Hl, T, nope], rotated [Hl, T, rope])."""
        # <-- MODEL-SPECIFIC: query LoRA (q_a_proj, RMSNorm, q_b_proj) or a direct projection
        if self.q_lora_rank is not None:
            q = self.q_a_layernorm(x @ self.q_a_proj_weight) @ self.q_b_proj_weight
        else:
            q = x @ self.q_proj_weight
        q = q.view(x.shape[0], self.num_heads_per_rank, self.qk_head_dim).transpose(0, 1)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        return q_nope, apply_rope(q_rope, cos, sin, self.rope_interleave)

    def _latent_rows(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """[T, H] -> the cache rows [T, kv_lora_rank + rope]: the normed latent, then the rotated key."""
        # <-- MODEL-SPECIFIC: RMSNorm of the latent; RoPE of the shared key
        compressed = x @ self.kv_a_proj_weight
        latent, k_rope = compressed.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        return torch.cat((latent, apply_rope(k_rope, cos, sin, self.rope_interleave)), dim=-1)

    def _write_latent_cache(self, rows: torch.Tensor, slot_mapping: torch.Tensor, block_size: int):
        """Write the rows [T, W] at ``slot_mapping`` of the cache [blocks, 1, block, W];
        padding rows (slot -1) are not written."""
        slots = slot_mapping.to(torch.int64)
        real = slots >= 0
        slots = slots[real]
        index = (slots // block_size, torch.zeros_like(slots), slots % block_size)
        self.latent_cache.index_put_(index, rows[real].to(self.latent_cache.dtype))

    def _kv_b_halves(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_b_proj`` per head: key half [Hl, nope, r], value half [Hl, v, r]."""
        per_head = self.kv_b_proj_weight.view(
            self.num_heads_per_rank, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank
        )
        return per_head.split([self.qk_nope_head_dim, self.v_head_dim], dim=1)

    # -- prefill ----------------------------------------------------------------

    def _expand(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent rows [S, W] -> this rank's keys [Hl, S, nope + rope] and values [Hl, S, v]."""
        # <-- MODEL-SPECIFIC: K and V expanded from the latents per head; the rotated key shared
        k_half, v_half = self._kv_b_halves()
        latent, k_rope = rows.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_nope = torch.einsum("tr,hnr->htn", latent, k_half)
        v = torch.einsum("tr,hvr->htv", latent, v_half)
        k = torch.cat((k_nope, k_rope.unsqueeze(0).expand(self.num_heads_per_rank, -1, -1)), dim=-1)
        return k, v

    def _attend_cached(self, q: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor):
        """A chunk's queries [Hl, T, D] over every latent row its sequence has in
        the cache (the chunk's own rows written first), expanded: a query at
        position p sees positions 0..p. Scores and softmax in float32.
        Returns [Hl, v, T]."""
        rows = self.latent_cache[block_table[0].to(torch.int64), 0].flatten(0, 1)  # [S, W]
        k, v = self._expand(rows)
        scores = (q.to(torch.float32) @ k.to(torch.float32).transpose(1, 2)) * self.scaling
        slots = torch.arange(rows.shape[0], device=q.device)
        visible = slots.unsqueeze(0) <= positions.to(torch.int64).unsqueeze(1)  # [T, S]
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1).to(v.dtype)
        return (probs.to(torch.float32) @ v.to(torch.float32)).to(v.dtype).transpose(1, 2)

    def forward_prefill(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: object | None = None,
    ) -> torch.Tensor:
        """One prompt, or one chunk of it, of T tokens in the expanded form:
        [T, H] in, [T / world_size, H] out (SP)."""
        x = hidden_states.to(self.dtype)
        meta = attn_metadata[f"layers.{self.layer_idx}.self_attn"]
        cos, sin = position_embeddings
        q_nope, q_rope = self._queries(x, cos, sin)
        rows = self._latent_rows(x, cos, sin)
        self._write_latent_cache(rows, meta["slot_mapping"], meta["block_size"])
        q = torch.cat((q_nope, q_rope), dim=-1)

        if meta.get("kv_segment_size"):
            # Chunked prefill or prefix-cache hit: the sequence's earlier tokens are in the
            # cache (latents only), so the chunk attends over the rows read back and expanded.
            attn_output = self._attend_cached(q, positions, meta["block_table_tensor"])
        else:
            # Whole prompt: its own K/V, expanded, through flash attention.
            k, v = self._expand(rows)
            attn_output = NF.flash_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v,
                scale=self.scaling,
                tp_q=False,
                tp_out=True,
            )  # [Hl, v, T]
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
        """B sequences of one new token each, in the absorbed form: [B, H] in and out."""
        meta = attn_metadata[f"layers.{self.layer_idx}.self_attn"]
        block_table = meta["block_table_tensor"]
        batch = block_table.shape[0]
        if hidden_states.shape[0] != batch:
            raise NotImplementedError(
                f"decode of {hidden_states.shape[0] // batch} tokens per sequence: one is supported"
            )
        x = hidden_states.to(self.dtype)
        cos, sin = position_embeddings
        q_nope, q_rope = self._queries(x, cos, sin)  # [Hl, B, .]
        rows = self._latent_rows(x, cos, sin)
        self._write_latent_cache(rows, meta["slot_mapping"], meta["block_size"])

        # <-- MODEL-SPECIFIC: queries absorbed into the latent space; the latent row is key and value
        k_half, v_half = self._kv_b_halves()
        q_latent = NF.mla_absorb(q_nope.transpose(0, 1).contiguous(), k_half)  # [B, Hl, r]
        query = torch.cat((q_latent, q_rope.transpose(0, 1)), dim=-1)
        latent_out = NF.mla_decode_attention(
            query,
            self.latent_cache,
            None,
            self.scaling,
            None,
            positions=positions,
            compress_ratio=1,
            latent_block_table=block_table,
            nope_dim=self.kv_lora_rank,
            rope_dim=self.qk_rope_head_dim,
            out_dtype=self.dtype,
        )  # [B, Hl, r + rope]
        values = NF.mla_absorb(latent_out[..., : self.kv_lora_rank], v_half.transpose(1, 2))  # [B, Hl, v]
        output = NF.o_proj(values.reshape(1, batch, -1), self.o_proj_weight, None).squeeze(0)

        # >>> PARALLELISM: sum the partial outputs over TP <<<
        if self.world_size > 1:
            output = self.tp_group.all_reduce(output)
        return output


# =============================================================================
# Section 4: Dense MLP, shared experts and routed experts
# Mixed: PARALLELISM (intermediate sharding, SP gather/scatter, collectives) +
#        MODEL-SPECIFIC (SiLU-gated MLPs; sigmoid router with a correction bias,
#        group-limited top-k, routed scaling, shared experts)
# =============================================================================


class DeepseekV3GatedMLP(nn.Module):
    """A SiLU-gated MLP whose intermediate dimension is sharded over TP;
    returns this rank's partial sums (the caller reduces them)."""

    def __init__(self, config: DeepseekV3Config, intermediate_size: int):
        super().__init__()
        self.dtype = config.torch_dtype
        world_size = get_tp_group().world_size
        if intermediate_size % world_size != 0:
            raise ValueError(f"intermediate size {intermediate_size} does not split over TP {world_size}")
        per_rank = intermediate_size // world_size
        hidden = config.hidden_size
        self.gate_proj_weight = nn.Parameter(torch.empty(hidden, per_rank, dtype=self.dtype))
        self.up_proj_weight = nn.Parameter(torch.empty(hidden, per_rank, dtype=self.dtype))
        self.down_proj_weight = nn.Parameter(torch.empty(per_rank, hidden, dtype=self.dtype))
        # >>> PARALLELISM: column-parallel gate/up, row-parallel down <<<
        column = sharding_weight_loader(
            shard_dim=1, shard_size=per_rank, num_shards=world_size, is_storage_transposed=True
        )
        row = sharding_weight_loader(
            shard_dim=0, shard_size=per_rank, num_shards=world_size, is_storage_transposed=True
        )
        set_weight_loader(self.gate_proj_weight, column)
        set_weight_loader(self.up_proj_weight, column)
        set_weight_loader(self.down_proj_weight, row)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # <-- MODEL-SPECIFIC: SiLU-gated MLP
        return NF.mlp(hidden_states, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)


class DeepseekV3DenseMLP(nn.Module):
    """The feed-forward block of the first ``first_k_dense_replace`` layers."""

    def __init__(self, config: DeepseekV3Config):
        super().__init__()
        self.dtype = config.torch_dtype
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.mlp = DeepseekV3GatedMLP(config, config.intermediate_size)

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor, is_decode: bool) -> torch.Tensor:
        hidden_states = hidden_states.to(self.dtype)
        # >>> PARALLELISM: All-gather from SP (prefill) <<<
        if not is_decode and self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
        output = self.mlp(hidden_states)
        # >>> PARALLELISM: Reduce-scatter to SP (prefill) or all-reduce (decode) <<<
        if self.world_size > 1:
            if is_decode:
                return self.tp_group.all_reduce(output)
            return self.tp_group.reduce_scatter(output, dim=0)
        return output


def expert_gate_up_loader(intermediate_per_rank, num_shards, num_experts, hidden_size):
    """Loader for the stacked gate|up weight [E, H, 2 * I/tp] from per-expert
    tensors ``[gate_0 .. gate_{E-1}, up_0 .. up_{E-1}]`` (each [I, H]) or one
    fused [E, 2 * I, H] tensor (gate rows, then up rows: transformers' layout).
    Each rank keeps its slice of the intermediate dimension of gate and of up."""

    def transform(slices, rank):
        start = (rank % num_shards) * intermediate_per_rank
        stop = start + intermediate_per_rank
        full = intermediate_per_rank * num_shards
        if len(slices) == 2 * num_experts:
            gate = torch.stack([s[start:stop, :] for s in slices[:num_experts]])
            up = torch.stack([s[start:stop, :] for s in slices[num_experts:]])
        elif len(slices) == 1 and tuple(slices[0].get_shape()) == (num_experts, 2 * full, hidden_size):
            gate = slices[0][:, start:stop, :]
            up = slices[0][:, full + start : full + stop, :]
        else:
            shapes = [list(s.get_shape()) for s in slices[:2]]
            raise ValueError(
                f"expert gate/up weights: expected {2 * num_experts} per-expert tensors or one fused "
                f"[{num_experts}, {2 * full}, {hidden_size}] tensor, got {len(slices)} tensor(s) {shapes}"
            )
        return torch.cat([gate.transpose(1, 2), up.transpose(1, 2)], dim=2)

    return SafetensorsWeightLoader(transform)


def expert_down_loader(intermediate_per_rank, num_shards, num_experts, hidden_size):
    """Loader for the stacked down weight [E, I/tp, H] from per-expert tensors
    (each [H, I]) or one fused [E, H, I] tensor."""

    def transform(slices, rank):
        start = (rank % num_shards) * intermediate_per_rank
        stop = start + intermediate_per_rank
        full = intermediate_per_rank * num_shards
        if len(slices) == num_experts:
            down = torch.stack([s[:, start:stop] for s in slices])
        elif len(slices) == 1 and tuple(slices[0].get_shape()) == (num_experts, hidden_size, full):
            down = slices[0][:, :, start:stop]
        else:
            raise ValueError(
                f"expert down weights: expected {num_experts} per-expert tensors or one fused "
                f"[{num_experts}, {hidden_size}, {full}] tensor, got {len(slices)} tensor(s)"
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


def group_limited_topk(
    scores: torch.Tensor, correction_bias: torch.Tensor, top_k: int, n_group: int, topk_group: int
) -> torch.Tensor:
    """The experts [T, k] each token uses: ranked by ``scores + correction_bias``
    among the ``topk_group`` groups (of ``n_group`` equal groups) whose two best
    biased scores sum highest."""
    # <-- MODEL-SPECIFIC: the bias steers the choice only; group-limited routing
    choice = scores + correction_bias
    if n_group > 1:
        tokens, experts = choice.shape
        grouped = choice.view(tokens, n_group, experts // n_group)
        group_scores = grouped.topk(min(2, experts // n_group), dim=-1).values.sum(dim=-1)
        best_groups = group_scores.topk(topk_group, dim=-1).indices
        allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
        allowed = allowed.unsqueeze(-1).expand(-1, -1, experts // n_group).reshape(tokens, experts)
        choice = choice.masked_fill(~allowed, float("-inf"))
    return choice.topk(top_k, dim=-1).indices


class DeepseekV3MoE(nn.Module):
    """The DeepSeek mixture of experts of one layer: routed experts behind a
    float32 sigmoid router, plus the shared experts.

    Without expert parallelism every rank holds every routed expert and its
    slice of their intermediate dimension. With it (inside the TP world, as
    vllm_neuron lays it out), EP rank k holds experts [k L, (k + 1) L),
    sharded over the ``tp_degree`` ranks of its partition. The shared experts
    are sharded over the whole TP group. The partial sums of all ranks (all
    experts, all slices, the shared experts' slices) add up to the output, so
    the collectives stay on the TP group and no weight is rescaled.
    """

    def __init__(self, config: DeepseekV3Config):
        super().__init__()
        self.dtype = config.torch_dtype
        self.compute_dtype = _NKI_DTYPES[self.dtype]
        self.hidden_size = config.hidden_size
        self.num_experts = config.n_routed_experts
        self.num_experts_per_token = config.num_experts_per_tok
        # <-- MODEL-SPECIFIC: DeepSeek routing parameters (read from the config)
        self.n_group = config.n_group
        self.topk_group = config.topk_group
        self.norm_topk_prob = config.norm_topk_prob
        self.routed_scaling_factor = float(config.routed_scaling_factor)
        self.block_size = 256

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.rank = self.tp_group.rank_in_group
        self._setup_expert_parallelism()
        if config.moe_intermediate_size % self.tp_degree != 0:
            raise ValueError(
                f"moe_intermediate_size {config.moe_intermediate_size} does not split over {self.tp_degree} ranks"
            )
        self.intermediate_size_per_rank = config.moe_intermediate_size // self.tp_degree

        # >>> PARALLELISM: router replicated on every rank (not EP-sharded) <<<
        # <-- MODEL-SPECIFIC: router [E, H] and correction bias [E] in float32
        self.router_weight = nn.Parameter(
            torch.empty(self.num_experts, self.hidden_size, dtype=torch.float32)
        )
        self.e_score_correction_bias = nn.Parameter(torch.empty(self.num_experts, dtype=torch.float32))
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
                self.num_local_experts, self.intermediate_size_per_rank, self.hidden_size, dtype=self.dtype
            )
        )
        self._setup_weight_loaders()
        # <-- MODEL-SPECIFIC: shared experts, one gated MLP of n_shared_experts * moe_intermediate_size
        self.shared_experts = DeepseekV3GatedMLP(
            config, config.moe_intermediate_size * config.n_shared_experts
        )

    def _setup_expert_parallelism(self):
        """>>> PARALLELISM: expert parallelism inside the TP world. <<<

        EP degree ``D``, EP rank and EP-TP group (the ``t = W / D`` ranks of
        this rank's partition) from the vllm_neuron getters; EP rank k owns
        experts [k L, (k + 1) L), ``L = E / D``."""
        parallel_config = get_current_vllm_config().parallel_config
        self.ep_enabled = parallel_config.enable_expert_parallel
        if self.ep_enabled and parallel_config.data_parallel_size > 1:
            raise NotImplementedError(
                "DeepseekV3MoE: expert parallelism across data-parallel replicas (cross-DP EP) is not "
                "supported; EP runs inside the TP world"
            )
        if self.ep_enabled:
            self.ep_degree = get_neuron_ep_degree()
            self.ep_rank = get_neuron_ep_rank()
            self.ep_tp_group = get_neuron_ep_tp_group()
        else:
            self.ep_degree, self.ep_rank, self.ep_tp_group = 1, 0, self.tp_group
        self.tp_degree = self.ep_tp_group.world_size
        if self.num_experts % self.ep_degree != 0:
            raise ValueError(f"{self.num_experts} experts do not split into {self.ep_degree} EP partitions")
        self.num_local_experts = self.num_experts // self.ep_degree
        self.local_expert_start = self.ep_rank * self.num_local_experts

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: each rank loads its experts (EP) and its intermediate slice. <<<"""
        gate_up_loader = expert_gate_up_loader(
            self.intermediate_size_per_rank, self.tp_degree, self.num_local_experts, self.hidden_size
        )
        down_loader = expert_down_loader(
            self.intermediate_size_per_rank, self.tp_degree, self.num_local_experts, self.hidden_size
        )
        if self.ep_degree > 1:
            local = list(range(self.local_expert_start, self.local_expert_start + self.num_local_experts))
            gate_up_loader = local_experts_loader(local, gate_up_loader, self.num_experts)
            down_loader = local_experts_loader(local, down_loader, self.num_experts)
        set_weight_loader(self.gate_up_proj_weight, gate_up_loader)
        set_weight_loader(self.down_proj_weight, down_loader)

    def _route(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Hidden states [T, H] -> float32 affinities [T, E]: the scaled weights
        of the chosen experts, zero elsewhere."""
        # <-- MODEL-SPECIFIC: float32 sigmoid scores
        logits = hidden_states.to(torch.float32) @ self.router_weight.T
        scores = torch.sigmoid(logits)
        chosen = group_limited_topk(
            scores, self.e_score_correction_bias, self.num_experts_per_token, self.n_group, self.topk_group
        )
        weights = scores.gather(1, chosen)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * self.routed_scaling_factor
        return torch.zeros_like(scores).scatter_(1, chosen, weights)

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

    def _experts_blockwise(self, hidden_states, expert_affinities, padding_mask=None):
        """This rank's routed experts on the tokens routed to them, in blocks:
        [T, H] and local affinities [T, E_L] in, partial sums [T, H] out."""
        # >>> PARALLELISM: the mapping is built over the ranks sharing this rank's experts <<<
        affinities_masked, token_position_to_id, block_to_expert, conditions = NF.build_blockwise_mapping(
            expert_affinities=expert_affinities,
            num_local_experts=self.num_local_experts,
            num_experts_per_token=self.num_experts_per_token,
            block_size=self.block_size,
            moe_group=self.ep_tp_group,
            tp_degree=self.tp_degree,
            padding_mask=padding_mask,
        )
        gate_up = self.gate_up_proj_weight.reshape(
            self.num_local_experts, self.hidden_size, 2, self.intermediate_size_per_rank
        )
        return NF.moe_cte(
            implementation=MoECTEImplementation.shard_on_block,
            conditions=conditions,
            hidden_states=hidden_states,
            expert_affinities_masked=affinities_masked,
            gate_up_proj_weight=gate_up,
            down_proj_weight=self.down_proj_weight,
            activation_function=ActFnType.SiLU,
            block_size=self.block_size,
            token_position_to_id=token_position_to_id.to(torch.int32),
            block_to_expert=block_to_expert.to(torch.int32),
            expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
            skip_token=True,
            is_tensor_update_accumulating=True,
            compute_dtype=self.compute_dtype,
        )

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor, is_decode: bool) -> torch.Tensor:
        hidden_states = hidden_states.to(self.dtype)
        # >>> PARALLELISM: All-gather the tokens from SP (prefill) <<<
        if not is_decode and self.world_size > 1:
            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
        padding_mask = None
        if not is_decode:
            # Real tokens end at the largest position; later rows are padding.
            last_real = torch.argmax(positions)
            padding_mask = torch.arange(positions.shape[0], device=positions.device) <= last_real
        affinities = self._local_affinities(self._route(hidden_states))
        output = self._experts_blockwise(hidden_states, affinities, padding_mask)
        output = output + self.shared_experts(hidden_states)
        # >>> PARALLELISM: Reduce-scatter (prefill) or all-reduce (decode) the partial sums of all
        # ranks (every expert partition, every slice) over the TP group <<<
        if self.world_size > 1:
            if is_decode:
                return self.tp_group.all_reduce(output)
            return self.tp_group.reduce_scatter(output, dim=0)
        return output


# =============================================================================
# Section 5: Decoder Layer
# <-- MODEL-SPECIFIC: pre-norm residual blocks; dense MLP in the first
#     first_k_dense_replace layers, the mixture of experts after
# =============================================================================


class DeepseekV3DecoderLayer(nn.Module):
    """Pre-norm decoder layer: a decode ``forward`` and a ``_forward_prefill`` (SP layout)."""

    def __init__(self, config: DeepseekV3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.input_layernorm = DeepseekV3RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
        self.self_attn = DeepseekV3Attention(config, layer_idx=layer_idx)
        self.post_attention_layernorm = DeepseekV3RMSNorm(
            config.hidden_size, config.rms_norm_eps, config.torch_dtype
        )
        # <-- MODEL-SPECIFIC: dense layers first, then MoE layers (per layer in mlp_layer_types when given)
        if config.mlp_layer_types is not None:
            dense = config.mlp_layer_types[layer_idx] != "sparse"
        else:
            dense = layer_idx < config.first_k_dense_replace
        if not dense:
            self.mlp = DeepseekV3MoE(config)
        else:
            self.mlp = DeepseekV3DenseMLP(config)

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
        return self._sublayers(hidden_states, positions, position_embeddings, attn_metadata, True)

    def _forward_prefill(
        self,
        hidden_states: torch.Tensor,
        positions: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: object | None = None,
    ) -> torch.Tensor:
        """Prefill: rows are this rank's SP slice of the sequence."""
        return self._sublayers(hidden_states, positions, position_embeddings, attn_metadata, False)

    def _sublayers(self, hidden_states, positions, position_embeddings, attn_metadata, is_decode: bool):
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
        hidden_states = self.mlp(hidden_states, positions=positions, is_decode=is_decode)
        return residual + hidden_states


# =============================================================================
# Section 6: Model Backbone
# Mixed: PARALLELISM (vocabulary-sharded embedding, SP) +
#        MODEL-SPECIFIC (final RMSNorm)
# =============================================================================


class DeepseekV3Model(nn.Module):
    def __init__(self, config: DeepseekV3Config):
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
                num_shards=self.embed_tokens.tp_size,
                is_storage_transposed=False,
                pad_shard=True,
            ),
        )
        self.layers = nn.ModuleList(
            [DeepseekV3DecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        # <-- MODEL-SPECIFIC: final RMSNorm
        self.norm = DeepseekV3RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
        self.rotary_emb = DeepseekV3RotaryEmbedding(config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: object | None = None,
        rank: torch.Tensor | None = None,
    ) -> torch.Tensor:
        first = attn_metadata["layers.0.self_attn"]
        is_prefill = first["max_query_len"] > first["decode_token_threshold"]
        # >>> PARALLELISM: prefill embeddings come back as this rank's SP slice <<<
        hidden_states = self.embed_tokens(input_ids, scatter_tokens=is_prefill, rank=rank)
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
        return hidden_states


# =============================================================================
# Section 7: Language Model Head, KV-cache spec and weight loading
# Mixed: PARALLELISM (vocabulary-sharded LM head) +
#        MODEL-SPECIFIC (latent cache spec, checkpoint key mapping)
# =============================================================================


class MoECheckpointKeys(NamedTuple):
    """Where one layer's routed experts live in a checkpoint."""

    gate_up: list[str]  # per-expert gate then up weights, or the fused gate_up tensor
    down: list[str]  # per-expert down weights, or the fused down tensor


def moe_checkpoint_keys(names, module: str, num_experts: int) -> MoECheckpointKeys:
    """The routed experts of MoE block ``module`` among the checkpoint's
    tensor ``names``: fused (transformers >= 5: ``experts.gate_up_proj``
    [E, 2I, H], ``experts.down_proj`` [E, H, I]) or per expert
    (``experts.<j>.<gate|up|down>_proj.weight``)."""
    fused = f"{module}.experts.gate_up_proj"
    if fused in names:
        return MoECheckpointKeys([fused], [f"{module}.experts.down_proj"])
    experts = range(num_experts)
    return MoECheckpointKeys(
        [f"{module}.experts.{j}.gate_proj.weight" for j in experts]
        + [f"{module}.experts.{j}.up_proj.weight" for j in experts],
        [f"{module}.experts.{j}.down_proj.weight" for j in experts],
    )


def _mask_padded_vocabulary(logits: torch.Tensor, vocab_size: int, rank) -> torch.Tensor:
    """This LM-head rank's logits ``[N, V_padded / tp]`` with the columns of
    the vocabulary's padding (ids from ``vocab_size`` on) at -inf, so that a
    sampler over the shards never picks one."""
    width = logits.shape[-1]
    columns = torch.arange(width, device=logits.device) + rank * width
    return logits.masked_fill(columns >= vocab_size, float("-inf"))


class DeepseekV3ForCausalLM(nn.Module):
    def __init__(self, config: DeepseekV3Config):
        super().__init__()
        self.config = config
        neuron_config = config.neuron_config
        # >>> PARALLELISM: with attention / MLP / embedding / LM-head data parallelism each DP
        # replica runs this TP model on its own batch (weights replicated over the replicas) <<<
        self.model = DeepseekV3Model(config)

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
            self.sampler = Sampler(self.on_device_sampling_config, process_group=self.tp_group.device_group)

    @classmethod
    def from_configs(
        cls, hf_config: PretrainedConfig, neuron_config: NeuronConfig | None = None
    ) -> "DeepseekV3ForCausalLM":
        return cls(DeepseekV3Config.from_configs(hf_config, neuron_config))

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: object | None = None,
        sampling_positions: torch.Tensor | None = None,
        sampling_params: torch.Tensor | None = None,
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
        hidden_states = self.model(input_ids, positions, attn_metadata=attn_metadata, rank=rank)
        if sampling_positions is not None:
            hidden_states = torch.index_select(hidden_states, 0, sampling_positions)
        logits = self.lm_head(hidden_states)
        if self.sampler is None:
            # >>> PARALLELISM: the padded vocabulary's logits dropped <<<
            return logits[:, : self.vocab_size]
        gathered_logits = None
        if self._gather_logits:
            # >>> PARALLELISM: the LM head's shards gathered, the padded vocabulary's logits dropped <<<
            gathered_logits = self.tp_group.all_gather(logits, dim=1)[:, : self.vocab_size]
        # >>> PARALLELISM: the padded vocabulary's columns of this shard never sampled <<<
        if self.lm_head.out_features != self.vocab_size:
            logits = _mask_padded_vocabulary(
                logits, self.vocab_size, self.rank if rank is None else rank
            )
        sampled_tokens = self.sampler(logits, sampling_params, logit_mask=logit_mask, tp_rank=rank)
        # the sampler returns the token ids only: the runner reads (tokens, logits or None)
        return sampled_tokens, gathered_logits

    # -- KV cache -------------------------------------------------------------------

    def get_kv_spec(self) -> KVSpec:
        # <-- MODEL-SPECIFIC: one latent row per token (latent + rotated key), one buffer,
        # the same on every rank (not sharded by heads)
        if get_current_vllm_config().cache_config.cache_dtype in QUANTIZED_KV_CACHE_DTYPES:
            raise NotImplementedError(
                "DeepseekV3ForCausalLM: a quantized (FP8) latent cache is not implemented"
            )
        layers = [
            LayerSpec(
                name=f"layers.{layer_idx}.self_attn",
                num_kv_heads=1,
                head_size=layer.self_attn.latent_width,
                dtype=layer.self_attn.dtype,
                sliding_window_size=None,
                chunk_size=None,
                latent_kv=True,
            )
            for layer_idx, layer in enumerate(self.model.layers)
        ]
        return KVSpec(layers=layers)

    def bind_kv_cache(self, kv_caches) -> None:
        for layer_idx, layer in enumerate(self.model.layers):
            name = f"layers.{layer_idx}.self_attn"
            if name not in kv_caches:
                raise KeyError(f"no KV cache allocated for {name}")
            cache = kv_caches[name]
            if isinstance(cache, (tuple, list)):
                if len(cache) != 1:
                    raise ValueError(f"{name}: a latent layer has one cache buffer, got {len(cache)}")
                cache = cache[0]
            layer.self_attn.latent_cache = cache

    # -- weights --------------------------------------------------------------------

    def load_weights(self, checkpoint_path: str, device: torch.device, cache_dir: str | None):
        """Load this rank's shard of every parameter from a safetensors
        checkpoint (each tensor in its parameter's dtype)."""
        checkpoint = SafetensorsCheckpoint(checkpoint_path, cache_dir)
        names = set(checkpoint.get_tensor_names())
        mappings = {}
        for layer_id, layer in enumerate(self.model.layers):
            prefix = f"model.layers.{layer_id}"
            mappings.update(self._attention_keys(prefix))
            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
            mappings[f"{prefix}.post_attention_layernorm.weight"] = (
                f"{prefix}.post_attention_layernorm.weight"
            )
            if isinstance(layer.mlp, DeepseekV3MoE):
                mappings.update(self._moe_keys(names, prefix))
            else:
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    mappings[f"{prefix}.mlp.mlp.{proj}_weight"] = f"{prefix}.mlp.{proj}.weight"
        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
        mappings["model.norm.weight"] = "model.norm.weight"
        # <-- MODEL-SPECIFIC: tied embeddings load the LM head from the embedding
        if self.config.tie_word_embeddings:
            mappings["lm_head.weight"] = "model.embed_tokens.weight"
        else:
            mappings["lm_head.weight"] = "lm_head.weight"
        result = checkpoint.load_sharded_pipelined(self.rank, self.world_size, self, mappings, device)
        self.load_state_dict(result.state_dict, strict=False, assign=True)
        return result

    def _attention_keys(self, prefix: str) -> dict[str, str]:
        """<-- MODEL-SPECIFIC: Hugging Face keys of the multi-latent attention."""
        attn = f"{prefix}.self_attn"
        keys = {
            f"{attn}.kv_a_proj_weight": f"{attn}.kv_a_proj_with_mqa.weight",
            f"{attn}.kv_a_layernorm.weight": f"{attn}.kv_a_layernorm.weight",
            f"{attn}.kv_b_proj_weight": f"{attn}.kv_b_proj.weight",
            f"{attn}.o_proj_weight": f"{attn}.o_proj.weight",
        }
        if self.config.q_lora_rank is not None:
            keys[f"{attn}.q_a_proj_weight"] = f"{attn}.q_a_proj.weight"
            keys[f"{attn}.q_a_layernorm.weight"] = f"{attn}.q_a_layernorm.weight"
            keys[f"{attn}.q_b_proj_weight"] = f"{attn}.q_b_proj.weight"
        else:
            keys[f"{attn}.q_proj_weight"] = f"{attn}.q_proj.weight"
        return keys

    def _moe_keys(self, names, prefix: str) -> dict[str, str | list[str]]:
        """<-- MODEL-SPECIFIC: Hugging Face keys of the router, routed and shared experts."""
        module = f"{prefix}.mlp"
        experts = moe_checkpoint_keys(names, module, self.config.n_routed_experts)
        keys: dict[str, str | list[str]] = {
            f"{module}.router_weight": f"{module}.gate.weight",
            f"{module}.e_score_correction_bias": f"{module}.gate.e_score_correction_bias",
            f"{module}.gate_up_proj_weight": experts.gate_up,
            f"{module}.down_proj_weight": experts.down,
        }
        for proj in ("gate_proj", "up_proj", "down_proj"):
            keys[f"{module}.shared_experts.{proj}_weight"] = f"{module}.shared_experts.{proj}.weight"
        return keys
