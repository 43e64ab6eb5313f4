"""The reference's host-side tower inputs equal transformers' own helpers:
the (row, column) of each patch in the processor's merge-block order and the
bilinear taps and weights that resample the learned position table."""

from __future__ import annotations

import pytest
import torch
from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_position_ids

GRIDS = [[1, 4, 6], [1, 4, 4], [2, 2, 6]]


def test_patch_positions(preprocessing):
    grid = torch.tensor(GRIDS)
    assert torch.equal(preprocessing.patch_rotary_positions(grid, 2), get_vision_position_ids(grid, 2))


@pytest.mark.parametrize("side", [4, 5])
def test_position_interpolation(preprocessing, side):
    grid = torch.tensor(GRIDS)
    indices, weights = preprocessing.position_interpolation(grid, 2, side * side)
    expected_indices, expected_weights = get_vision_interpolation_indices_and_weights(
        grid, side, mode="bilinear", align_corners=True, spatial_merge_size=2
    )
    assert torch.equal(indices, expected_indices)
    torch.testing.assert_close(weights, expected_weights.float(), rtol=0, atol=1e-7)


def test_frame_spans(preprocessing):
    assert preprocessing.image_patch_spans(torch.tensor(GRIDS)) == [(0, 24), (24, 40), (40, 52), (52, 64)]
