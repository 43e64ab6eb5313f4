# SPDX-License-Identifier: Apache-2.0
"""
Qwen3-VL vision tower for the vLLM Neuron backend (bf16)
=======================================================

A ViT run once per image in prefill (no KV cache, no decode path):
Conv3d patch embedding (a linear map of each flattened patch), plus the
learned position table resampled bilinearly to the image's grid; blocks of
pre-norm LayerNorm, bidirectional multi-head attention with a 2-D rotary
embedding (row and column halves), and a GELU MLP with biases; the patch
merger (LayerNorm, then each ``m x m`` group of patches concatenated and
projected to the text hidden size); and the deep-stack mergers, which merge
the outputs of the blocks in ``deepstack_visual_indexes`` the same way (norm
after the concatenation) for the first text decoder layers.

Supported parallelism: TP over the attention heads and the MLP's
intermediate dimension (the vision TP group is the model's TP group here);
the whole patch sequence runs on every rank (no SP). The mergers are
replicated.

The host-side inputs (patch positions, interpolation taps, frame spans)
come from ``vision_preprocessing``; each frame attends only to itself.

ANNOTATION GUIDE (codemods anchor on these markers; keep them when editing):
  # >>> PARALLELISM: <what> <<<    parallelism plumbing, kept across ports
  # <-- MODEL-SPECIFIC: <what>     what changes when porting another architecture
"""

import torch
from torch import nn
from vllm.distributed.parallel_state import get_tp_group

import vllm_neuron.functional as NF
from nkilib.core.utils.common_types import ActFnType
from vllm_neuron.utils.weight_loader import set_weight_loader, sharding_weight_loader

from .config import Qwen3VLVisionConfig
from .weight_loaders import (
    patch_embed_weight_loader,
    row_bias_loader,
    sharded_row_bias_loader,
    vis_qkv_bias_loader,
    vis_qkv_weight_loader,
)

# <-- MODEL-SPECIFIC: Hugging Face activation names -> kernel activations
_ACTIVATIONS = {
    "gelu": ActFnType.GELU,
    "gelu_pytorch_tanh": ActFnType.GELU_Tanh_Approx,
    "gelu_new": ActFnType.GELU_Tanh_Approx,
    "silu": ActFnType.SiLU,
}


# =============================================================================
# Section 1: LayerNorm
# <-- MODEL-SPECIFIC: the tower uses LayerNorm with bias, computed in float32
# =============================================================================


