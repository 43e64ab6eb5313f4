"""vLLM's scheduled tokens as the port's calls (serve/calls.py)."""

from __future__ import annotations

import torch

from autoport_cst.serve.calls import CacheLayout, Piece, Work, plain_rows, plan_calls, prefill_pieces

NAMES = ["layers.0.self_attn", "layers.1.self_attn"]
LAYOUT = CacheLayout(block_size=32, blocks_per_sequence=8, tp=1)


def _entry(call):
    return dict(call.inputs.metadata[NAMES[0]])


def test_prefill_from_zero_is_one_plain_call_padded_for_tp():
    assert prefill_pieces(0, 77, LAYOUT) == [Piece(0, 0, 77, 0)]
    assert plain_rows(77, 1) == 77
    assert plain_rows(5, 2) == 6
    assert plain_rows(2, 2) == 4  # more rows than ranks
    assert plain_rows(1, 1) == 2


def test_a_chunk_after_cached_tokens_starts_at_a_block_and_is_segmented():
    # a prefix-cache hit of 32 tokens, or a chunked prefill that stopped at 40
    assert prefill_pieces(32, 70, LAYOUT) == [Piece(32, 32, 70, 512)]
    assert prefill_pieces(40, 70, LAYOUT) == [Piece(32, 40, 70, 512)]
    assert prefill_pieces(40, 1100, LAYOUT) == [
        Piece(32, 40, 544, 512),
        Piece(544, 544, 1056, 512),
        Piece(1056, 1056, 1100, 512),
    ]


def test_segmented_call_metadata_rows_and_slots():
    tokens = list(range(100, 170))
    work = Work(request=0, token_ids=tokens, start=40, count=30, block_ids=([5, 9, 3],))
    (call,) = plan_calls([work], LAYOUT, [NAMES], set())
    entry = _entry(call)
    assert call.stage == "prefill" and call.owners == [0]
    assert entry["kv_segment_size"] == 512 and entry["max_query_len"] == 512
    assert entry["cached_seq_len"].tolist() == [[32]]
    assert call.inputs.input_ids[:38].tolist() == tokens[32:70]
    assert call.inputs.positions[:38].tolist() == list(range(32, 70))
    slots = entry["slot_mapping"].tolist()
    assert slots[:8] == [-1] * 8  # cached tokens recomputed as queries: their cache entries left alone
    assert slots[8:38] == [9 * 32 + p % 32 for p in range(40, 64)] + [3 * 32 + p % 32 for p in range(64, 70)]
    assert set(slots[38:]) == {-1}
    assert call.inputs.sampling_positions.tolist() == [37]
    assert entry["block_table_tensor"].tolist() == [[5, 9, 3, 0]]  # 128 slots: the context granule
    assert (call.rows, call.new_tokens) == (512, 30)


def test_single_token_requests_share_one_decode_call():
    works = [
        Work(0, list(range(10)), start=9, count=1, block_ids=([4],)),
        Work(1, list(range(50)), start=0, count=50, block_ids=([6, 7],)),
        Work(2, list(range(40)), start=39, count=1, block_ids=([2, 8],)),
    ]
    prefill, decode = plan_calls(works, LAYOUT, [NAMES], set())
    assert prefill.owners == [1] and _entry(prefill)["kv_segment_size"] == 0
    assert decode.stage == "decode" and decode.owners == [0, 2]
    entry = _entry(decode)
    assert entry["max_query_len"] == 1
    assert decode.inputs.input_ids.tolist() == [9, 39]
    assert decode.inputs.positions.tolist() == [9, 39]
    assert entry["slot_mapping"].tolist() == [4 * 32 + 9, 8 * 32 + 7]
    assert entry["host_num_computed_tokens"] == [9, 39]
    assert decode.inputs.sampling_positions.tolist() == [0, 1]
    assert entry["block_table_tensor"].tolist() == [[4, 0, 0, 0], [2, 8, 0, 0]]


def test_table_rows_grow_by_granules_up_to_max_model_len():
    long = Work(0, list(range(200)), 199, 1, (list(range(1, 8)),))
    assert LAYOUT.width([long]) == 8
    assert CacheLayout(block_size=32, blocks_per_sequence=6).width([long]) == 6
    assert CacheLayout(block_size=48, blocks_per_sequence=6).width([Work(0, [1], 0, 1, ([1],))]) == 6


def test_metadata_records_what_the_port_reads():
    reads: set[str] = set()
    (call,) = plan_calls([Work(0, [1, 2, 3], 0, 3, ([1],))], LAYOUT, [NAMES], reads)
    call.inputs.metadata[NAMES[1]].get("kv_segment_size")
    assert reads == {"kv_segment_size"}
    assert call.inputs.input_ids.dtype == torch.int64


def test_each_kv_cache_group_gets_its_own_tables_and_slots():
    # a sliding-window group and a full-attention group (vLLM's hybrid KV-cache manager):
    # the window's blocks that fell out are the null block 0 in the sliding group
    groups = [["layers.0.self_attn"], ["layers.1.self_attn"]]
    works = [
        Work(0, list(range(70)), start=64, count=6, block_ids=([0, 0, 7], [4, 5, 6])),
        Work(1, list(range(40)), start=39, count=1, block_ids=([0, 3], [8, 9])),
    ]
    prefill, decode = plan_calls(works, LAYOUT, groups, set())
    sliding, full = (dict(prefill.inputs.metadata[names[0]]) for names in groups)
    assert sliding["block_table_tensor"].tolist() == [[0, 0, 7, 0]]
    assert full["block_table_tensor"].tolist() == [[4, 5, 6, 0]]
    assert sliding["slot_mapping"][:6].tolist() == [7 * 32 + p % 32 for p in range(64, 70)]
    assert full["slot_mapping"][:6].tolist() == [6 * 32 + p % 32 for p in range(64, 70)]
    sliding, full = (dict(decode.inputs.metadata[names[0]]) for names in groups)
    assert sliding["slot_mapping"].tolist() == [3 * 32 + 7] and full["slot_mapping"].tolist() == [9 * 32 + 7]
    assert sliding["block_table_tensor"].tolist() == [[0, 3, 0, 0]]
