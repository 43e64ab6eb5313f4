"""vLLM's scheduled work of one step as the port's forward calls.

vLLM's scheduler hands the runner, per request, the tokens to compute this
step: positions ``[computed, computed + scheduled)`` of the request, whose
earlier positions are in the paged cache (computed by earlier steps, or a
prefix-cache hit, whose blocks another request filled). The port takes them
the way the vLLM Neuron runner hands them over (``validate.runner_metadata``):

- every request with one scheduled token is a row of one **decode** call
  (``max_query_len`` 1), whatever brought it there;
- a request with more tokens is a **prefill** of one sequence per call:
  from position 0 a plain prefill (``kv_segment_size`` 0), padded to a
  multiple of the TP size above it (sequence-parallel prefill needs it);
  after cached tokens a **segmented** prefill (``kv_segment_size`` 512)
  padded to 512 rows, its start moved back to a block boundary (the
  segmented kernel takes a block-aligned ``prior_tokens``): the rows moved
  back over are cached tokens recomputed as queries, with slot -1 so their
  cache entries are left as they are. A chunk longer than a segment takes
  several calls.

Each call samples the last computed row of each of its sequences;
``PortCall.owners`` names the request of each sampled row.

Layers that form several KV-cache groups (sliding-window and full-attention
layers under vLLM's hybrid KV-cache manager, whose groups hold block ids of
their own) get each layer's block table and slots from its group's blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from autoport_cst.validate.runner_metadata import PAD_SLOT, RecordingEntry, StepInputs, build_metadata

KV_SEGMENT_SIZE = 512
CONTEXT_GRANULE = 128


@dataclass(frozen=True)
class Work:
    """One request's tokens this step: positions ``[start, start + count)``."""

    request: int  # the request's row in the step's sampling batch
    token_ids: list[int]  # the request's tokens known so far (prompt, then outputs)
    start: int
    count: int
    block_ids: tuple[list[int], ...]  # the request's blocks in each KV-cache group

    @property
    def end(self) -> int:
        return self.start + self.count


@dataclass(frozen=True)
class CacheLayout:
    block_size: int
    blocks_per_sequence: int  # width of a block-table row
    tp: int = 1
    segment: int = KV_SEGMENT_SIZE

    def width(self, works: list[Work]) -> int:
        """Blocks per table row of a call: its longest sequence's context
        rounded up to a multiple of 128 slots (the decode kernels' context
        granule), at most a row of ``max_model_len``."""
        if CONTEXT_GRANULE % self.block_size:
            return self.blocks_per_sequence
        granules = -(-max(len(work.block_ids[0]) for work in works) * self.block_size // CONTEXT_GRANULE)
        return min(self.blocks_per_sequence, granules * CONTEXT_GRANULE // self.block_size)

    def table(self, block_ids: list[int], width: int) -> tuple[int, ...]:
        """A block-table row: the request's blocks, then the null block 0."""
        if len(block_ids) > width:
            raise ValueError(f"{len(block_ids)} blocks exceed a row of {width}")
        return tuple(block_ids) + (0,) * (width - len(block_ids))

    def slot(self, block_ids: list[int], position: int) -> int:
        return block_ids[position // self.block_size] * self.block_size + position % self.block_size


@dataclass(frozen=True)
class Piece:
    """One prefill call of a request: rows for positions ``[first, end)``, of
    which ``[new, end)`` are this step's tokens; ``segment`` 0 is a plain
    prefill."""

    first: int
    new: int
    end: int
    segment: int


@dataclass
class PortCall:
    stage: str  # "prefill" or "decode"
    inputs: StepInputs
    owners: list[int]  # the request of each sampled row
    rows: int = 0  # rows the call computes, padding included
    new_tokens: int = 0  # this step's tokens among them


def prefill_pieces(start: int, end: int, layout: CacheLayout) -> list[Piece]:
    """The calls that compute positions ``[start, end)`` of one sequence."""
    if start == 0:
        return [Piece(0, 0, end, 0)]
    pieces, first = [], start - start % layout.block_size
    while first < end:
        last = min(first + layout.segment, end)
        pieces.append(Piece(first, max(first, start), last, layout.segment))
        first = last
    return pieces


def plain_rows(tokens: int, tp: int) -> int:
    """Rows of a plain prefill: a multiple of ``tp`` above ``tp``."""
    rows = -(-tokens // tp) * tp
    return rows if rows > tp else 2 * tp


Groups = Sequence[Sequence[str]]  # the layer names of each KV-cache group


def _prefill_call(work: Work, piece: Piece, layout: CacheLayout, groups: Groups, reads: set[str]) -> PortCall:
    real = piece.end - piece.first
    rows = layout.segment if piece.segment else plain_rows(real, layout.tp)
    padding = rows - real
    positions = list(range(piece.first, piece.end))
    metadata: dict[str, RecordingEntry] = {}
    for names, blocks in zip(groups, work.block_ids, strict=True):
        slots = [PAD_SLOT if p < piece.new else layout.slot(blocks, p) for p in positions]
        metadata |= build_metadata(
            list(names),
            reads,
            max_query_len=rows,
            slots=slots + [PAD_SLOT] * padding,
            tables=[layout.table(blocks, layout.width([work]))],
            block_size=layout.block_size,
            cached=[piece.first],
            kv_segment_size=piece.segment,
        )
    inputs = StepInputs(
        input_ids=torch.tensor(work.token_ids[piece.first : piece.end] + [0] * padding, dtype=torch.int64),
        positions=torch.tensor(positions + [0] * padding, dtype=torch.int64),
        sampling_positions=torch.tensor([real - 1], dtype=torch.int64),
        metadata=metadata,
    )
    return PortCall("prefill", inputs, [work.request], rows, piece.end - piece.new)


def _decode_call(works: list[Work], layout: CacheLayout, groups: Groups, reads: set[str]) -> PortCall:
    positions = [work.start for work in works]
    width = layout.width(works)
    metadata: dict[str, RecordingEntry] = {}
    for group, names in enumerate(groups):
        metadata |= build_metadata(
            list(names),
            reads,
            max_query_len=1,
            slots=[layout.slot(work.block_ids[group], work.start) for work in works],
            tables=[layout.table(work.block_ids[group], width) for work in works],
            block_size=layout.block_size,
            cached=positions,
            kv_segment_size=0,
        )
    inputs = StepInputs(
        input_ids=torch.tensor([work.token_ids[work.start] for work in works], dtype=torch.int64),
        positions=torch.tensor(positions, dtype=torch.int64),
        sampling_positions=torch.arange(len(works), dtype=torch.int64),
        metadata=metadata,
    )
    return PortCall("decode", inputs, [work.request for work in works], len(works), len(works))


def plan_calls(works: list[Work], layout: CacheLayout, groups: Groups, reads: set[str]) -> list[PortCall]:
    """The step's calls: the prefills, request by request, then one decode
    call for every single-token request."""
    calls = []
    for work in works:
        if work.count > 1:
            for piece in prefill_pieces(work.start, work.end, layout):
                calls.append(_prefill_call(work, piece, layout, groups, reads))
    decoding = [work for work in works if work.count == 1]
    if decoding:
        calls.append(_decode_call(decoding, layout, groups, reads))
    return calls
