# SPDX-License-Identifier: Apache-2.0
"""Host-side preprocessing of the vision tower and the text decoder's M-RoPE
positions: everything here depends only on the images' patch grids
(``image_grid_thw``, one ``(t, h, w)`` row per image, in patches) and the
prompt's token ids, so the runner computes it on the CPU before the
compiled forward (no data-dependent shapes on the device).

- ``patch_rotary_positions``: the (row, column) of every patch, in the
  processor's patch order (merge-block major: the ``m x m`` patches of one
  merged token are consecutive);
- ``position_interpolation``: the four table rows and bilinear weights
  (``align_corners=True``) that resample the square learned position table to
  each image's grid;
- ``image_patch_spans``: each image frame's ``[start, end)`` patch rows (the
  tower's attention stays inside a frame);
- ``mrope_positions``: the three M-RoPE position rows (temporal, height,
  width) of a prompt, and the offset of the positions after it.
"""

from __future__ import annotations

import torch


def _grids(image_grid_thw) -> list[tuple[int, int, int]]:
    if isinstance(image_grid_thw, torch.Tensor):
        image_grid_thw = image_grid_thw.tolist()
    return [(int(t), int(h), int(w)) for t, h, w in image_grid_thw]


def _merge_order(h: int, w: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of each patch of an ``h x w`` grid in merge-block order."""
    rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge, merge)
    cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, w // merge, merge)
    return rows.transpose(1, 2).reshape(-1), cols.transpose(1, 2).reshape(-1)


def patch_rotary_positions(image_grid_thw, merge: int) -> torch.Tensor:
    """``[patches, 2]``: (row, column) per patch, every frame of an image alike."""
    found = []
    for t, h, w in _grids(image_grid_thw):
        rows, cols = _merge_order(h, w, merge)
        found.append(torch.stack((rows, cols), dim=-1).repeat(t, 1))
    return torch.cat(found, dim=0)


def _axis_taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two table entries around each target index and their weights."""
    source = index.to(torch.float32) * (side - 1) / max(size - 1, 1)
    low = torch.floor(source)
    taps = torch.stack((low, low + 1), dim=-1).long().clamp(0, side - 1)
    weights = torch.stack((1 - (source - low), source - low), dim=-1)
    return taps, weights


def position_interpolation(
    image_grid_thw, merge: int, num_position_embeddings: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``([patches, 4], [patches, 4])``: table rows and bilinear weights."""
    side = int(num_position_embeddings**0.5)
    indices, weights = [], []
    for t, h, w in _grids(image_grid_thw):
        rows, cols = _merge_order(h, w, merge)
        row_taps, row_weights = _axis_taps(rows, h, side)
        col_taps, col_weights = _axis_taps(cols, w, side)
        index = (row_taps[:, :, None] * side + col_taps[:, None, :]).reshape(-1, 4)
        weight = (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, 4)
        indices.append(index.repeat(t, 1))
        weights.append(weight.repeat(t, 1))
    return torch.cat(indices, dim=0), torch.cat(weights, dim=0)


def image_patch_spans(image_grid_thw) -> list[tuple[int, int]]:
    """Each frame's ``[start, end)`` rows among the patches."""
    spans, start = [], 0
    for t, h, w in _grids(image_grid_thw):
        for _ in range(t):
            spans.append((start, start + h * w))
            start += h * w
    return spans


def merged_token_counts(image_grid_thw, merge: int) -> list[int]:
    """Tokens each image takes in the prompt after the patch merger."""
    return [t * h * w // (merge * merge) for t, h, w in _grids(image_grid_thw)]


def mrope_positions(
    input_ids: list[int], image_grid_thw, image_token_id: int, merge: int
) -> tuple[torch.Tensor, int]:
    """``([3, T], delta)``: M-RoPE positions of a prompt. A run of text tokens
    counts up on all three rows from the position after the previous item;
    an image's tokens take (frame, row, column) of its merged grid, offset by
    the position where the image starts; the text after an image resumes at
    that start plus the larger grid side. ``delta`` is what a later token's
    sequence index adds to get its position (all three rows alike)."""
    grids = iter(_grids(image_grid_thw) if image_grid_thw is not None else [])
    rows: list[torch.Tensor] = []
    index, current = 0, 0
    while index < len(input_ids):
        if input_ids[index] != image_token_id:
            end = index
            while end < len(input_ids) and input_ids[end] != image_token_id:
                end += 1
            rows.append(torch.arange(current, current + end - index).view(1, -1).expand(3, -1))
            current += end - index
            index = end
            continue
        t, h, w = next(grids)
        gh, gw = h // merge, w // merge
        frame = torch.arange(t).view(t, 1, 1).expand(t, gh, gw)
        row = torch.arange(gh).view(1, gh, 1).expand(t, gh, gw)
        col = torch.arange(gw).view(1, 1, gw).expand(t, gh, gw)
        rows.append(torch.stack((frame, row, col)).reshape(3, -1) + current)
        index += t * gh * gw
        current += max(gh, gw)
    positions = torch.cat(rows, dim=1) if rows else torch.zeros(3, 0, dtype=torch.long)
    delta = int(positions.max()) + 1 - len(input_ids) if len(input_ids) else 0
    return positions.long(), delta
