"""The stand-in's attention kernels against naive torch computations:
segmented prefill with prior tokens, fused RoPE and the in-kernel cache write
of qkv_proj, 3-D caches, the bounded-gather decode, the FP8 KV-cache
emulation, and the options the stand-in refuses by name."""

from __future__ import annotations

import math

import pytest
import torch

from autoport_cst.validate.standin import functional as NF
from autoport_cst.validate.standin.common_types import NormType, QuantizationType
from autoport_cst.validate.standin.decode_attention import swizzle_packed_k, unswizzle_packed_k
from autoport_cst.validate.standin.dtype_utils import FP8_CLAMP_MAX
from autoport_cst.validate.standin.kernel_options import KernelArgumentError, UnsupportedKernelOption

D, BLOCK = 8, 4


def naive_attention(q, k, v, scale, visible, sink=None):
    """softmax(scale q k^T | visible [, sink column]) v in float64."""
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        scores = torch.cat((scores, sink.double().reshape(-1, 1, 1).expand(*scores.shape[:-1], 1)), dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sink is not None:
        probs = probs[..., :-1]
    return probs @ v.double()


def rope(x, positions, base=10000.0):
    """Rotate-half RoPE of ``x [..., T, D]`` at ``positions``."""
    inv = 1.0 / base ** (torch.arange(0, x.shape[-1], 2, dtype=torch.float64) / x.shape[-1])
    freqs = positions.double()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * emb.cos() + rotated * emb.sin(), emb.cos(), emb.sin()


def paged(values: torch.Tensor, table: list[int], num_blocks: int) -> torch.Tensor:
    """``values [kv_heads, L, D]`` laid out in a paged cache at ``table``."""
    cache = torch.zeros(num_blocks, values.shape[0], BLOCK, values.shape[-1])
    for position in range(values.shape[1]):
        cache[table[position // BLOCK], :, position % BLOCK] = values[:, position]
    return cache


# -- segmented prefill -----------------------------------------------------------


@pytest.mark.parametrize("window, with_sink", [(None, False), (8, True)])
def test_segmented_attention_attends_to_prior_tokens(window, with_sink) -> None:
    torch.manual_seed(0)
    heads, kv_heads, prior, chunk, segment = 4, 2, 12, 5, 512
    total = prior + chunk
    k, v = torch.randn(kv_heads, total, D), torch.randn(kv_heads, total, D)
    table = [7, 2, 9, 4, 6, 1]
    k_cache, v_cache = paged(k, table, 10), paged(v, table, 10)
    q = torch.randn(heads, chunk, D)
    padded = torch.cat((q, torch.randn(heads, segment - chunk, D)), dim=1)
    sink = torch.randn(heads, 1) if with_sink else None
    out = NF.segmented_attention(
        padded,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=torch.tensor([table], dtype=torch.int32),
        prior_tokens=torch.tensor([[prior]], dtype=torch.int32),
        block_size=BLOCK,
        kv_segment_size=segment,
        scale=0.3,
        tp_q=True,
        tp_out=True,
        sliding_window=window,
        sink=sink,
    )
    assert out.shape == (heads, D, segment)
    q_pos = torch.arange(chunk)[:, None] + prior
    k_pos = torch.arange(total)[None, :]
    visible = k_pos <= q_pos
    if window:
        visible &= k_pos > q_pos - window
    groups = heads // kv_heads
    expected = naive_attention(
        q, k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0), 0.3, visible, sink
    )
    assert torch.allclose(out.transpose(1, 2)[:, :chunk].double(), expected, atol=1e-5)


def test_segmented_attention_keeps_the_kernel_constraints() -> None:
    q = torch.zeros(2, 100, D)
    cache = torch.zeros(4, 1, BLOCK, D)
    table = torch.tensor([[1, 2]], dtype=torch.int32)
    common = dict(k_cache=cache, v_cache=cache, block_tables=table, block_size=BLOCK)
    with pytest.raises(NF.KernelConstraintError, match="must equal kv_segment_size"):
        NF.segmented_attention(q, prior_tokens=0, kv_segment_size=512, **common)
    with pytest.raises(NF.KernelConstraintError, match="kv_segment_size=100 is not supported"):
        NF.segmented_attention(q, prior_tokens=0, kv_segment_size=100, **common)
    with pytest.raises(NF.KernelConstraintError, match="multiple of block_size"):
        NF.segmented_attention(torch.zeros(2, 512, D), prior_tokens=3, kv_segment_size=512, **common)
    with pytest.raises(NF.KernelConstraintError, match="non-packed FP8"):
        fp8 = cache.to(torch.float8_e4m3fn)
        NF.segmented_attention(
            torch.zeros(2, 512, D),
            k_cache=fp8,
            v_cache=fp8,
            block_tables=table,
            block_size=BLOCK,
            prior_tokens=0,
            kv_segment_size=512,
        )


# -- qkv_proj ----------------------------------------------------------------------


def test_qkv_proj_fused_rope_and_qk_norm_match_a_naive_computation() -> None:
    torch.manual_seed(1)
    q_heads, kv_heads, tokens, hidden = 4, 2, 6, 16
    x = torch.randn(1, tokens, hidden)
    w = torch.randn(hidden, (q_heads + 2 * kv_heads) * D)
    gamma = torch.rand(D) + 0.5
    positions = torch.arange(3, 3 + tokens)
    _, cos, sin = rope(torch.zeros(tokens, D), positions)
    out = NF.qkv_proj(
        x,
        w,
        d_head=D,
        cos_cache=cos.float().unsqueeze(0),
        sin_cache=sin.float().unsqueeze(0),
        num_q_heads=q_heads,
        num_kv_heads=kv_heads,
        qk_norm_pre_rope_q_norm=NormType.RMS_NORM,
        qk_norm_pre_rope_k_norm=NormType.RMS_NORM,
        qk_norm_pre_rope_eps=1e-6,
        qk_norm_pre_rope_q_gamma=gamma.unsqueeze(0),
        qk_norm_pre_rope_k_gamma=gamma,
    )
    qkv = (x.double() @ w.double())[0].reshape(tokens, q_heads + 2 * kv_heads, D).transpose(0, 1)
    normed = qkv[: q_heads + kv_heads]
    normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma.double()
    rotated, _, _ = rope(normed, positions)
    expected = torch.cat((rotated, qkv[q_heads + kv_heads :])).transpose(0, 1).reshape(1, tokens, -1)
    assert torch.allclose(out.double(), expected, atol=1e-4)


def test_qkv_proj_use_block_kv_writes_the_rotated_kv_into_the_cache() -> None:
    torch.manual_seed(2)
    q_heads, kv_heads, tokens, hidden = 2, 1, 5, 8
    x, w = torch.randn(1, tokens, hidden), torch.randn(hidden, (q_heads + 2 * kv_heads) * D)
    cos, sin = torch.ones(1, tokens, D), torch.zeros(1, tokens, D)  # identity rotation
    k_cache, v_cache = torch.zeros(6, kv_heads, BLOCK, D), torch.zeros(6, kv_heads, BLOCK, D)
    slots = torch.tensor([9, 10, 11, 20, 0], dtype=torch.int32)
    q, k_out, v_out = NF.qkv_proj(
        x,
        w,
        d_head=D,
        cos_cache=cos,
        sin_cache=sin,
        num_q_heads=q_heads,
        num_kv_heads=kv_heads,
        k_cache=k_cache,
        v_cache=v_cache,
        use_block_kv=True,
        block_size=BLOCK,
        slot_mapping=slots.unsqueeze(0),
    )
    qkv = x[0] @ w
    assert k_out is k_cache and v_out is v_cache
    assert torch.allclose(q[0], qkv[:, : q_heads * D], atol=1e-5)
    for row, slot in enumerate(slots.tolist()):
        block, offset = divmod(slot, BLOCK)
        assert torch.allclose(k_cache[block, 0, offset], qkv[row, q_heads * D : (q_heads + 1) * D], atol=1e-5)
        assert torch.allclose(v_cache[block, 0, offset], qkv[row, (q_heads + 1) * D :], atol=1e-5)
    with pytest.raises(NF.KernelConstraintError, match="slot -1, outside the cache"):
        NF.qkv_proj(
            x,
            w,
            d_head=D,
            num_q_heads=q_heads,
            num_kv_heads=kv_heads,
            k_cache=k_cache,
            v_cache=v_cache,
            use_block_kv=True,
            block_size=BLOCK,
            slot_mapping=torch.tensor([1, 2, 3, 4, -1]),
        )


# -- decode ------------------------------------------------------------------------


def _decode_case(seed: int = 3, kv_heads: int = 1, batch: int = 2):
    torch.manual_seed(seed)
    q_heads, hidden, blocks_per_seq = 2, 8, 32  # context 128 slots
    w = torch.randn(hidden, (q_heads + 2 * kv_heads) * D) * 0.5
    x = torch.randn(batch, 1, hidden)
    k_cache = torch.randn(batch * blocks_per_seq + 2, kv_heads, BLOCK, D)
    v_cache = torch.randn_like(k_cache)
    table = torch.arange(1, batch * blocks_per_seq + 1, dtype=torch.int32).reshape(batch, blocks_per_seq)
    positions = torch.tensor([5, 9])[:batch]
    return dict(q_heads=q_heads, w=w, x=x, k_cache=k_cache, v_cache=v_cache, table=table, positions=positions)


def _mask(case):
    batch = case["x"].shape[0]
    return NF.gen_attention_decode_mask(
        case["positions"].view(1, batch).float(),
        batch,
        case["q_heads"],
        1,
        case["table"].shape[1] * BLOCK,
        block_len=BLOCK,
    )


def test_attention_decode_reads_a_3d_cache_like_a_4d_one() -> None:
    case = _decode_case()
    common = dict(X=case["x"], W_qkv=case["w"], active_blocks_table=case["table"], attention_mask=_mask(case))
    four = NF.attention_decode(K_cache=case["k_cache"], V_cache=case["v_cache"], **common)
    three = NF.attention_decode(
        K_cache=case["k_cache"].squeeze(1), V_cache=case["v_cache"].squeeze(1), **common
    )
    for a, b in zip(four, three, strict=False):
        assert torch.equal(a, b)


def test_attention_decode_matches_naive_paged_attention() -> None:
    case = _decode_case(kv_heads=1)
    output, k_new, v_new = NF.attention_decode(
        X=case["x"],
        W_qkv=case["w"],
        K_cache=case["k_cache"],
        V_cache=case["v_cache"],
        active_blocks_table=case["table"],
        attention_mask=_mask(case),
        softmax_scale=0.5,
    )
    for b, position in enumerate(case["positions"].tolist()):
        qkv = case["x"][b, 0].double() @ case["w"].double()
        q = qkv[: 2 * D].reshape(2, 1, D)
        blocks = case["table"][b].long()
        k_ctx = case["k_cache"][blocks, 0].reshape(-1, D)[:position].double()
        v_ctx = case["v_cache"][blocks, 0].reshape(-1, D)[:position].double()
        keys = torch.cat((k_ctx, qkv[2 * D : 3 * D].reshape(1, D)))
        values = torch.cat((v_ctx, qkv[3 * D :].reshape(1, D)))
        visible = torch.ones(1, keys.shape[0], dtype=torch.bool)
        expected = naive_attention(q, keys.expand(2, -1, -1), values.expand(2, -1, -1), 0.5, visible)
        assert torch.allclose(output[b].transpose(1, 2).double(), expected, atol=1e-5)


def test_bounded_gather_decode_equals_the_external_mask_path() -> None:
    case = _decode_case()
    common = dict(
        X=case["x"],
        W_qkv=case["w"],
        K_cache=case["k_cache"],
        V_cache=case["v_cache"],
        active_blocks_table=case["table"],
    )
    external = NF.attention_decode(attention_mask=_mask(case), **common)
    bounded = NF.attention_decode(
        attention_mask=None,
        pos_ids=case["positions"].view(2, 1).float(),
        max_context_len=(case["positions"].max() + 1).reshape(1).to(torch.int32),
        **common,
    )
    assert torch.equal(external[0], bounded[0])
    tight = NF.attention_decode(
        attention_mask=None,
        pos_ids=case["positions"].view(2, 1).float(),
        max_context_len=torch.tensor([3], dtype=torch.int32),
        **common,
    )  # reads only slots 0..2 of the context: a different result
    assert not torch.allclose(external[0], tight[0])


def test_fp8_kv_cache_emulation() -> None:
    """Step K/V are quantized as ``x * scale`` (clamped to the FP8 range) and
    written as FP8; the cache is read raw (the model folds 1/scale into the
    softmax scale and W_out), and the step's K/V enter attention quantized."""
    from autoport_cst.validate.standin.numerics import quantize_kv

    case = _decode_case(kv_heads=1)
    scale_k, scale_v = torch.tensor([[0.5]]), torch.tensor([[2.0]])
    k_cache, v_cache = case["k_cache"].to(torch.float8_e4m3fn), case["v_cache"].to(torch.float8_e4m3fn)
    raw_k, raw_v = k_cache.float().clone(), v_cache.float().clone()
    slots = case["table"][:, 0].to(torch.int64) * BLOCK + case["positions"] % BLOCK
    output = NF.attention_decode(
        X=case["x"],
        W_qkv=case["w"],
        K_cache=k_cache,
        V_cache=v_cache,
        active_blocks_table=case["table"],
        attention_mask=_mask(case),
        update_cache=True,
        kv_cache_update_idx=slots.view(2, 1).to(torch.uint32),
        k_scale=scale_k,
        v_scale=scale_v,
        softmax_scale=0.7,
    )
    qkv = case["x"][:, 0] @ case["w"]
    for b, (slot, position) in enumerate(zip(slots.tolist(), case["positions"].tolist(), strict=False)):
        block, offset = divmod(slot, BLOCK)
        step_k = quantize_kv(qkv[b, 2 * D : 3 * D], scale_k, torch.float8_e4m3fn).float()
        step_v = quantize_kv(qkv[b, 3 * D :], scale_v, torch.float8_e4m3fn).float()
        assert torch.equal(k_cache[block, 0, offset].float(), step_k)
        assert torch.equal(v_cache[block, 0, offset].float(), step_v)
        blocks = case["table"][b].long()
        keys = torch.cat((raw_k[blocks, 0].reshape(-1, D)[:position], step_k.view(1, D)))
        values = torch.cat((raw_v[blocks, 0].reshape(-1, D)[:position], step_v.view(1, D)))
        q = qkv[b, : 2 * D].reshape(2, 1, D)
        visible = torch.ones(1, keys.shape[0], dtype=torch.bool)
        expected = naive_attention(q, keys.expand(2, -1, -1), values.expand(2, -1, -1), 0.7, visible)
        assert torch.allclose(output[b].transpose(1, 2).double(), expected, atol=1e-4)
    clamped = quantize_kv(torch.full((2, D), 1e4), torch.ones(1, 1), torch.float8_e4m3fn)
    assert float(clamped.float().max()) == FP8_CLAMP_MAX


def test_packed_fp8_layout_round_trips() -> None:
    cache = torch.randn(3, 2, BLOCK, D)
    packed = swizzle_packed_k(cache)
    assert packed.shape == (3, 2, BLOCK // 2, D, 2)
    assert torch.equal(packed[0, 1, 1, :, 1], cache[0, 1, 3])  # position 2 * 1 + 1
    assert torch.equal(unswizzle_packed_k(packed), cache)


def test_context_parallel_mask_gates_prior_and_active_slots() -> None:
    mask = NF.gen_attention_decode_mask(
        torch.zeros(1, 2),
        2,
        1,
        1,
        128,
        block_len=BLOCK,
        local_filled_slots=torch.tensor([3.0, 5.0]),
        dcp_active_mask=torch.tensor([1.0, 0.0]),
    )
    assert mask[:, 0, 0, 0].nonzero().reshape(-1).tolist() == [0, 1, 2, 127]
    assert mask[:, 1, 0, 0].nonzero().reshape(-1).tolist() == [0, 1, 2, 3, 4]


# -- refused options -------------------------------------------------------------------


@pytest.mark.parametrize("option", ["K_cache_transposed", "transposed_out", "out_in_sb"])
def test_attention_decode_refuses_unimplemented_layouts_by_name(option: str) -> None:
    case = _decode_case()
    with pytest.raises(UnsupportedKernelOption, match=f"{option}=True"):
        NF.attention_decode(
            X=case["x"],
            W_qkv=case["w"],
            K_cache=case["k_cache"],
            V_cache=case["v_cache"],
            active_blocks_table=case["table"],
            attention_mask=_mask(case),
            **{option: True},
        )


def test_options_accept_their_default_and_refuse_lookalikes() -> None:
    case = _decode_case()
    common = dict(
        X=case["x"],
        W_qkv=case["w"],
        K_cache=case["k_cache"],
        V_cache=case["v_cache"],
        active_blocks_table=case["table"],
        attention_mask=_mask(case),
    )
    NF.attention_decode(K_cache_transposed=False, out_in_sb=False, sbm_lower_bound=4, **common)
    with pytest.raises(UnsupportedKernelOption, match="out_in_sb=1"):
        NF.attention_decode(out_in_sb=1, **common)  # 1 == True, but not False
    with pytest.raises(UnsupportedKernelOption, match="store_output_in_sbuf=True"):
        NF.qkv_proj(torch.zeros(1, 2, 4), torch.zeros(4, 8), store_output_in_sbuf=True)
    with pytest.raises(UnsupportedKernelOption, match="transpose_k_cache=True"):
        NF.qkv_proj(torch.zeros(1, 2, 4), torch.zeros(4, 8), transpose_k_cache=True)
    with pytest.raises(UnsupportedKernelOption, match="k_prior"):
        NF.flash_attention(
            torch.zeros(1, 2, 4), torch.zeros(1, 4, 2), torch.zeros(1, 2, 4), k_prior=torch.zeros(1)
        )
    args = (torch.zeros(2, 4), torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(8, 4))
    NF.mlp(*args, quant_clipping_bound=0, quantization_type=QuantizationType.NONE)  # defaults, spelled out
    with pytest.raises(UnsupportedKernelOption, match="quant_clipping_bound=False"):
        NF.mlp(*args, quant_clipping_bound=False)
    with pytest.raises(UnsupportedKernelOption, match="quantization_type=<QuantizationType.STATIC"):
        NF.mlp(
            torch.zeros(2, 4),
            torch.zeros(4, 8),
            torch.zeros(4, 8),
            torch.zeros(8, 4),
            quantization_type=QuantizationType.STATIC,
        )


@pytest.mark.parametrize(
    "call",
    [
        lambda: NF.qkv_proj(torch.zeros(1, 2, 4), torch.zeros(4, 8), not_an_argument=1),
        lambda: NF.mlp(
            torch.zeros(2, 4), torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(8, 4), not_an_argument=1
        ),
        lambda: NF.flash_attention(
            torch.zeros(1, 2, 4), torch.zeros(1, 4, 2), torch.zeros(1, 2, 4), not_an_argument=1
        ),
        lambda: NF.router(torch.zeros(2, 4), torch.zeros(4, 3), 1, not_an_argument=1),
    ],
)
def test_unknown_kernel_keyword_is_refused_by_name(call) -> None:
    with pytest.raises(KernelArgumentError, match="'not_an_argument'"):
        call()


def test_gen_attention_decode_mask_refuses_an_unknown_keyword() -> None:
    with pytest.raises(TypeError, match="not_an_argument"):
        NF.gen_attention_decode_mask(torch.zeros(1, 1), 1, 1, 1, 128, not_an_argument=True)


def test_mlp_clamps_and_fused_add() -> None:
    torch.manual_seed(4)
    x, residual = torch.randn(3, 4), torch.randn(3, 4)
    gate, up, down = torch.randn(4, 6), torch.randn(4, 6), torch.randn(6, 4)
    out, summed = NF.mlp(
        x,
        gate,
        up,
        down,
        fused_add_tensor=residual,
        store_fused_add_result=True,
        gate_clamp_upper_limit=0.5,
        up_clamp_lower_limit=-0.2,
    )
    h = x + residual
    expected = (torch.nn.functional.silu((h @ gate).clamp(max=0.5)) * (h @ up).clamp(min=-0.2)) @ down
    assert torch.allclose(out, expected, atol=1e-5) and torch.equal(summed, h)
    assert math.isclose(float(NF.P_MAX), 128.0)
