# SPDX-License-Identifier: Apache-2.0
"""Weight loaders of the Qwen3-VL vision tower.

The tower's checkpoint stores each attention's Q, K and V fused in one
tensor (``attn.qkv.weight`` ``[3 D, D]``, rows Q heads | K heads | V heads,
and ``attn.qkv.bias`` ``[3 D]``). A TP rank keeps its heads of each of the
three parts, so its shard is three row ranges, not one contiguous slice.
The patch embedding is a Conv3d whose stride equals its kernel: a linear
map of each flattened patch, stored here as ``[C * t * p * p, D]``.
"""

from __future__ import annotations

import torch

from vllm_neuron.utils.weight_loader import SafetensorsWeightLoader


def vis_qkv_weight_loader(hidden_size: int, size_per_rank: int) -> SafetensorsWeightLoader:
    """``[D, 3 * size_per_rank]``: this rank's Q, K, V rows, transposed."""

    def transform(slices, rank: int) -> torch.Tensor:
        start = rank * size_per_rank
        parts = [
            slices[0][part * hidden_size + start : part * hidden_size + start + size_per_rank]
            for part in range(3)
        ]
        return torch.cat(parts, dim=0).T

    return SafetensorsWeightLoader(transform)


def vis_qkv_bias_loader(hidden_size: int, size_per_rank: int) -> SafetensorsWeightLoader:
    """``[1, 3 * size_per_rank]``: this rank's Q, K, V biases."""

    def transform(slices, rank: int) -> torch.Tensor:
        start = rank * size_per_rank
        parts = [
            slices[0][part * hidden_size + start : part * hidden_size + start + size_per_rank]
            for part in range(3)
        ]
        return torch.cat(parts, dim=0).unsqueeze(0)

    return SafetensorsWeightLoader(transform)


def patch_embed_weight_loader() -> SafetensorsWeightLoader:
    """``[C * t * p * p, D]`` from the Conv3d weight ``[D, C, t, p, p]``."""

    def transform(slices, rank: int) -> torch.Tensor:
        weight = slices[0][:]
        return weight.reshape(weight.shape[0], -1).T

    return SafetensorsWeightLoader(transform)


def row_bias_loader() -> SafetensorsWeightLoader:
    """A 1-D bias as ``[1, size]`` (the kernels take 2-D biases), replicated."""

    def transform(slices, rank: int) -> torch.Tensor:
        return slices[0][:].unsqueeze(0)

    return SafetensorsWeightLoader(transform)


def sharded_row_bias_loader(size_per_rank: int) -> SafetensorsWeightLoader:
    """This rank's part of a 1-D bias over a sharded output, as ``[1, size]``."""

    def transform(slices, rank: int) -> torch.Tensor:
        start = rank * size_per_rank
        return slices[0][start : start + size_per_rank].unsqueeze(0)

    return SafetensorsWeightLoader(transform)
