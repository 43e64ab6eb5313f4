"""The chunked-attention codemod's run-time helper (``_PrefillChunks``, the
source the codemod adds to a port) against a block-diagonal causal mask
computed directly: flash attention folded by chunk, and segmented prefill
split per chunk over a paged cache, with the stand-in kernels. Without the
chunks (size None) the same calls attend across chunks and differ."""

from __future__ import annotations

import pytest
import torch

from autoport_cst.validate.standin.prefill_attention import flash_attention, segmented_attention
from codemods.chunked_attention import HELPER_CLASS

NAMESPACE: dict = {"torch": torch}
exec(compile(HELPER_CLASS, "chunked_attention.HELPER_CLASS", "exec"), NAMESPACE)  # noqa: S102
Chunks = NAMESPACE["_PrefillChunks"]


def chunked_reference(q, k, v, chunk, first=0):
    """[H, T, D] queries at positions first.., keys/values [H, S, D] at 0..: the block-diagonal causal mask."""
    q_pos = torch.arange(q.shape[1]).unsqueeze(1) + first
    k_pos = torch.arange(k.shape[1]).unsqueeze(0)
    visible = (k_pos <= q_pos) & (k_pos >= torch.div(q_pos, chunk, rounding_mode="floor") * chunk)
    scores = (q @ k.transpose(1, 2)) * q.shape[-1] ** -0.5
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v


@pytest.mark.parametrize("rows, chunk", [(20, 12), (7, 12), (31, 5)])
def test_flash_folded_by_chunk_is_the_chunked_mask(rows, chunk):
    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    q = torch.randn(heads, rows, dim)
    k, v = torch.randn(kv_heads, rows, dim), torch.randn(kv_heads, rows, dim)
    chunks = Chunks(chunk)
    # the reference's call shape: q and k [B, D, S] (tp_q=False, tp_k=False), output [B, D, S]
    out = chunks.unfold(
        flash_attention(
            chunks.fold(q.transpose(1, 2), 2),
            chunks.fold(k.transpose(1, 2), 2),
            chunks.fold(v, 1),
            tp_q=False,
            tp_out=True,
        ),
        2,
    )
    groups = heads // kv_heads
    expected = chunked_reference(q, k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0), chunk)
    torch.testing.assert_close(out.transpose(1, 2), expected, rtol=1e-5, atol=1e-5)
    if rows > chunk:  # unchunked, the same call attends across chunks
        plain = flash_attention(q.transpose(1, 2), k.transpose(1, 2), v, tp_q=False, tp_out=True)
        assert not torch.allclose(plain.transpose(1, 2), expected, atol=1e-3)


@pytest.mark.parametrize("prior, tokens, chunk", [(0, 32, 12), (32, 16, 12)])
def test_segmented_split_by_chunk_is_the_chunked_mask(prior, tokens, chunk):
    torch.manual_seed(1)
    heads, dim, block, segment = 2, 8, 4, 512
    total = prior + tokens
    blocks = -(-total // block) + 2
    table = torch.randperm(blocks + 1)[:blocks] + 1  # shuffled, block 0 unused
    k_all, v_all = torch.randn(heads, total, dim), torch.randn(heads, total, dim)
    k_cache = torch.zeros(blocks + 2, heads, block, dim)
    v_cache = torch.zeros_like(k_cache)
    for p in range(total):
        k_cache[table[p // block], :, p % block] = k_all[:, p]
        v_cache[table[p // block], :, p % block] = v_all[:, p]
    q = torch.zeros(heads, segment, dim)
    q[:, :tokens] = torch.randn(heads, tokens, dim)
    tables = table.view(1, -1)

    def call(size):
        chunks = Chunks(size)
        return chunks.merge(
            [
                segmented_attention(
                    chunks.queries(q, s, 1),
                    k_cache,
                    v_cache,
                    block_tables=chunks.block_table(tables, s),
                    prior_tokens=chunks.prior_tokens(prior, s),
                    block_size=block,
                    kv_segment_size=segment,
                    tp_q=True,
                    tp_out=True,
                )
                for s in chunks.segments(prior, block, segment)
            ],
            2,
        )

    out = call(chunk)[:, :, :tokens].transpose(1, 2)
    expected = chunked_reference(q[:, :tokens], k_all, v_all, chunk, first=prior)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    plain = call(None)[:, :, :tokens].transpose(1, 2)
    assert not torch.allclose(plain, expected, atol=1e-3)


def test_segmented_chunks_of_partial_blocks_refuse():
    with pytest.raises(NotImplementedError, match="whole KV-cache blocks"):
        Chunks(6).segments(0, 4, 512)
