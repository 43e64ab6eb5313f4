"""The stand-in's multi-latent attention kernels against plain torch: the
absorbed decode over a paged latent cache equals the expanded attention
(K and V rebuilt from the latents), ``mla_absorb`` is a per-head matmul,
and what the stand-in does not model is refused by name."""

from __future__ import annotations

import pytest
import torch

from autoport_cst.validate.standin import kernel_phases
from autoport_cst.validate.standin.kernel_options import UnsupportedKernelOption
from autoport_cst.validate.standin.mla import mla_absorb, mla_decode_attention
from autoport_cst.validate.standin.numerics import KernelConstraintError

HEADS, NOPE, ROPE, V_DIM, RANK, BLOCK = 3, 8, 4, 6, 10, 4


def _weights(generator):
    w_uk = torch.randn(HEADS, NOPE, RANK, generator=generator, dtype=torch.float64)
    w_uv = torch.randn(HEADS, V_DIM, RANK, generator=generator, dtype=torch.float64)
    return w_uk, w_uv


def _paged(latents, k_rope, lengths, generator):
    """A shuffled paged cache holding each sequence's rows, and its block table."""
    blocks_per_seq = max(-(-n // BLOCK) for n in lengths) + 1
    order = torch.randperm(len(lengths) * blocks_per_seq, generator=generator) + 1
    table = order.view(len(lengths), blocks_per_seq).to(torch.int32)
    cache = torch.zeros(len(lengths) * blocks_per_seq + 2, 1, BLOCK, RANK + ROPE, dtype=torch.float64)
    for b, n in enumerate(lengths):
        for p in range(n):
            cache[table[b, p // BLOCK], 0, p % BLOCK] = torch.cat((latents[b][p], k_rope[b][p]))
    return cache, table


def _expanded(q_nope, q_rope, latents, k_rope, w_uk, w_uv, scale):
    """Plain MLA for one query over n tokens: K = [W_UK c, k_rope], V = W_UV c."""
    k_nope = torch.einsum("hdr,tr->htd", w_uk, latents)
    keys = torch.cat((k_nope, k_rope.unsqueeze(0).expand(HEADS, -1, -1)), dim=-1)
    values = torch.einsum("hvr,tr->htv", w_uv, latents)
    query = torch.cat((q_nope, q_rope), dim=-1)
    probs = torch.softmax(torch.einsum("hd,htd->ht", query, keys) * scale, dim=-1)
    return torch.einsum("ht,htv->hv", probs, values)


def test_absorbed_decode_equals_expanded_attention():
    generator = torch.Generator().manual_seed(0)
    lengths = [5, 9, 1]
    latents = [torch.randn(n, RANK, generator=generator, dtype=torch.float64) for n in lengths]
    k_rope = [torch.randn(n, ROPE, generator=generator, dtype=torch.float64) for n in lengths]
    cache, table = _paged(latents, k_rope, lengths, generator)
    w_uk, w_uv = _weights(generator)
    q_nope = torch.randn(len(lengths), HEADS, NOPE, generator=generator, dtype=torch.float64)
    q_rope = torch.randn(len(lengths), HEADS, ROPE, generator=generator, dtype=torch.float64)
    scale = (NOPE + ROPE) ** -0.5

    q_latent = mla_absorb(q_nope, w_uk)
    out = mla_decode_attention(
        torch.cat((q_latent, q_rope), dim=-1),
        cache,
        None,
        scale,
        None,
        positions=torch.tensor(lengths) - 1,
        compress_ratio=1,
        latent_block_table=table,
        nope_dim=RANK,
        rope_dim=ROPE,
        out_dtype=torch.float64,
    )
    assert out.shape == (len(lengths), HEADS, RANK + ROPE)
    absorbed = mla_absorb(out[..., :RANK], w_uv.transpose(1, 2))
    for b in range(len(lengths)):
        expected = _expanded(q_nope[b], q_rope[b], latents[b], k_rope[b], w_uk, w_uv, scale)
        # the kernels accumulate in float32, as the device does: float32 tolerances
        torch.testing.assert_close(absorbed[b], expected, rtol=1e-5, atol=1e-6)


def test_decode_sees_only_tokens_up_to_its_position():
    generator = torch.Generator().manual_seed(1)
    latents = [torch.randn(8, RANK, generator=generator, dtype=torch.float64)]
    k_rope = [torch.randn(8, ROPE, generator=generator, dtype=torch.float64)]
    cache, table = _paged(latents, k_rope, [8], generator)
    q = torch.randn(1, HEADS, RANK + ROPE, generator=generator, dtype=torch.float64)
    common = dict(
        compress_ratio=1, latent_block_table=table, nope_dim=RANK, rope_dim=ROPE, out_dtype=torch.float64
    )
    at_3 = mla_decode_attention(q, cache, None, 0.3, None, positions=torch.tensor([3]), **common)
    cache[table[0, 1], 0, :] += 100.0  # tokens 4..7 change
    again = mla_decode_attention(q, cache, None, 0.3, None, positions=torch.tensor([3]), **common)
    torch.testing.assert_close(at_3, again)
    later = mla_decode_attention(q, cache, None, 0.3, None, positions=torch.tensor([7]), **common)
    assert not torch.allclose(at_3, later)


def test_absorb_is_a_per_head_matmul_in_the_input_dtype():
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(5, HEADS, NOPE, generator=generator).to(torch.bfloat16)
    w = torch.randn(HEADS, NOPE, RANK, generator=generator)
    out = mla_absorb(x, w)
    assert out.dtype == torch.bfloat16
    for h in range(HEADS):
        expected = (x[:, h].to(torch.float32) @ w[h]).to(torch.bfloat16)
        torch.testing.assert_close(out[:, h], expected)
    with pytest.raises(KernelConstraintError, match="contraction"):
        mla_absorb(x, w.transpose(1, 2))


def test_what_the_stand_in_does_not_model_is_refused_by_name():
    cache = torch.zeros(4, 1, BLOCK, RANK + ROPE)
    table = torch.tensor([[1, 2]], dtype=torch.int32)
    q = torch.zeros(1, HEADS, RANK + ROPE)
    common = dict(positions=torch.tensor([2]), latent_block_table=table, nope_dim=RANK, rope_dim=ROPE)
    with pytest.raises(UnsupportedKernelOption, match="topk_indices"):
        mla_decode_attention(q, cache, None, 1.0, None, topk_indices=torch.zeros(1, 2), **common)
    with pytest.raises(KernelConstraintError, match="swa_cache"):
        mla_decode_attention(q, cache, cache, 1.0, None, **common)
    with pytest.raises(KernelConstraintError, match="int32"):
        mla_decode_attention(q, cache, None, 1.0, None, **{**common, "latent_block_table": table.long()})
    with pytest.raises(KernelConstraintError, match=r"\[num_blocks, 1, block_size, width\]"):
        mla_decode_attention(q, cache.expand(4, 2, BLOCK, RANK + ROPE), None, 1.0, None, **common)


def test_decode_kernel_is_refused_in_prefill():
    cache = torch.zeros(4, 1, BLOCK, RANK + ROPE)
    table = torch.tensor([[1, 2]], dtype=torch.int32)
    q = torch.zeros(1, HEADS, RANK + ROPE)
    with (
        kernel_phases.phase("prefill"),
        pytest.raises(kernel_phases.KernelPhaseError, match="mla_decode_attention"),
    ):
        mla_decode_attention(
            q,
            cache,
            None,
            1.0,
            None,
            positions=torch.tensor([2]),
            latent_block_table=table,
            nope_dim=RANK,
            rope_dim=ROPE,
        )
