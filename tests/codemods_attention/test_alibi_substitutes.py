"""ALiBi in the op-by-op attention substitutes (alibi-positions): the slopes
the port computes against transformers' own builders (MPT's
``build_mpt_alibi_tensor`` with its ``alibi_bias_max``, BLOOM's
``_get_alibi_slopes``), for head counts that are powers of two and others, and
their TP split; whole prefill against transformers' score formulas (MPT:
scores * scale + bias; BLOOM: baddbmm(alibi, q, k^T, alpha=scale); Falcon-RW:
(scores + alibi) * scale); chunked prefill and one- and two-token decode
(masked and bounded-gather) against the whole prefill of the same tokens."""

from __future__ import annotations

import math

import pytest
import torch
from autoport_cst.codemods import alibi_positions
from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

from autoport_cst.transform.edit import kernels
from autoport_cst.validate.standin import functional as NF


def _functions(*sources: str) -> dict:
    scope = {"torch": torch, "math": math, "NF": NF}
    for source in sources:
        exec(compile(source, "<substitute>", "exec"), scope)  # noqa: S102 - our own generated code
    return scope


FNS = _functions(
    alibi_positions.SLOPES,
    kernels.ALIBI_BIAS,
    kernels.PREFILL_UNFUSED,
    kernels.SEGMENTED_UNFUSED,
    kernels.SOFTMAX_ATTENTION,
    kernels.DECODE_UNFUSED,
)
_SLOPES, FLASH, SEGMENTED, DECODE = (
    FNS[n]
    for n in (
        "_alibi_slopes",
        "_flash_attention_unfused",
        "_segmented_attention_unfused",
        "_attention_decode_unfused",
    )
)


def SLOPES(heads, bias_max, first, count, scale=1.0):  # noqa: N802 - the port's function, as a constant
    return _SLOPES((heads, bias_max, first, count, scale), torch.empty(0))


@pytest.mark.parametrize("heads", [1, 2, 4, 5, 6, 8, 12, 16, 20, 32, 40, 71])
@pytest.mark.parametrize("bias_max", [8, 5, 16])
def test_slopes_are_mpts(heads, bias_max):
    expected = -build_mpt_alibi_tensor(heads, 2, alibi_bias_max=bias_max)[:, 0, 0]  # position -1
    assert torch.equal(SLOPES(heads, float(bias_max), 0, heads), expected)


@pytest.mark.parametrize("heads", [1, 3, 4, 6, 12, 20, 71, 112])
def test_slopes_are_blooms_with_bias_max_8(heads):
    """BLOOM's pow(base, k) against MPT's 1 / 2 ** x: the same slopes to a few
    float32 ulps (measured: 3e-7 relative at 20 heads, 5.2e-7 at 112; its powers round more)."""
    torch.testing.assert_close(
        SLOPES(heads, 8.0, 0, heads), _get_alibi_slopes(heads, "cpu"), rtol=1e-6, atol=0
    )


@pytest.mark.parametrize("heads, ranks", [(6, 2), (6, 3), (12, 4), (20, 2)])
def test_each_rank_keeps_the_slopes_of_its_own_heads(heads, ranks):
    per_rank = heads // ranks
    shards = [SLOPES(heads, 8.0, rank * per_rank, per_rank) for rank in range(ranks)]
    assert all(s.shape == (per_rank,) for s in shards)
    assert torch.equal(torch.cat(shards), SLOPES(heads, 8.0, 0, heads))


def _qkv(heads=6, kv_heads=6, tokens=9, d=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, tokens, d, generator=generator)
    k = torch.randn(kv_heads, tokens, d, generator=generator)
    v = torch.randn(kv_heads, tokens, d, generator=generator)
    return q, k, v


def _softmax_out(scores, v):
    tokens = scores.shape[-1]
    causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    probs = torch.softmax(scores.masked_fill(~causal, torch.finfo(scores.dtype).min), dim=-1)
    return probs @ v


