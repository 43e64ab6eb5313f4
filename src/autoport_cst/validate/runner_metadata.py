"""The attention metadata the vLLM Neuron runner hands a model, one entry
per attention layer name (``"layers.{i}.self_attn"``), and the inputs of
each forward call.

Every entry holds the keys the runner passes:

| key | value |
|---|---|
| ``max_query_len`` | rows per sequence in the call (the padded chunk in segmented prefill, 1 in decode) |
| ``decode_token_threshold`` | 1 (the new tokens per sequence of a speculative decode step with speculation): more rows than that is a prefill |
| ``slot_mapping`` | int64 ``[T]``, ``block * block_size + offset`` per row; -1 for padding rows |
| ``block_size``, ``max_blocks_per_seq`` | the paged layout |
| ``block_table_tensor``, ``full_block_table_tensor`` | int32 ``[B, blocks_per_seq]`` |
| ``host_block_table`` | the same table as host lists |
| ``cached_seq_len`` | int32 ``[[n]]``: the most tokens any sequence of the call has cached; per sequence (``[B, 1]``) in decode under decode context parallelism, whose mask needs each sequence's share |
| ``host_num_computed_tokens`` | per sequence, the tokens already cached |
| ``kv_segment_size`` | the segment size of segmented prefill, 0 otherwise |

Entries are ``RecordingEntry`` dictionaries: they remember which keys the
model read, which tells whether a port implements segmented prefill (it
reads ``kv_segment_size``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

DECODE_TOKEN_THRESHOLD = 1
PAD_SLOT = -1


class RecordingEntry(dict):
    """A metadata entry that records the keys read from it."""

    def __init__(self, values: dict[str, Any], reads: set[str]) -> None:
        super().__init__(values)
        self.reads = reads

    def __getitem__(self, key: str) -> Any:
        self.reads.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.reads.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.reads.add(key)
        return super().__contains__(key)


@dataclass
class StepInputs:
    """The model inputs of one forward call."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    sampling_positions: torch.Tensor
    metadata: dict[str, RecordingEntry]
    # prompt embeddings (``Scenario.prompt_embeds``): rows ``[T, H]`` and the mask of token rows
    inputs_embeds: torch.Tensor | None = None
    is_token_ids: torch.Tensor | None = None


def build_metadata(
    layer_names: list[str],
    reads: set[str],
    *,
    max_query_len: int,
    slots: list[int],
    tables: list[tuple[int, ...]],
    block_size: int,
    cached: list[int],
    kv_segment_size: int,
    cached_per_sequence: bool = False,
    decode_token_threshold: int = DECODE_TOKEN_THRESHOLD,
) -> dict[str, RecordingEntry]:
    """One entry per layer (see the module docstring)."""
    table = torch.tensor(tables, dtype=torch.int32)
    if cached_per_sequence:
        cached_seq_len = torch.tensor([[n] for n in cached], dtype=torch.int32)
    else:
        cached_seq_len = torch.tensor([[max(cached)]], dtype=torch.int32)
    values = {
        "max_query_len": max_query_len,
        "decode_token_threshold": decode_token_threshold,
        "slot_mapping": torch.tensor(slots, dtype=torch.int64),
        "block_size": block_size,
        "block_table_tensor": table,
        "full_block_table_tensor": table.clone(),
        "host_block_table": [list(row) for row in tables],
        "max_blocks_per_seq": table.shape[1],
        "cached_seq_len": cached_seq_len,
        "host_num_computed_tokens": list(cached),
        "kv_segment_size": kv_segment_size,
    }
    return {name: RecordingEntry(values, reads) for name in layer_names}