class Qwen3VLVisionLayerNorm(nn.Module):
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
# Section 2: 2-D rotary embedding
# <-- MODEL-SPECIFIC: rows take the first quarter of the frequencies' span, columns the second
# =============================================================================


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Qwen3VLVisionRotaryEmbedding(nn.Module):
    """cos/sin ``[patches, head_dim]`` from each patch's (row, column).

    ``__init__`` keeps Python scalars only (the model is built on meta)."""

    def __init__(self, config: Qwen3VLVisionConfig):
        super().__init__()
        self.spatial_dim = config.head_dim // 2
        self.rope_theta = float(config.rope_theta)

    def forward(self, patch_positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        exponents = torch.arange(0, self.spatial_dim, 2, dtype=torch.float32, device=patch_positions.device)
        inv_freq = 1.0 / (self.rope_theta ** (exponents / self.spatial_dim))
        freqs = patch_positions.to(torch.float32)[..., None] * inv_freq  # [N, 2, Dh/4]
        freqs = torch.cat((freqs[:, 0], freqs[:, 1]), dim=-1)  # [N, Dh/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


# =============================================================================
# Section 3: Attention
# Mixed: PARALLELISM (head sharding, all-reduce) +
#        MODEL-SPECIFIC (fused QKV with bias, 2-D RoPE in float32, bidirectional per frame)
# =============================================================================


class Qwen3VLVisionAttention(nn.Module):
    def __init__(self, config: Qwen3VLVisionConfig):
        super().__init__()
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        # >>> PARALLELISM: Head sharding calculation <<<
        self.num_heads_per_rank = config.num_heads // self.world_size
        self.size_per_rank = self.num_heads_per_rank * self.head_dim

        # <-- MODEL-SPECIFIC: fused QKV [D, q|k|v] with bias; output projection [q, D] with bias
        self.qkv_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, 3 * self.size_per_rank, dtype=self.dtype)
        )
        self.qkv_proj_bias = nn.Parameter(torch.empty(1, 3 * self.size_per_rank, dtype=self.dtype))
        self.o_proj_weight = nn.Parameter(torch.empty(self.size_per_rank, self.hidden_size, dtype=self.dtype))
        self.o_proj_bias = nn.Parameter(torch.empty(1, self.hidden_size, dtype=self.dtype))
        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: each rank loads its heads of Q, K and V; the output rows of its heads. <<<"""
        set_weight_loader(self.qkv_proj_weight, vis_qkv_weight_loader(self.hidden_size, self.size_per_rank))
        set_weight_loader(self.qkv_proj_bias, vis_qkv_bias_loader(self.hidden_size, self.size_per_rank))
        set_weight_loader(
            self.o_proj_weight,
            sharding_weight_loader(
                shard_dim=0,
                shard_size=self.size_per_rank,
                num_shards=self.world_size,
                is_storage_transposed=True,
            ),
        )
        set_weight_loader(self.o_proj_bias, row_bias_loader())

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        frame_spans: list[tuple[int, int]],
    ) -> torch.Tensor:
        patches = hidden_states.shape[0]
        qkv = NF.qkv_proj(
            hidden=hidden_states.to(self.dtype).unsqueeze(0),
            qkv_weights=self.qkv_proj_weight,
            bias=self.qkv_proj_bias,
        ).squeeze(0)
        q, k, v = torch.tensor_split(qkv, [self.size_per_rank, 2 * self.size_per_rank], dim=-1)
        q = q.view(patches, self.num_heads_per_rank, self.head_dim).transpose(0, 1)
        k = k.view(patches, self.num_heads_per_rank, self.head_dim).transpose(0, 1)
        v = v.view(patches, self.num_heads_per_rank, self.head_dim).transpose(0, 1)

        # <-- MODEL-SPECIFIC: RoPE applied in float32
        cos, sin = position_embeddings
        q32, k32 = q.to(torch.float32), k.to(torch.float32)
        q = (q32 * cos + _rotate_half(q32) * sin).to(self.dtype)
        k = (k32 * cos + _rotate_half(k32) * sin).to(self.dtype)

        # <-- MODEL-SPECIFIC: bidirectional attention inside each frame
        outputs = []
        for start, end in frame_spans:
            outputs.append(
                NF.flash_attention(
                    q[:, start:end].transpose(1, 2),
                    k[:, start:end].transpose(1, 2),
                    v[:, start:end],
                    scale=self.scaling,
                    causal_mask=False,
                    tp_q=False,
                    tp_out=True,
                )
            )  # [heads, Dh, frame]
        attn_output = torch.cat(outputs, dim=-1)
        output = NF.o_proj(attn_output.unsqueeze(0), self.o_proj_weight, None).squeeze(0)
        # >>> PARALLELISM: sum the heads of all ranks, then the bias once <<<
        if self.world_size > 1:
            output = self.tp_group.all_reduce(output)
        return output + self.o_proj_bias


# =============================================================================
# Section 4: MLP
# Mixed: PARALLELISM (intermediate sharding, all-reduce) +
#        MODEL-SPECIFIC (ungated GELU MLP with biases)
# =============================================================================


class Qwen3VLVisionMLP(nn.Module):
    def __init__(self, config: Qwen3VLVisionConfig):
        super().__init__()
        self.dtype = config.torch_dtype
        self.hidden_size = config.hidden_size
        if config.hidden_act not in _ACTIVATIONS:
            raise NotImplementedError(f"vision hidden_act {config.hidden_act!r} is not supported")
        self.act_fn = _ACTIVATIONS[config.hidden_act]

        # >>> PARALLELISM: TP group setup <<<
        self.tp_group = get_tp_group()
        self.world_size = self.tp_group.world_size
        self.intermediate_size_per_rank = config.intermediate_size // self.world_size

        # <-- MODEL-SPECIFIC: up (linear_fc1) and down (linear_fc2) stored [in, out], with biases
        self.up_proj_weight = nn.Parameter(
            torch.empty(self.hidden_size, self.intermediate_size_per_rank, dtype=self.dtype)
        )
        self.up_proj_bias = nn.Parameter(torch.empty(1, self.intermediate_size_per_rank, dtype=self.dtype))
        self.down_proj_weight = nn.Parameter(
            torch.empty(self.intermediate_size_per_rank, self.hidden_size, dtype=self.dtype)
        )
        self.down_proj_bias = nn.Parameter(torch.empty(1, self.hidden_size, dtype=self.dtype))
        self._setup_weight_loaders()

    def _setup_weight_loaders(self):
        """>>> PARALLELISM: shard the intermediate dimension. <<<"""
        size = self.intermediate_size_per_rank
        set_weight_loader(
            self.up_proj_weight,
            sharding_weight_loader(
                shard_dim=1, shard_size=size, num_shards=self.world_size, is_storage_transposed=True
            ),
        )
        set_weight_loader(self.up_proj_bias, sharded_row_bias_loader(size))
        set_weight_loader(
            self.down_proj_weight,
            sharding_weight_loader(
                shard_dim=0, shard_size=size, num_shards=self.world_size, is_storage_transposed=True
            ),
        )
        set_weight_loader(self.down_proj_bias, row_bias_loader())

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # <-- MODEL-SPECIFIC: act(x @ up + b) @ down (no gate: the up weight stands in for it)
        output = NF.mlp(
            hidden_states.to(self.dtype),
            self.up_proj_weight,
            self.up_proj_weight,
            self.down_proj_weight,
            skip_gate=True,
            act_fn=self.act_fn,
            up_b=self.up_proj_bias,
        )
        # >>> PARALLELISM: sum the partial outputs, then the bias once <<<
        if self.world_size > 1:
            output = self.tp_group.all_reduce(output)
        return output + self.down_proj_bias


# =============================================================================
# Section 5: Vision block
# <-- MODEL-SPECIFIC: pre-norm residual blocks (LayerNorm -> sublayer -> add)
# =============================================================================


class Qwen3VLVisionBlock(nn.Module):
    def __init__(self, config: Qwen3VLVisionConfig):
        super().__init__()
        self.norm1 = Qwen3VLVisionLayerNorm(config.hidden_size, config.layer_norm_eps, config.torch_dtype)
        self.norm2 = Qwen3VLVisionLayerNorm(config.hidden_size, config.layer_norm_eps, config.torch_dtype)
        self.attn = Qwen3VLVisionAttention(config)
        self.mlp = Qwen3VLVisionMLP(config)

    def forward(self, hidden_states, position_embeddings, frame_spans) -> torch.Tensor:
        hidden_states = hidden_states + self.attn(self.norm1(hidden_states), position_embeddings, frame_spans)
        return hidden_states + self.mlp(self.norm2(hidden_states))


# =============================================================================
# Section 6: Patch merger
# <-- MODEL-SPECIFIC: norm, m x m patches concatenated, fc1 -> GELU (erf) -> fc2, replicated
# =============================================================================


class Qwen3VLVisionPatchMerger(nn.Module):
    """``postshuffle_norm``: normalize after concatenating (the deep-stack
    mergers) rather than each patch before (the final merger)."""

    def __init__(self, config: Qwen3VLVisionConfig, postshuffle_norm: bool):
        super().__init__()
        self.dtype = config.torch_dtype
        self.merged_size = config.hidden_size * config.spatial_merge_size**2
        self.postshuffle_norm = postshuffle_norm
        norm_size = self.merged_size if postshuffle_norm else config.hidden_size
        self.norm = Qwen3VLVisionLayerNorm(norm_size, config.layer_norm_eps, self.dtype)
        self.linear_fc1_weight = nn.Parameter(
            torch.empty(self.merged_size, self.merged_size, dtype=self.dtype)
        )
        self.linear_fc1_bias = nn.Parameter(torch.empty(self.merged_size, dtype=self.dtype))
        self.linear_fc2_weight = nn.Parameter(
            torch.empty(self.merged_size, config.out_hidden_size, dtype=self.dtype)
        )
        self.linear_fc2_bias = nn.Parameter(torch.empty(config.out_hidden_size, dtype=self.dtype))
        # >>> PARALLELISM: replicated: every rank loads the whole merger <<<
        transposed = sharding_weight_loader(
            shard_dim=0, shard_size=self.merged_size, num_shards=1, is_storage_transposed=True
        )
        set_weight_loader(self.linear_fc1_weight, transposed)
        set_weight_loader(self.linear_fc2_weight, transposed)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.postshuffle_norm:
            hidden_states = self.norm(hidden_states.reshape(-1, self.merged_size))
        else:
            hidden_states = self.norm(hidden_states).reshape(-1, self.merged_size)
        hidden_states = hidden_states @ self.linear_fc1_weight + self.linear_fc1_bias
        hidden_states = torch.nn.functional.gelu(hidden_states.to(torch.float32)).to(self.dtype)
        return hidden_states @ self.linear_fc2_weight + self.linear_fc2_bias


# =============================================================================
# Section 7: Vision model
# <-- MODEL-SPECIFIC: patch embedding + interpolated positions, blocks, deep-stack taps, merger
# =============================================================================


class Qwen3VLVisionModel(nn.Module):
    def __init__(self, config: Qwen3VLVisionConfig):
        super().__init__()
        self.config = config
        self.dtype = config.torch_dtype
        patch_size = config.in_channels * config.temporal_patch_size * config.patch_size**2
        self.patch_embed_weight = nn.Parameter(torch.empty(patch_size, config.hidden_size, dtype=self.dtype))
        self.patch_embed_bias = nn.Parameter(torch.empty(config.hidden_size, dtype=self.dtype))
        set_weight_loader(self.patch_embed_weight, patch_embed_weight_loader())
        self.pos_embed = nn.Parameter(
            torch.empty(config.num_position_embeddings, config.hidden_size, dtype=self.dtype)
        )
        self.rotary_pos_emb = Qwen3VLVisionRotaryEmbedding(config)
        self.blocks = nn.ModuleList([Qwen3VLVisionBlock(config) for _ in range(config.depth)])
        self.merger = Qwen3VLVisionPatchMerger(config, postshuffle_norm=False)
        self.deepstack_visual_indexes = list(config.deepstack_visual_indexes)
        self.deepstack_merger_list = nn.ModuleList(
            [Qwen3VLVisionPatchMerger(config, postshuffle_norm=True) for _ in self.deepstack_visual_indexes]
        )

    def forward(
        self,
        pixel_values: torch.Tensor,
        patch_positions: torch.Tensor,
        interp_indices: torch.Tensor,
        interp_weights: torch.Tensor,
        frame_spans: list[tuple[int, int]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``pixel_values`` ``[patches, C * t * p * p]`` -> (merged tokens
        ``[patches / m^2, out]``, deep-stack features ``[levels, patches / m^2, out]``)."""
        hidden_states = pixel_values.to(self.dtype) @ self.patch_embed_weight + self.patch_embed_bias
        table = self.pos_embed[interp_indices].to(torch.float32)
        positions = (table * interp_weights.to(torch.float32)[..., None]).sum(1)
        hidden_states = hidden_states + positions.to(self.dtype)
        position_embeddings = self.rotary_pos_emb(patch_positions, dtype=self.dtype)

        deepstack = []
        for index, block in enumerate(self.blocks):
            hidden_states = block(hidden_states, position_embeddings, frame_spans)
            if index in self.deepstack_visual_indexes:
                merger = self.deepstack_merger_list[self.deepstack_visual_indexes.index(index)]
                deepstack.append(merger(hidden_states))
        merged = self.merger(hidden_states)
        if deepstack:
            return merged, torch.stack(deepstack)
        return merged, merged.new_zeros(0, *merged.shape)
