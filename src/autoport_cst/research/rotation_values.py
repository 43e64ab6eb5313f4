"""Which way a rotation of the halves turns, read by running the modeling
code's own rotation function.

transformers' ``rotate_half(x)`` is ``cat((-x2, x1))`` (x1, x2 the halves of
each head), so that ``x * cos + rotate_half(x) * sin`` turns each pair
``(x1[j], x2[j])`` by the position's angle. NanoChat's is ``cat((x2, -x1))``:
the same pairs turned the other way, which equals the usual rotation of the
head with its halves swapped, swapped back (``P R P``, ``P`` the swap of the
halves). Both read as "halves and a negation" in the code; the function
(``apply_rotary_pos_emb(q, k, cos, sin)``) is called with ``cos = 0`` and
``sin = 1`` on a head ``1 .. d``, where it returns ``rotate_half`` itself:
``[-(d/2 + 1) .. -d, 1 .. d/2]`` for the usual turn, ``[d/2 + 1 .. d, -1
.. -d/2]`` for the swapped one."""

from __future__ import annotations

import importlib
from typing import Literal

HEAD = 8  # the width of the probed head
Turn = Literal["rotate_half", "rotate_half_swapped"]


def halves_turn(module: str, function: str) -> Turn | None:
    """The turn of the rotation ``function`` of ``module`` (called as
    ``function(q, k, cos, sin)``); None when the call fails or returns
    neither."""
    try:
        import torch

        rotate = getattr(importlib.import_module(module), function)
        head = torch.arange(1.0, HEAD + 1.0).reshape(1, 1, 1, HEAD)
        cos, sin = torch.zeros(1, 1, HEAD), torch.ones(1, 1, HEAD)
        out = rotate(head, head.clone(), cos, sin)
    except Exception:  # noqa: BLE001 - a function of another signature: not read
        return None
    rotated = out[0] if isinstance(out, (tuple, list)) else out
    if not hasattr(rotated, "shape") or tuple(rotated.shape) != (1, 1, 1, HEAD):
        return None
    first, second = head[..., : HEAD // 2], head[..., HEAD // 2 :]
    if torch.equal(rotated, torch.cat((-second, first), dim=-1)):
        return "rotate_half"
    if torch.equal(rotated, torch.cat((second, -first), dim=-1)):
        return "rotate_half_swapped"
    return None
