"""The FP8 KV cache teacher-forced from the port's own cache.

A K or V value that the port and transformers compute a float32 rounding
apart can round to two FP8 neighbours when it lies at a rounding boundary of
the FP8 grid (the midpoint of two neighbours): one such value, read by every
later decode step, moves the attention by a fraction of an FP8 step, far past
the fp32 gate, though both sides rounded correctly. So the fp32 transformers
run of an FP8 validation stores, for every K/V element, the port's stored
value when it is transformers' own rounding or the other neighbour of a value
that lies within the fp32 gate's reach of the boundary between the two, and
its own rounding otherwise; everything downstream is then compared at the
normal fp32 bound.

The reach is the fp32 gate itself: a K (or V) row of one head at one position
that the gate would accept differs from transformers' by at most
``FP32_REL_ERROR_TOLERANCE`` times the row's norm, so any one of its elements
may lie that far off (in the cache's scaled units, ``x / s``). A port that
swaps or ignores a scale stores values a whole exponent or more away at
nearly every element, and none of them is taken: transformers keeps its own
rounding and the comparison fails at that layer's decode attention (as it
does for a port that stores them right and reads them back wrong).

Every value taken is one transformers' own run may store (its value rounded
to either FP8 neighbour it lies within the gate's reach of), whichever
element of the port's cache it came from: the forcing cannot make a wrong
port pass, it only lets transformers round as the port did. So it needs no
exact account of where the port keeps what: the port's head-dim columns are
matched to transformers' by the values they store (``column_order``: a port
that reorders K's columns for its RoPE kernel), and a layer whose cache does
not map element-wise keeps transformers' rounding.

``port_cache_contents`` reads the port's paged caches after its run (per
sequence, per layer index, the stored values ``[kv_heads, positions,
head_dim]`` as float32); ``forced_codes`` picks the stored values;
``ForcingTally`` counts what was taken (the report's ``kv_cache``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch

from .metrics import FP32_REL_ERROR_TOLERANCE

# sequence -> layer index -> (k, v) stored values [kv_heads, positions, head_dim]
CacheContents = dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]]
_LAYER_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")  # layers.<i>.self_attn, h.<i>.attn
_FP8 = torch.float8_e4m3fn


@dataclass
class ForcingTally:
    """What the teacher-forced cache took, over every K/V element stored."""

    elements: int = 0  # K/V elements stored in the transformers cache
    rounded_apart: int = 0  # the port's other FP8 neighbour at a rounding boundary: taken
    differing: int = 0  # other values than transformers' rounding: not taken
    layers: set[int] = field(default_factory=set)  # layers whose cache the port's fed
    unmatched: set[int] = field(default_factory=set)  # layers whose cache does not map element-wise

    def describe(self) -> dict[str, Any]:
        return {
            "teacher_forced": bool(self.layers),
            "elements": self.elements,
            "rounded_apart": self.rounded_apart,
            "differing": self.differing,
            "unmatched_layers": sorted(self.unmatched),
        }


def port_cache_contents(caches: dict[str, tuple], scenario: Any, sequences: list[int]) -> CacheContents:
    """The values the port stored in its FP8 caches (``[num_blocks,
    kv_heads, block_size, head_dim]`` per layer name, its first index the layer's)
    at each position of each sequence it ran, read through the sequence's
    block table."""
    contents: CacheContents = {}
    layout = scenario.layout
    for name, buffers in caches.items():
        match = _LAYER_INDEX.search(name)
        if match is None or len(buffers) != 2 or any(b.dim() != 4 or b.dtype != _FP8 for b in buffers):
            continue
        for sequence in sequences:
            table = scenario.block_table(sequence)
            length = len(scenario.prompts[sequence]) + scenario.steps
            slots = torch.tensor([layout.slot(table, p) for p in range(length)], dtype=torch.int64)
            blocks, offsets = slots // layout.block_size, slots % layout.block_size
            k, v = (buffer[blocks, :, offsets].transpose(0, 1).to(torch.float32) for buffer in buffers)
            contents.setdefault(sequence, {})[int(match[1])] = (k, v)
    return contents


def forced_codes(scaled: torch.Tensor, port: torch.Tensor | None, tally: ForcingTally | None) -> torch.Tensor:
    """The FP8 values to store for ``scaled`` (transformers' ``x / s`` in
    float32, clamped to the FP8 range): ``port``'s where it is their
    rounding or one FP8 step from it with ``scaled`` within the fp32 gate's
    reach of the boundary between the two, their rounding elsewhere."""
    own = scaled.to(_FP8).to(torch.float32)
    if tally is not None:
        tally.elements += own.numel()
    if port is None:
        return own
    same = port == own
    reach = FP32_REL_ERROR_TOLERANCE * torch.linalg.vector_norm(scaled, dim=-1, keepdim=True)
    at_boundary = (scaled - (port + own) / 2).abs() <= reach
    taken = same | (_one_step_apart(port, own) & at_boundary)
    if tally is not None:
        tally.rounded_apart += int((taken & ~same).sum())
        tally.differing += int((~taken).sum())
    return torch.where(taken, port, own)


def column_order(port: torch.Tensor, scaled: torch.Tensor) -> torch.Tensor | None:
    """Which of the port's head-dim columns holds each of transformers'
    (``[..., head_dim]`` both; the port's column that most often stores
    transformers' rounding of it), when that is a permutation other than the
    identity: a port may store K with its columns reordered (a partial
    RoPE's pairs moved to where the kernel's full-width rotate-half pairs
    columns), which leaves every dot product as it is. None otherwise."""
    width = port.shape[-1]
    own = scaled.to(_FP8).to(torch.float32).reshape(-1, width)
    matches = (port.reshape(-1, width).unsqueeze(2) == own.unsqueeze(1)).sum(0)  # [port, own]
    order = matches.argmax(0)
    identity = torch.arange(width)
    if torch.equal(order, identity) or not torch.equal(order.sort().values, identity):
        return None
    return order


def _one_step_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Whether two FP8 values are neighbours on the grid (no FP8 value between them)."""
    return (_ordinal(a) - _ordinal(b)).abs() == 1


def _ordinal(values: torch.Tensor) -> torch.Tensor:
    """Each FP8 value's signed position on the grid (``+0`` and ``-0`` both 0)."""
    bits = values.to(_FP8).view(torch.uint8).to(torch.int32)
    magnitude = bits & 0x7F
    return torch.where(bits >= 0x80, -magnitude, magnitude)
