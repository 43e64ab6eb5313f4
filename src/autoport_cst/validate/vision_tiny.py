"""Tiny vision-language checkpoints and the images fed to them, made in
memory: nothing is downloaded. Qwen3-VL by default; Qwen2-VL and Qwen2.5-VL
(``tiny_vlm_config(architecture)``) shrink the same way, by the fields their
vision configs have (Qwen2.5-VL: one full-attention block between windowed
ones, windows of 2 x 2 merged tokens).

``tiny_qwen3_vl_config`` shrinks transformers' ``Qwen3VLConfig`` to a model
that runs in well under a second: a 3-layer text decoder (hidden 64, 4
query and 2 KV heads of 16, M-RoPE sections [4, 2, 2] of the 8 frequency
pairs) and a 3-block vision tower (hidden 32, 2 heads, patch 4, temporal
patch 2, merge 2, a 4 x 4 position table resampled to each image, deep-stack
taps after blocks 0 and 1, so two decoder layers receive deep-stack
features). The special tokens sit near the top of a 255-token vocabulary
(odd, so that the TP=2 runs shard a padded one).

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

from autoport_cst.errors import InputError

TINY_VOCAB = 255  # odd: the TP=2 runs shard a padded vocabulary
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
    },
}
TINY_SPECIAL_TOKENS = {"bos_token_id": 1, "eos_token_id": 2}  # inside the tiny vocabulary
# vision-config fields set where the architecture's vision config has them
TINY_VISION = {
    "depth": 3,
    "num_heads": 2,
    "intermediate_size": 64,
    "patch_size": 4,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": 64,
    "num_position_embeddings": 16,  # Qwen3-VL's learned position table (4 x 4)
    "deepstack_visual_indexes": [0, 1],  # Qwen3-VL
    "fullatt_block_indexes": [1],  # Qwen2.5-VL: block 1 attends over the frame, 0 and 2 in windows
    "window_size": 16,  # Qwen2.5-VL: windows of 2 x 2 merged tokens
}
TOWER_WIDTH = 32
DEFAULT_ARCHITECTURE = "Qwen3VLForConditionalGeneration"


def _tiny_vision(vision_class: Any) -> dict[str, Any]:
    """The tiny vision config: ``TINY_VISION``'s fields the class has; the
    tower width 32 under ``embed_dim`` when the class has it (its
    ``hidden_size`` is then the merger's output, the text width), else under
    ``hidden_size``."""
    defaults = vision_class().to_dict()
    values = {name: value for name, value in TINY_VISION.items() if name in defaults}
    if "embed_dim" in defaults:
        values.update(embed_dim=TOWER_WIDTH, hidden_size=TINY_TEXT["hidden_size"])
    else:
        values["hidden_size"] = TOWER_WIDTH
    return values


def tiny_vlm_config(architecture: str = DEFAULT_ARCHITECTURE) -> Any:
    """transformers' config of the tiny model of ``architecture`` (a Qwen
    vision-language class: Qwen2-VL, Qwen2.5-VL, Qwen3-VL; module docstring)."""
    import transformers

    model_class = getattr(transformers, architecture, None)
    config_class = getattr(model_class, "config_class", None)
    if config_class is None or "vision_config" not in getattr(config_class, "sub_configs", {}):
        raise InputError(f"{architecture}: not a transformers vision-language model class")
    text_class = config_class.sub_configs["text_config"]
    text_fields = text_class().to_dict()
    text = {k: v for k, v in TINY_TEXT.items() if k in text_fields or k == "rope_parameters"}
    # transformers 5.2x keeps the special tokens on the text config, earlier ones on the outer one
    text.update({k: v for k, v in TINY_SPECIAL_TOKENS.items() if text_fields.get(k) is not None})
    config = config_class(
        text_config=text,
        vision_config=_tiny_vision(config_class.sub_configs["vision_config"]),
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=VIDEO_TOKEN_ID,
        vision_start_token_id=VISION_START_TOKEN_ID,
        vision_end_token_id=VISION_END_TOKEN_ID,
    )
    for name, token in TINY_SPECIAL_TOKENS.items():
        if getattr(config, name, None) is not None:
            setattr(config, name, token)
    config.architectures = [architecture]
    return config


def tiny_qwen3_vl_config() -> Any:
    """transformers' ``Qwen3VLConfig`` of the tiny model (module docstring)."""
    return tiny_vlm_config(DEFAULT_ARCHITECTURE)


def build_tiny_vlm_checkpoint(
    directory: str | os.PathLike[str], seed: int = 0, architecture: str = DEFAULT_ARCHITECTURE
) -> Path:
    """Write the tiny checkpoint of ``architecture`` (config.json, model.safetensors)."""
    import transformers

    from .tiny import save_seeded_checkpoint

    config = tiny_vlm_config(architecture)
    save_seeded_checkpoint(directory, getattr(transformers, architecture), config, seed)
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