@pytest.mark.parametrize("kv_heads", [6, 2, 1])
def test_prefill_matches_mpts_scores(kv_heads):
    """MPT: q k^T * softmax_scale + build_mpt_alibi_tensor's bias (the last
    ``tokens`` columns of its max_seq_len row)."""
    heads, tokens, scale = 6, 9, 0.3
    q, k, v = _qkv(heads, kv_heads, tokens)
    k_all, v_all = (t.repeat_interleave(heads // kv_heads, dim=0) for t in (k, v))
    bias = build_mpt_alibi_tensor(heads, 32)[:, :, -tokens:]
    expected = _softmax_out(q @ k_all.transpose(-1, -2) * scale + bias, v_all)
    slopes = SLOPES(heads, 8.0, 0, heads)
    actual = FLASH(q, k.transpose(1, 2), v, scale=scale, alibi_slopes=slopes, tp_q=True, tp_out=False)
    torch.testing.assert_close(actual, expected)
    plain = FLASH(q, k.transpose(1, 2), v, scale=scale, tp_q=True, tp_out=False)
    assert not torch.allclose(plain, expected, atol=1e-3)


def test_prefill_matches_blooms_and_falcon_rws_scores():
    heads, tokens = 5, 9
    q, k, v = _qkv(heads, heads, tokens, seed=1)
    scale = q.shape[-1] ** -0.5
    alibi = _get_alibi_slopes(heads, "cpu")[:, None, None] * torch.arange(tokens)  # [heads, 1, tokens]
    bloom = _softmax_out(
        torch.baddbmm(alibi.expand(heads, tokens, tokens), q, k.transpose(-1, -2), alpha=scale), v
    )
    falcon = _softmax_out((q @ k.transpose(-1, -2) + alibi) * scale, v)
    for scaled, expected in ((1.0, bloom), (scale, falcon)):
        slopes = SLOPES(heads, 8.0, 0, heads, scaled)
        actual = FLASH(q, k.transpose(1, 2), v, scale=scale, alibi_slopes=slopes)
        torch.testing.assert_close(actual, expected)


def test_chunked_prefill_matches_the_whole_prefill():
    """A chunk of 5 tokens after 12 cached ones (cache blocks out of order)."""
    heads, kv_heads, d, prior, chunk, block = 6, 2, 8, 12, 5, 4
    q, k, v = _qkv(heads, kv_heads, prior + chunk, d, seed=2)
    slopes = SLOPES(heads, 8.0, 0, heads)
    whole = FLASH(q, k.transpose(1, 2), v, scale=0.4, alibi_slopes=slopes)
    blocks = (prior + chunk + block - 1) // block
    table = torch.tensor([[5, 1, 7, 3, 0]])[:, :blocks]
    caches = [torch.zeros(8, kv_heads, block, d) for _ in range(2)]
    for cache, rows in zip(caches, (k, v), strict=True):
        for position in range(prior + chunk):
            cache[table[0, position // block], :, position % block] = rows[:, position]
    actual = SEGMENTED(
        q[:, prior:],
        caches[0],
        caches[1],
        table,
        torch.tensor([prior]),
        block,
        chunk,
        scale=0.4,
        alibi_slopes=slopes,
    )
    torch.testing.assert_close(actual, whole[:, prior:])


@pytest.mark.parametrize("new_tokens", [1, 2])
@pytest.mark.parametrize("bounded", [False, True])
def test_decode_matches_the_whole_prefill(new_tokens, bounded):
    """Two sequences (contexts of 70 and 37 tokens) decode their last
    ``new_tokens`` tokens: the output of each equals the whole prefill's row
    (no RoPE, as an ALiBi port calls the kernel: cos/sin None)."""
    generator = torch.Generator().manual_seed(3)
    heads, kv_heads, d, hidden, block, blocks = 4, 2, 8, 16, 32, 4
    lengths = (70, 37)
    w_qkv = torch.randn(hidden, (heads + 2 * kv_heads) * d, generator=generator) * 0.3
    x = [torch.randn(n, hidden, generator=generator) for n in lengths]
    slopes = SLOPES(heads, 8.0, 0, heads)
    table = torch.tensor([[4, 2, 6, 8], [1, 3, 5, 7]], dtype=torch.int32)
    caches = [torch.zeros(1 + 2 * blocks, kv_heads, block, d) for _ in range(2)]
    expected = []
    for b, (n, rows) in enumerate(zip(lengths, x, strict=True)):
        qkv = rows @ w_qkv
        q = qkv[:, : heads * d].reshape(n, heads, d).transpose(0, 1)
        k = qkv[:, heads * d : (heads + kv_heads) * d].reshape(n, kv_heads, d).transpose(0, 1)
        v = qkv[:, (heads + kv_heads) * d :].reshape(n, kv_heads, d).transpose(0, 1)
        expected.append(FLASH(q, k.transpose(1, 2), v, scale=0.35, alibi_slopes=slopes)[:, n - new_tokens :])
        for position in range(n - new_tokens):  # the prior tokens in the cache
            for cache, new in zip(caches, (k, v), strict=True):
                cache[table[b, position // block], :, position % block] = new[:, position]
    positions = torch.tensor([[n - new_tokens + i for i in range(new_tokens)] for n in lengths])
    slots = torch.stack([table[b, positions[b] // block] * block + positions[b] % block for b in range(2)])
    kwargs = {
        "X": torch.stack([rows[-new_tokens:] for rows in x]),
        "W_qkv": w_qkv,
        "active_blocks_table": table,
        "K_cache": caches[0],
        "V_cache": caches[1],
        "softmax_scale": 0.35,
        "update_cache": True,
        "kv_cache_update_idx": slots.to(torch.uint32),
        "W_out": None,
        "alibi_slopes": slopes,
    }
    pos_ids = positions.reshape(1, -1).float()
    if bounded:
        kwargs.update(pos_ids=pos_ids, max_context_len=(positions.max() + 1).reshape(1).to(torch.int32))
    else:
        mask = NF.gen_attention_decode_mask(
            pos_ids=pos_ids, bs=2, q_head=heads, s_active=new_tokens, s_prior=blocks * block, block_len=block
        )
        kwargs.update(attention_mask=mask, alibi_positions=positions.reshape(-1))
    output = DECODE(**kwargs)  # [B, Nq, Dh, S]
    for b in range(2):
        torch.testing.assert_close(output[b].transpose(1, 2), expected[b])


def test_decode_without_the_step_positions_refuses():
    """Masked decode given no alibi_positions (nor pos_ids): refused, not
    biased from a guessed position."""
    heads, d, block = 2, 4, 128
    mask = NF.gen_attention_decode_mask(
        pos_ids=torch.tensor([[3.0]]), bs=1, q_head=heads, s_active=1, s_prior=block, block_len=block
    )
    with pytest.raises(ValueError, match="positions of the step's tokens"):
        _decode(heads, d, block, mask)


def _decode(heads, d, block, mask):
    DECODE(
        X=torch.randn(1, 1, 8),
        W_qkv=torch.randn(8, 3 * heads * d),
        active_blocks_table=torch.tensor([[1]], dtype=torch.int32),
        K_cache=torch.zeros(2, heads, block, d),
        V_cache=torch.zeros(2, heads, block, d),
        attention_mask=mask,
        kv_cache_update_idx=torch.tensor([[7]], dtype=torch.uint32),
        update_cache=True,
        alibi_slopes=SLOPES(heads, 8.0, 0, heads),
    )
