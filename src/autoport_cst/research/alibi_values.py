"""ALiBi's slopes read by running the modeling code's own builder.

BLOOM's ``_get_alibi_slopes(num_heads, device)`` returns one slope per head;
MPT's ``build_mpt_alibi_tensor(num_heads, sequence_length, alibi_bias_max=8,
device)`` returns the bias itself, ``slope * (position - last position)`` per
head and position. The builder research found (a function of the modeling
source, given the number of heads) is called with the arguments the
interpreter bound at the call (its defaults included; a symbolic one, such as
a device, passed as None), once for the model's head count and once for each
of ``PROBED_HEADS``, with only the head count changed. Each call's slopes (the
values themselves, or the step from one position to the next of a bias that
grows linearly with the position) must be the ALiBi slopes ``2 ** -(bias_max
* i / n)`` of one ``bias_max`` (n the power of two at or above the head
count; for other counts the even i, then the odd ones, cut to the count)
within ``TOLERANCE``, relative: then that ``bias_max`` is the model's. BLOOM's
slopes, computed as powers of a base, differ from these by up to 5.2e-7
(112 heads)."""

from __future__ import annotations

import importlib
import math
from typing import Any

# head counts probed besides the model's: powers of two and others
PROBED_HEADS = (8, 5, 6, 12, 20)
TOLERANCE = 2e-6
_PLAIN = (int, float, bool, str, type(None))


def formula_slopes(heads: int, bias_max: float) -> list[float]:
    """The ALiBi slopes of ``heads`` heads (the formula the port computes)."""
    n = 1 << (heads - 1).bit_length()
    slopes = [2.0 ** -(bias_max * i / n) for i in range(1, n + 1)]
    if n != heads:
        slopes = (slopes[1::2] + slopes[::2])[:heads]
    return slopes


def alibi_bias_max(module: str, function: str, args: tuple, head_index: int) -> tuple[float, bool] | None:
    """``(bias_max, per_position)`` of the builder ``function`` of ``module``
    given ``args`` (the head count at ``head_index``); ``per_position``: it
    returns the bias along the positions, not the slopes alone. None when a
    call fails or its values are no ALiBi slopes of one bias_max."""
    try:
        builder = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError):
        return None
    plain = [a if isinstance(a, _PLAIN) else None for a in args]
    if any(not isinstance(a, _PLAIN) and not _symbolic(a) for a in args):
        return None
    measured: dict[int, tuple[list[float], bool]] = {}
    for heads in (args[head_index], *PROBED_HEADS):
        found = _slopes(builder, [*plain[:head_index], heads, *plain[head_index + 1 :]], heads)
        if found is None:
            return None
        measured[heads] = found
    first = measured[8][0][0]
    if not 0.0 < first < 1.0:
        return None
    bias_max = -8 * math.log2(first)
    if abs(bias_max - round(bias_max)) < 1e-4:
        bias_max = float(round(bias_max))
    kinds = {per_position for _, per_position in measured.values()}
    for heads, (slopes, _) in measured.items():
        expected = formula_slopes(heads, bias_max)
        if any(abs(a - b) > TOLERANCE * b for a, b in zip(slopes, expected, strict=True)):
            return None
    return (bias_max, kinds.pop()) if len(kinds) == 1 else None


def _symbolic(value: Any) -> bool:
    return type(value).__name__ == "Node"


def _slopes(builder, args: list, heads: int) -> tuple[list[float], bool] | None:
    """The slopes one call of ``builder`` gives ``heads`` heads, and whether it
    returned a bias along the positions."""
    import torch

    try:
        with torch.no_grad():
            out = builder(*args)
    except Exception:  # noqa: BLE001 - any failure of foreign code: not read
        return None
    if not isinstance(out, torch.Tensor) or out.dim() == 0 or out.shape[0] != heads:
        return None
    out = out.to(torch.float64).reshape(heads, -1)
    if out.shape[1] == 1:
        return [float(v) for v in out[:, 0]], False
    # the step between the last two positions (the values nearest 0, the least rounded); the bias
    # must be that step times the distance to the last position, at every position
    steps = out[:, -1] - out[:, -2]
    distance = torch.arange(out.shape[1], dtype=torch.float64) - (out.shape[1] - 1)
    if not torch.allclose(out, out[:, -1:] + steps[:, None] * distance, rtol=1e-6, atol=1e-6):
        return None
    return [float(v) for v in steps], True
