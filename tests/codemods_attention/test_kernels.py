"""The op-by-op attention substitutes (``autoport_cst.transform.edit.kernels``)
against the stand-in kernels they replace: same arguments, same results, on
every path the real models take (whole and segmented prefill, masked and
bounded-gather decode, the in-kernel cache write or the returned K/V of
``update_cache=False``, one-KV-head 3-D caches), and every argument they do
not implement refused by name."""

from __future__ import annotations

import math

import pytest
import torch

from autoport_cst.transform.edit import kernels
from autoport_cst.validate.standin import functional as NF


def _functions(*sources: str) -> dict:
    scope = {"torch": torch, "math": math, "NF": NF}
    for source in sources:
        exec(compile(source, "<substitute>", "exec"), scope)  # noqa: S102 - our own generated code
    return scope


PREFILL = _functions(kernels.PREFILL_UNFUSED, kernels.SEGMENTED_UNFUSED, kernels.SOFTMAX_ATTENTION)
DECODE = _functions(kernels.DECODE_UNFUSED)["_attention_decode_unfused"]


# -- prefill ---------------------------------------------------------------------------------


@pytest.mark.parametrize("window, sink", [(None, False), (3, False), (None, True), (4, True)])
def test_flash_substitute_matches_the_kernel(window, sink):
    unfused = PREFILL["_flash_attention_unfused"]
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(4, 16, 7, generator=generator)  # [Nq, D, T]
    k = torch.randn(2, 16, 7, generator=generator)
    v = torch.randn(2, 7, 16, generator=generator)
    sinks = torch.randn(4, 1, generator=generator) if sink else None
    kwargs = {"scale": 0.3, "sliding_window": window, "sink": sinks, "tp_q": False, "tp_out": True}
    torch.testing.assert_close(unfused(q, k, v, **kwargs), NF.flash_attention(q, k, v, **kwargs))
    capped = unfused(q, k, v, softcap=0.5, **kwargs)
    assert not torch.allclose(capped, NF.flash_attention(q, k, v, **kwargs))


