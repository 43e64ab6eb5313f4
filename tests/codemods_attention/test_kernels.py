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
from autoport_cst.validate import kernel_substitutes
from autoport_cst.validate.standin import functional as NF
from autoport_cst.validate.standin import standin_installed


def _functions(*sources: str) -> dict:
    scope = {"torch": torch, "math": math, "NF": NF}
    for source in sources:
        exec(compile(source, "<substitute>", "exec"), scope)  # noqa: S102 - our own generated code
    return scope


SOURCES = (
    kernels.PREFILL_UNFUSED,
    kernels.SEGMENTED_UNFUSED,
    kernels.SOFTMAX_ATTENTION,
    kernels.DECODE_UNFUSED,
)
FUNCTIONS = _functions(*SOURCES)
PREFILL = FUNCTIONS
DECODE = FUNCTIONS["_attention_decode_unfused"]


# -- the validator's conformance cases (validate.kernel_substitutes) ----------------------------


@pytest.mark.parametrize("name", sorted(kernel_substitutes.KERNELS))
def test_substitute_matches_the_kernel_on_every_conformance_case(name):
    cases = kernel_substitutes.cases_for(name, NF)
    assert len(cases) >= 3
    with standin_installed():  # the FP8 cases import the platform's FP8 range
        assert kernel_substitutes.check_functions({name: FUNCTIONS[name]}, NF) == []


@pytest.mark.parametrize(
    "name, old, new, case",
    [
        (
            "_attention_decode_unfused",
            "V_cache if V_cache.dim() == 4 else V_cache.unsqueeze(1)",
            "V_cache if V_cache.dim() == 4 else V_cache.unsqueeze(2)",
            "3d_cache, update_cache True",
        ),
        (
            "_flash_attention_unfused",
            "unsqueeze(1) + (seq_k - seq_q)",
            "unsqueeze(1) - (seq_k - seq_q)",
            "5 queries over 9 keys",
        ),
        (
            "_segmented_attention_unfused",
            "rows = view[table].to(q.dtype)",
            "rows = view[table.flip(0)].to(q.dtype)",
            "window",
        ),
        (
            "_attention_decode_unfused",
            "k_ctx[:, :, context - seq :]",
            "k_ctx[:, :, context - seq - 1 :]",
            "two_tokens",
        ),
        (
            "_attention_decode_unfused",
            "stored(k, k_scale, K_cache), stored(v, v_scale, V_cache)",
            "stored(k, v_scale, K_cache), stored(v, k_scale, V_cache)",
            "FP8 cache with k_scale and v_scale",
        ),
        (
            "_attention_decode_unfused",
            "keep = ((slots >= 0) & (slots < cache_view.shape[0] * block_size))",
            "keep = ((slots >= 1) & (slots < cache_view.shape[0] * block_size))",
            "block_0, update_cache True",
        ),
        (
            "_segmented_attention_unfused",
            "q = q if tp_q else q.transpose(1, 2)",
            "q = q if tp_q else q.transpose(1, 2).flip(1)",
            "queries [heads, D, S]",
        ),
    ],
)
def test_a_substitute_wrong_in_a_layout_the_port_never_passes_is_named(name, old, new, case):
    """A one-KV-head cache, keys longer than the queries: what a port's own
    calls never pass, the cases drive."""
    source = next(text for text in SOURCES if f"def {name}(" in text)
    assert old in source
    mutated = _functions(*(text.replace(old, new) for text in SOURCES))
    with standin_installed():
        failures = kernel_substitutes.check_functions({name: mutated[name]}, NF)
    assert failures and any(case in failure for failure in failures), failures
    assert all(failure.startswith(f"{name} differs from NF.") for failure in failures)


def test_a_substitute_refusing_a_layout_by_name_passes():
    """Refusing is what a substitute may do with what it does not implement."""
    old = "cache_view = V_cache if V_cache.dim() == 4 else V_cache.unsqueeze(1)"
    new = "cache_view = V_cache if V_cache.dim() == 4 else _refuse_3d()"
    source = kernels.DECODE_UNFUSED.replace(old, new)
    refusing = "def _refuse_3d():\n    raise NotImplementedError('one-KV-head 3-D caches')\n"
    decode = _functions(refusing, source)["_attention_decode_unfused"]
    assert new in source
    with standin_installed():  # the FP8 cases import the platform's FP8 range
        assert kernel_substitutes.check_functions({"_attention_decode_unfused": decode}, NF) == []


def test_decode_substitute_needs_both_kv_scales():
    kwargs, caches, positions, mask, _ = _decode_case(7)
    kwargs["attention_mask"] = NF.gen_attention_decode_mask(pos_ids=positions.reshape(1, -1).float(), **mask)
    with pytest.raises(ValueError, match="k_scale and v_scale go together"):
        DECODE(K_cache=caches[0], V_cache=caches[1], update_cache=True, **kwargs, k_scale=torch.ones(1))


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


def test_softcap_changes_what_the_prefill_substitutes_compute():
    for name in ("_flash_attention_unfused", "_segmented_attention_unfused"):
        case = kernel_substitutes.cases_for(name, NF)[1]
        kernel = getattr(NF, kernel_substitutes.KERNELS[name])
        capped = FUNCTIONS[name](**case.kwargs, softcap=0.5)
        assert not torch.allclose(capped, kernel(**case.kwargs))


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


def _decode_case(seed: int):
    """Two sequences in the kernel's layouts (the validator's own case
    builder): the kwargs without the caches, the caches, positions, mask sizes."""
    kwargs, positions, mask = kernel_substitutes.decode_kwargs(seed, "plain")
    caches = [kwargs.pop("K_cache"), kwargs.pop("V_cache")]
    return kwargs, caches, positions, mask, torch.Generator().manual_seed(seed)


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


def test_decode_substitute_without_cache_update_returns_the_new_keys_and_values():
    """qwen3 runs the kernel with update_cache=False and writes the cache
    itself from what the kernel returns: the caches stay as they are."""
    kwargs, caches, positions, mask, _ = _decode_case(3)
    kwargs["attention_mask"] = NF.gen_attention_decode_mask(pos_ids=positions.reshape(1, -1).float(), **mask)
    (output, k_new, v_new), _ = _compare(kwargs, caches, update_cache=False)
    assert k_new.shape == (8, 2 * 2, 1) and v_new.shape == (2, 2, 1, 8)  # [Dh, B * Nkv, S], [B, Nkv, S, Dh]
    assert output.shape == (2, 32)


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
        ("sink with dcp_size=2", {"dcp_size": 2, "sink": torch.zeros(4, 1)}),
        ("alibi_slopes with dcp_size=2", {"dcp_size": 2, "alibi_slopes": torch.zeros(4)}),
        (
            "max_context_len with dcp_size=2",
            {"dcp_size": 2, "max_context_len": torch.ones(1, dtype=torch.int32)},
        ),
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


def test_decode_substitute_needs_the_dcp_group_of_its_size():
    kwargs, caches, positions, mask, _ = _decode_case(7)
    kwargs["attention_mask"] = NF.gen_attention_decode_mask(pos_ids=positions.reshape(1, -1).float(), **mask)
    with pytest.raises(ValueError, match="dcp_size=2 needs a dcp_group of that size"):
        DECODE(K_cache=caches[0], V_cache=caches[1], update_cache=True, **kwargs, dcp_size=2)


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
