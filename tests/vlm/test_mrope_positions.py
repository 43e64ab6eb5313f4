"""The reference's M-RoPE positions of a prompt (vision_preprocessing.mrope_positions,
what the port's get_mrope_input_positions returns) equal transformers'
get_rope_index, positions and delta, for text-only prompts, one image, two
images of different grids, an image first or last, and a multi-frame grid; the
same for Qwen2.5-VL and Qwen2-VL (whose image positions are computed alike), the
families a port from this reference targets next."""

from __future__ import annotations

import pytest
import torch

from autoport_cst.validate.vision_tiny import IMAGE_TOKEN_ID

MERGE = 2


def _prompt(layout):
    """``layout``: ints are text runs, tuples are image grids (t, h, w)."""
    ids, grids = [], []
    for item in layout:
        if isinstance(item, tuple):
            t, h, w = item
            ids += [IMAGE_TOKEN_ID] * (t * h * w // MERGE**2)
            grids.append(item)
        else:
            ids += list(range(1, item + 1))
    return ids, grids


@pytest.mark.parametrize(
    "layout",
    [
        [7],
        [3, (1, 4, 6), 2],
        [2, (1, 4, 6), 3, (1, 4, 4), 1],
        [(1, 6, 4), 5],
        [4, (1, 2, 8)],
        [1, (2, 4, 4), 2],
    ],
    ids=["text", "one-image", "two-images", "image-first", "image-last", "two-frames"],
)
def test_positions_match_get_rope_index(preprocessing, hf_qwen_vl, layout):
    ids, grids = _prompt(layout)
    grid = torch.tensor(grids) if grids else None
    types = torch.tensor([[1 if token == IMAGE_TOKEN_ID else 0 for token in ids]])
    expected, expected_delta = hf_qwen_vl.model.get_rope_index(
        torch.tensor([ids]), types, image_grid_thw=grid
    )
    positions, delta = preprocessing.mrope_positions(ids, grid, IMAGE_TOKEN_ID, MERGE)
    assert torch.equal(positions, expected[:, 0])
    assert delta == int(expected_delta.reshape(-1)[0])


def test_image_positions_are_not_the_token_positions(preprocessing):
    """The check has teeth: an image's rows differ from the 1-D positions."""
    ids, grids = _prompt([3, (1, 4, 6), 2])
    positions, delta = preprocessing.mrope_positions(ids, torch.tensor(grids), IMAGE_TOKEN_ID, MERGE)
    assert not torch.equal(positions, torch.arange(len(ids)).expand(3, -1))
    assert delta == -3  # 6 image tokens advance the positions by the larger merged side, 3
