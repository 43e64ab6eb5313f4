"""Code the vision-window-attention codemod writes: the host-side window
partition of a tower's merged tokens, and the host-side reordering around the
tower's call (rows into window order, merged tokens back)."""

WINDOW_PARTITION = '''
def window_partition(image_grid_thw, merge: int, window_size: int, patch_size: int):
    """Window attention's order of the merged tokens, and each window's span of
    patch rows in that order. Every frame's grid of merged tokens is cut into
    windows of ``window_size // merge // patch_size`` merged tokens a side (the
    last row and column of windows may be smaller), read window by window, each
    row by row, frames and images in turn. Returns (``order`` ``[tokens]``: the
    merged token at each new position, ``spans``: ``(start, end)`` patch rows)."""
    if isinstance(image_grid_thw, torch.Tensor):
        image_grid_thw = image_grid_thw.tolist()
    side = window_size // merge // patch_size
    unit = merge * merge
    order, spans, offset, start = [], [], 0, 0
    for t, h, w in image_grid_thw:
        rows, cols = int(h) // merge, int(w) // merge
        grid = torch.arange(int(t) * rows * cols).view(int(t), rows, cols) + offset
        for frame in range(int(t)):
            for top in range(0, rows, side):
                for left in range(0, cols, side):
                    window = grid[frame, top : top + side, left : left + side].reshape(-1)
                    order.append(window)
                    spans.append((start, start + window.numel() * unit))
                    start += window.numel() * unit
        offset += int(t) * rows * cols
    return torch.cat(order), spans
'''

COMMENT = "<-- MODEL-SPECIFIC: window attention: the patches in window order, the merged tokens back after"
BEFORE_CALL = """
order, window_spans = window_partition(
    image_grid_thw, merge, self.vision_config.window_size, self.vision_config.patch_size
)
rows = (order.view(-1, 1) * (merge * merge) + torch.arange(merge * merge)).reshape(-1)
"""
AFTER_CALL = """
restore = torch.argsort(order)
return merged[restore], deepstack[:, restore]
"""

FIELDS_CODE = (
    "window_size: int = 112",
    "fullatt_block_indexes: list[int] = field(default_factory=list)",
)