def _segmented_case(generator, kv_heads, block=4, blocks=256):
    """A 3-block cached prefix and a chunk of 512 rows (the segment size)."""
    heads, d, prior, segment = 4, 8, 12, 512
    shape = (blocks, kv_heads, block, d) if kv_heads > 1 else (blocks, block, d)
    caches = [torch.randn(*shape, generator=generator) for _ in range(2)]
    table = (
        torch.randperm(blocks, generator=generator)[: (prior + segment) // block].view(1, -1).to(torch.int32)
    )
    q = torch.randn(heads, segment, d, generator=generator)
    return q, caches, table, prior, block, segment


@pytest.mark.parametrize("kv_heads, window, sink", [(2, None, False), (2, 8, True), (1, 4, False)])
def test_segmented_substitute_matches_the_kernel(kv_heads, window, sink):
    unfused = PREFILL["_segmented_attention_unfused"]
    generator = torch.Generator().manual_seed(2)
    q, (k_cache, v_cache), table, prior, block, segment = _segmented_case(generator, kv_heads)
    kwargs = {
        "block_tables": table,
        "prior_tokens": torch.tensor([prior]),
        "block_size": block,
        "kv_segment_size": segment,
        "scale": 0.35,
        "tp_q": True,
        "tp_out": True,
        "sliding_window": window,
        "sink": torch.randn(4, 1, generator=generator) if sink else None,
    }
    expected = NF.segmented_attention(q, k_cache=k_cache, v_cache=v_cache, **kwargs)
    torch.testing.assert_close(unfused(q, k_cache=k_cache, v_cache=v_cache, **kwargs), expected)
    capped = unfused(q, k_cache=k_cache, v_cache=v_cache, softcap=0.5, **kwargs)
    assert not torch.allclose(capped, expected)


@pytest.mark.parametrize(
    "name, kwargs", [("fp8_packed", {"fp8_packed": True}), ("k_scale", {"k_scale": torch.ones(1)})]
)
def test_segmented_substitute_refuses_fp8_by_name(name, kwargs):
    generator = torch.Generator().manual_seed(2)
    q, (k_cache, v_cache), table, prior, block, segment = _segmented_case(generator, 2)
    with pytest.raises(NotImplementedError, match=name):
        PREFILL["_segmented_attention_unfused"](q, k_cache, v_cache, table, prior, block, segment, **kwargs)


def test_flash_substitute_refuses_kernel_options_by_name():
    q = torch.zeros(2, 3, 4)
    with pytest.raises(NotImplementedError, match="k_prior"):
        PREFILL["_flash_attention_unfused"](q, q, q, k_prior=q)


# -- decode ----------------------------------------------------------------------------------


def _decode_case(seed: int, kv_heads: int = 2, seq: int = 1):
    """Two sequences, the kernel's layouts; caches [blocks, Nkv, block, Dh],
    or 3-D with one KV head."""
    generator = torch.Generator().manual_seed(seed)
    batch, hidden, d, q_heads, block, blocks = 2, 32, 8, 4, 32, 4
    shape = (1 + batch * blocks, kv_heads, block, d) if kv_heads > 1 else (1 + batch * blocks, block, d)
    caches = [torch.randn(*shape, generator=generator) for _ in range(2)]
    table = torch.tensor([[4, 2, 6, 8], [1, 3, 5, 7]], dtype=torch.int32)
    positions = torch.tensor([[37 + i for i in range(seq)], [90 + i for i in range(seq)]])  # [B, S]
    slots = torch.stack(
        [table[b, positions[b] // block] * block + positions[b] % block for b in range(batch)]
    )
    angles = torch.randn(d // 2, batch, seq, generator=generator)
    width = (q_heads + 2 * kv_heads) * d
    kwargs = {
        "X": torch.randn(batch, seq, hidden, generator=generator),
        "W_qkv": torch.randn(hidden, width, generator=generator) * 0.2,
        "bias_qkv": torch.randn(1, width, generator=generator),
        "active_blocks_table": table,
        "cos": angles.cos(),
        "sin": angles.sin(),
        "softmax_scale": 0.4,
        "kv_cache_update_idx": slots.to(torch.uint32),
        "W_out": torch.randn(q_heads * d, hidden, generator=generator),
        "bias_out": torch.randn(1, hidden, generator=generator),
        "rope_contiguous_layout": True,
    }
    mask = {"q_head": q_heads, "s_active": seq, "s_prior": blocks * block, "block_len": block, "bs": batch}
    return kwargs, caches, positions, mask, generator


def _compare(kwargs, caches, update_cache: bool, softcap=None):
    k1, v1 = (c.clone() for c in caches)
    k2, v2 = (c.clone() for c in caches)
    expected = NF.attention_decode(K_cache=k1, V_cache=v1, update_cache=update_cache, **kwargs)
    actual = DECODE(K_cache=k2, V_cache=v2, update_cache=update_cache, softcap=softcap, **kwargs)
    if softcap is None:
        torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(k2, k1)
    torch.testing.assert_close(v2, v1)
    return actual, expected


@pytest.mark.parametrize("update_cache", [True, False])
@pytest.mark.parametrize("variant", ["plain", "qk_norm", "sink", "window", "3d_cache", "two_tokens"])
def test_decode_substitute_matches_the_kernel(variant, update_cache):
    kwargs, caches, positions, mask, generator = _decode_case(
        1, kv_heads=1 if variant == "3d_cache" else 2, seq=2 if variant == "two_tokens" else 1
    )
    pos_ids = positions.reshape(1, -1).float()
    start = (pos_ids - 20).clamp(min=0) if variant == "window" else None
    kwargs["attention_mask"] = NF.gen_attention_decode_mask(pos_ids=pos_ids, start_pos=start, **mask)
    if variant == "qk_norm":
        d = kwargs["cos"].shape[0] * 2
        kwargs.update(
            rmsnorm_QK_pre_rope_enabled=True,
            rmsnorm_QK_pre_rope_eps=1e-6,
            rmsnorm_QK_pre_rope_W_Q=torch.randn(1, d, generator=generator),
            rmsnorm_QK_pre_rope_W_K=torch.randn(1, d, generator=generator),
        )
    if variant == "sink":
        kwargs["sink"] = torch.randn(mask["q_head"], 1, generator=generator)
    _compare(kwargs, caches, update_cache)


def test_decode_substitute_without_cache_update_returns_the_new_keys_and_values():
    """qwen3 runs the kernel with update_cache=False and writes the cache
    itself from what the kernel returns: the caches stay as they are."""
    kwargs, caches, positions, mask, _ = _decode_case(3)
    kwargs["attention_mask"] = NF.gen_attention_decode_mask(pos_ids=positions.reshape(1, -1).float(), **mask)
    (output, k_new, v_new), _ = _compare(kwargs, caches, update_cache=False)
    assert k_new.shape == (8, 2 * 2, 1) and v_new.shape == (2, 2, 1, 8)  # [Dh, B * Nkv, S], [B, Nkv, S, Dh]
    assert output.shape == (2, 32)


@pytest.mark.parametrize("window", [None, 20])
def test_decode_substitute_bounded_gather(window):
    """The in-kernel mask: no attention_mask, pos_ids (and the window's
    start), the prior context read up to max_context_len."""
    kwargs, caches, positions, _, _ = _decode_case(4)
    pos_ids = positions.reshape(1, -1).float()
    kwargs.update(
        attention_mask=None,
        pos_ids=pos_ids,
        swa_start_pos_ids=None if window is None else (pos_ids - (window - 1)).clamp(min=0),
        max_context_len=(positions.max() + 1).reshape(1).to(torch.int32),
    )
    _compare(kwargs, caches, update_cache=True)


def test_decode_substitute_fused_input_norm_interleaved_rope_and_head_major_output():
    kwargs, caches, positions, mask, generator = _decode_case(5)
    kwargs["attention_mask"] = NF.gen_attention_decode_mask(pos_ids=positions.reshape(1, -1).float(), **mask)
    kwargs.update(
        rmsnorm_X_enabled=True,
        rmsnorm_X_eps=1e-5,
        rmsnorm_X_gamma=torch.randn(1, 32, generator=generator),
        rope_contiguous_layout=False,
        W_out=None,
        bias_out=None,
    )
    _compare(kwargs, caches, update_cache=True)


def test_decode_substitute_softcap_changes_only_the_scores():
    kwargs, caches, positions, mask, _ = _decode_case(6)
    kwargs["attention_mask"] = NF.gen_attention_decode_mask(pos_ids=positions.reshape(1, -1).float(), **mask)
    capped, plain = _compare(kwargs, caches, update_cache=True, softcap=0.3)
    assert not torch.allclose(capped, plain)
    wide, plain = _compare(kwargs, caches, update_cache=True, softcap=1e6)
    torch.testing.assert_close(wide, plain)


@pytest.mark.parametrize(
    "name, option",
    [
        ("attention_dp", {"attention_dp": 2}),
        ("kv_needs_a2a", {"kv_needs_a2a": True}),
        ("dcp_size", {"dcp_size": 2}),
        ("k_scale", {"k_scale": torch.ones(1), "v_scale": torch.ones(1)}),
        ("fp8_packed", {"fp8_packed": True}),
        ("quantization_type_qkv", {"quantization_type_qkv": "STATIC"}),
        ("K_cache_transposed", {"K_cache_transposed": True}),
    ],
)
def test_decode_substitute_refuses_what_it_does_not_implement_by_name(name, option):
    kwargs, caches, positions, mask, _ = _decode_case(7)
    kwargs["attention_mask"] = NF.gen_attention_decode_mask(pos_ids=positions.reshape(1, -1).float(), **mask)
    with pytest.raises(NotImplementedError, match=name):
        DECODE(K_cache=caches[0], V_cache=caches[1], update_cache=True, **kwargs, **option)


def test_decode_substitute_takes_neutral_options_and_hints():
    """The values the real models pass when a feature is off, and the
    kernel's scheduling hints, are accepted."""
    kwargs, caches, positions, mask, _ = _decode_case(8)
    kwargs["attention_mask"] = NF.gen_attention_decode_mask(pos_ids=positions.reshape(1, -1).float(), **mask)
    neutral = {
        "attention_dp": 1,
        "attention_dp_group": None,
        "attention_dp_rank": 0,
        "kv_needs_a2a": False,
        "dcp_size": 1,
        "dcp_group": None,
        "k_scale": None,
        "v_scale": None,
        "K_cache_transposed": False,
        "transposed_out": False,
        "out_in_sb": False,
        "pos_ids": None,
        "max_context_len": None,
        "X_hidden_dim_actual": 32,
        "rmsnorm_X_enabled": False,
        "rmsnorm_QK_post_rope_enabled": False,
    }
    _compare({**kwargs, **neutral}, caches, update_cache=True)
    DECODE(
        K_cache=caches[0].clone(), V_cache=caches[1].clone(), update_cache=True, sbm_lower_bound=0, **kwargs
    )
