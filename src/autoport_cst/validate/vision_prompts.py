"""The prompts a vision-language validation feeds: one with images and one
text-only, each followed by teacher-forced decode steps.

The image prompt holds two images of different patch grids (so the tower
attends inside each frame, the merged tokens land in prompt order, and the
M-RoPE positions resume after each image at its start plus its larger merged
side): ``text, <vision_start>, image tokens, <vision_end>, text, ...``. The
text-only prompt has the same length and no image token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .vision_tiny import TinyImages, tiny_images

IMAGE_GRIDS = ((1, 4, 6), (1, 4, 4))  # 6 and 4 merged tokens with merge 2
# the image prompt: 6 text tokens, then per image start, image tokens, end and 2 text tokens: 24 tokens,
# so a sequence-parallel prefill splits it over TP 2, 4 or 8


@dataclass(frozen=True)
class VisionPrompt:
    """A prompt: its token ids and its images (None: text-only)."""

    label: str
    input_ids: tuple[int, ...]
    images: TinyImages | None

    def token_types(self, image_token_id: int, extra: int = 0) -> torch.Tensor:
        """transformers' ``mm_token_type_ids`` (1 at image tokens) of the
        prompt followed by ``extra`` text tokens, ``[1, T + extra]``."""
        types = [1 if token == image_token_id else 0 for token in self.input_ids] + [0] * extra
        return torch.tensor([types], dtype=torch.int64)


def vision_prompts(hf_config, seed: int = 0) -> tuple[VisionPrompt, VisionPrompt]:
    """(the image prompt, the text-only prompt) for a checkpoint's config."""
    vision = hf_config.vision_config
    images = tiny_images(vision, list(IMAGE_GRIDS), seed + 7)
    merge = vision.spatial_merge_size
    text = [11, 12, 13, 14, 15, 16]
    ids: list[int] = text
    for count in images.merged_tokens(merge):
        ids += [hf_config.vision_start_token_id] + [hf_config.image_token_id] * count
        ids += [hf_config.vision_end_token_id] + text[:2]
    plain = [(16 + 3 * index) % 200 + 1 for index in range(len(ids))]
    return VisionPrompt("image", tuple(ids), images), VisionPrompt("text", tuple(plain), None)
