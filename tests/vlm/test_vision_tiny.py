"""Tiny vision-language checkpoints of the Qwen families build from
transformers' configs (no download), load back into transformers with every
tensor present, and run the validation's prompts (two images and text only);
a class without a vision tower is refused by name."""

from __future__ import annotations

import pytest
import torch

from autoport_cst.errors import InputError
from autoport_cst.validate.driver import port_hf_config
from autoport_cst.validate.vision_prompts import vision_prompts
from autoport_cst.validate.vision_reference import run_vision_reference
from autoport_cst.validate.vision_tiny import TINY_VOCAB, build_tiny_vlm_checkpoint, tiny_vlm_config

from .conftest import QWEN_VL_ARCHITECTURES


@pytest.mark.parametrize("architecture", QWEN_VL_ARCHITECTURES)
def test_tiny_checkpoint_runs_the_validation_prompts(tmp_path, architecture):
    checkpoint = build_tiny_vlm_checkpoint(tmp_path, seed=0, architecture=architecture)
    image, text = vision_prompts(port_hf_config(checkpoint, torch.float32))
    assert len(image.input_ids) == len(text.input_ids) == 24
    (image_run, text_run), _ = run_vision_reference(checkpoint, (image, text), steps=1, bf16=False)
    assert image_run.logits.shape == (25, TINY_VOCAB) and torch.isfinite(image_run.logits).all()
    tower = {name for name in image_run.records if name.startswith("vision.")}
    assert {"vision.blocks.0", "vision.blocks.2", "vision.merger"} <= tower
    assert ("vision.deepstack.0" in tower) == (architecture == "Qwen3VLForConditionalGeneration")
    assert not any(name.startswith("vision.") for name in text_run.records)
    assert image_run.rope_delta == -5  # 6 + 4 image tokens advance the positions by 3 + 2


def test_a_class_without_a_vision_tower_is_refused():
    with pytest.raises(InputError, match="LlamaForCausalLM: not a transformers vision-language model class"):
        tiny_vlm_config("LlamaForCausalLM")
