"""The qwen3_vl reference refuses to prefill a prompt with images in segments
(its merge hands out the tower's rows from the call's first image token on),
and still prefills a text-only call with the same metadata."""

from __future__ import annotations

import pytest
import torch

from autoport_cst.validate.driver import port_hf_config
from autoport_cst.validate.package import imported_package
from autoport_cst.validate.runner_metadata import build_metadata
from autoport_cst.validate.standin import standin_installed
from autoport_cst.validate.vision_prompts import vision_prompts
from autoport_cst.validate.vision_session import BLOCK_SIZE, VisionPortSession

from .conftest import REFERENCE

SEGMENT = 512


def test_image_prompt_in_segments_is_refused(tiny_qwen3_vl):
    hf_config = port_hf_config(tiny_qwen3_vl, torch.float32)
    image, text = vision_prompts(hf_config)
    with standin_installed(), imported_package(REFERENCE) as package:
        session = VisionPortSession(package.factory, tiny_qwen3_vl, hf_config, 2)
        model = session.model
        rows = len(image.input_ids)
        metadata = build_metadata(
            session.layer_names,
            set(),
            max_query_len=SEGMENT,
            slots=[session.tables[0][0] * BLOCK_SIZE + p for p in range(rows)] + [-1] * (SEGMENT - rows),
            tables=[session.tables[0]],
            block_size=BLOCK_SIZE,
            cached=[0],
            kv_segment_size=SEGMENT,
        )
        inputs = {
            "input_ids": torch.tensor(list(image.input_ids) + [0] * (SEGMENT - rows)),
            "positions": torch.tensor(list(range(rows)) + [0] * (SEGMENT - rows)),
            "attn_metadata": metadata,
            "sampling_positions": torch.tensor([rows - 1]),
        }
        embeddings = model.embed_multimodal(image.images.pixel_values, image.images.grid_thw)
        with pytest.raises(NotImplementedError, match="in one call"):
            model(**inputs, vision_embeddings=embeddings)
        vocab = hf_config.get_text_config().vocab_size
        assert model(**inputs).shape == (1, vocab)  # the same call without images: the text path
