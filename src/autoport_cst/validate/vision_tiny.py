"""Tiny vision-language checkpoints and the images fed to them, made in
memory: nothing is downloaded.

``tiny_qwen3_vl_config`` shrinks transformers' ``Qwen3VLConfig`` to a model
that runs in well under a second: a 3-layer text decoder (hidden 64, 4
query and 2 KV heads of 16, M-RoPE sections [4, 2, 2] of the 8 frequency
pairs) and a 3-block vision tower (hidden 32, 2 heads, patch 4, temporal
patch 2, merge 2, a 4 x 4 position table resampled to each image, deep-stack
taps after blocks 0 and 1, so two decoder layers receive deep-stack
features). The special tokens sit at the top of a 256-token vocabulary.

``tiny_images`` makes the ``pixel_values`` of images with the given patch
grids (``[patches, C * t * p * p]``, in the processor's patch order) from a
seeded generator; ``build_tiny_vlm_checkpoint`` writes the seeded random
weights (``tiny.save_seeded_checkpoint``: constant tensors perturbed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

TINY_VOCAB = 256
IMAGE_TOKEN_ID = 250
VIDEO_TOKEN_ID = 251
VISION_START_TOKEN_ID = 248
VISION_END_TOKEN_ID = 249

TINY_TEXT = {
    "vocab_size": TINY_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": [4, 2, 2],
        "mrope_interleaved": True,
    },
}
TINY_VISION = {
    "depth": 3,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": 4,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": 64,
    "num_position_embeddings": 16,
    "deepstack_visual_indexes": [0, 1],
}


def tiny_qwen3_vl_config() -> Any:
    """transformers' ``Qwen3VLConfig`` of the tiny model (module docstring)."""
    from transformers import Qwen3VLConfig

    config = Qwen3VLConfig(
        text_config=dict(TINY_TEXT),
        vision_config=dict(TINY_VISION),
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=VIDEO_TOKEN_ID,
        vision_start_token_id=VISION_START_TOKEN_ID,
        vision_end_token_id=VISION_END_TOKEN_ID,
    )
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    return config


def build_tiny_vlm_checkpoint(directory: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write the tiny Qwen3-VL checkpoint (config.json, model.safetensors)."""
    from transformers import Qwen3VLForConditionalGeneration

    from .tiny import save_seeded_checkpoint

    save_seeded_checkpoint(directory, Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config(), seed)
    return Path(directory)


@dataclass(frozen=True)
class TinyImages:
    """Images of a prompt: their patch rows and their (t, h, w) patch grids."""

    pixel_values: torch.Tensor  # [patches, C * t * p * p]
    grid_thw: torch.Tensor  # [images, 3]

    def merged_tokens(self, merge: int) -> list[int]:
        return [int(t * h * w) // (merge * merge) for t, h, w in self.grid_thw.tolist()]


def tiny_images(vision_config: Any, grids: list[tuple[int, int, int]], seed: int) -> TinyImages:
    """Seeded pixel rows for images of patch grids ``grids``."""
    width = vision_config.in_channels * vision_config.temporal_patch_size * vision_config.patch_size**2
    patches = sum(t * h * w for t, h, w in grids)
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(patches, width, generator=generator, dtype=torch.float32)
    return TinyImages(pixels, torch.tensor(grids, dtype=torch.int64))
