"""Unit checks of the code the attention and RoPE codemods generate, where an
end-to-end validation cannot reach:

- RoPE variants whose frequencies depend on the sequence length (dynamic
  NTK, LongRoPE): transformers' full-sequence reference forward uses the
  whole sequence's length for every position, which no engine that prefills
  and then decodes can reproduce past the threshold, so the port's
  frequencies are compared with ``ROPE_INIT_FUNCTIONS`` directly, at lengths
  on both sides of the threshold;
- the query/key column order of partial and interleaved RoPE, against the
  transformers RoPE functions of StableLM, Helium and GLM;
- the per-layer rules read from configs without ``layer_types`` /
  ``no_rope_layers``.
"""

from __future__ import annotations

import importlib
import math
from types import SimpleNamespace

import pytest
import torch
from autoport_cst.codemods import nope_layers, rope_layer_parameters, sliding_window
from hypothesis import given, settings
from hypothesis import strategies as st

from autoport_cst.transform.edit import rope_columns


def _function(source: str, name: str, **namespace):
    scope = {"torch": torch, "math": math, **namespace}
    exec(compile(source, f"<generated {name}>", "exec"), scope)
    return scope[name]


# -- RoPE variants against transformers ------------------------------------------------


@pytest.fixture(scope="module")
def rope_ports(port_builder):
    return {
        variant: port_builder(
            {
                "version": 1,
                "name": f"llama_{variant}",
                "class_prefix": "Llama",
                "architecture": "LlamaForCausalLM",
                "reference": "llama3",
                "spec": {"rope": {"type": variant}},
            }
        )
        for variant in ("linear", "dynamic", "yarn", "longrope")
    }


def _port_rotary(package_dir, hf_config):
    """The port's rotary embedding built from ``hf_config`` (stand-in installed)."""
    from autoport_cst.validate.package import imported_package
    from autoport_cst.validate.standin import standin_installed

    with standin_installed(), imported_package(package_dir) as package:
        model = importlib.import_module(package.module.__name__ + ".model")
        config_module = importlib.import_module(package.module.__name__ + ".config")
        config = config_module.LlamaConfig.from_configs(hf_config)
        return model.LlamaRotaryEmbedding(config)


ROPE_CONFIGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "yarn": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 16,
        "beta_slow": 1,
    },
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "truncate": False,
    },
    "longrope": {
        "rope_type": "longrope",
        "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 4.0],
        "long_factor": [1.0, 1.5, 2.2, 3.0, 4.5, 6.0, 8.0, 10.0],
        "original_max_position_embeddings": 32,
    },
}


@pytest.mark.parametrize("name", sorted(ROPE_CONFIGS))
def test_rope_frequencies_match_transformers(name, rope_ports):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    parameters = {**ROPE_CONFIGS[name], "rope_theta": 10000.0}
    variant = parameters["rope_type"]
    hf_config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_parameters=parameters,
    )
    rotary = _port_rotary(rope_ports[variant], hf_config)
    limit = parameters.get("original_max_position_embeddings", hf_config.max_position_embeddings)
    for length in (limit // 2, limit, limit + 1, 3 * limit):
        positions = torch.arange(length)
        expected, factor = ROPE_INIT_FUNCTIONS[variant](hf_config, None, seq_len=length)
        inv_freq = rotary._compute_inv_freq(torch.device("cpu"))
        if variant == "dynamic":
            inv_freq = rotary._dynamic_ntk_inv_freq(inv_freq, positions)
        elif variant == "longrope":
            inv_freq = rotary._longrope_inv_freq(inv_freq, positions)
        torch.testing.assert_close(inv_freq, expected.to(torch.float32), rtol=1e-6, atol=0)
        assert rotary.attention_scaling == pytest.approx(factor, rel=1e-12)
        cos, sin = rotary(positions, device=torch.device("cpu"), dtype=torch.float32)
        emb = torch.outer(positions.float(), expected.float())
        emb = torch.cat((emb, emb), dim=-1)
        torch.testing.assert_close(cos, emb.cos() * factor, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sin, emb.sin() * factor, rtol=1e-5, atol=1e-5)


def test_dynamic_ntk_follows_the_step_length_past_the_limit(rope_ports):
    """The port recomputes the base from the step's last position: the same
    as transformers for a sequence processed at once; a sequence prefilled
    and then decoded past the limit (as any serving engine does) rotates its
    earlier keys with the base of their own step."""
    from transformers import LlamaConfig

    hf_config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    )
    rotary = _port_rotary(rope_ports["dynamic"], hf_config)
    base = rotary._compute_inv_freq(torch.device("cpu"))
    short = rotary._dynamic_ntk_inv_freq(base, torch.arange(16))
    longer = rotary._dynamic_ntk_inv_freq(base, torch.arange(20))
    assert torch.equal(short, base)
    assert not torch.allclose(longer, base)


# -- query/key column order (partial and interleaved RoPE) -------------------------------


_order = _function(rope_columns.ROPE_ORDER_FUNCTION, "_rope_column_order")


def _rotate_half(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@settings(max_examples=30, deadline=None)
@given(
    head_dim=st.sampled_from([4, 8, 16, 32]),
    factor=st.sampled_from([0.25, 0.5, 0.75, 1.0]),
    interleaved=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_column_order_turns_the_checkpoint_rope_into_rotate_half(head_dim, factor, interleaved, seed):
    """HF's RoPE (partial and/or interleaved) then the column order equals the
    column order then rotate-half over the whole head with zero-padded
    frequencies, which is what the port's prefill and decode kernel compute."""
    from transformers.models.glm.modeling_glm import apply_rotary_pos_emb as glm_rope

    rotary_dim = int(head_dim * factor)
    if rotary_dim % 2:
        return
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, 5, head_dim, generator=generator, dtype=torch.float64)
    k = torch.randn(1, 1, 5, head_dim, generator=generator, dtype=torch.float64)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    freqs = torch.outer(torch.arange(5, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    if interleaved:
        q_hf, k_hf = glm_rope(q, k, emb.cos(), emb.sin())  # GLM / Helium: adjacent pairs in the rotated part
    else:
        q_hf, k_hf = _stablelm_partial(q, k, emb.cos(), emb.sin(), rotary_dim)
    order = torch.tensor(_order(head_dim, rotary_dim, interleaved))
    assert sorted(order.tolist()) == list(range(head_dim))
    padded = torch.nn.functional.pad(freqs, (0, (head_dim - rotary_dim) // 2))
    full = torch.cat((padded, padded), dim=-1)
    torch.testing.assert_close(_rotate_half(q[..., order], full.cos(), full.sin()), q_hf[..., order])
    torch.testing.assert_close(_rotate_half(k[..., order], full.cos(), full.sin()), k_hf[..., order])


def _stablelm_partial(q, k, cos, sin, rotary_dim):
    """StableLM's attention: rotate-half RoPE on the first rotary_dim dims."""
    from transformers.models.stablelm.modeling_stablelm import apply_rotary_pos_emb

    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin)
    return torch.cat((q_rot, q_pass), dim=-1), torch.cat((k_rot, k_pass), dim=-1)


def test_column_loader_reorders_query_and_key_heads_only():
    from autoport_cst.validate.standin.weight_loader import (
        SafetensorsWeightLoader,
        TensorSlice,
    )

    loader_fn = _function(
        rope_columns.ROPE_LOADER_FUNCTION,
        "_rope_columns_loader",
        SafetensorsWeightLoader=SafetensorsWeightLoader,
    )
    head_dim, q_size, kv_size = 4, 8, 4
    order = [0, 2, 1, 3]
    fused = torch.arange(3 * 2 * (q_size + 2 * kv_size), dtype=torch.float32).reshape(6, -1)
    inner = SafetensorsWeightLoader(lambda slices, rank: slices[0][:])
    loaded = loader_fn(inner, order, q_size + kv_size).load([TensorSlice(fused)], 0)
    expected = torch.cat(
        [fused[:, h * head_dim : (h + 1) * head_dim][:, order] for h in range((q_size + kv_size) // head_dim)]
        + [fused[:, q_size + kv_size :]],
        dim=-1,
    )
    assert torch.equal(loaded, expected)


# -- per-layer rules ------------------------------------------------------------------------


def _config(**values):
    defaults = dict(
        sliding_window=5,
        use_sliding_window=True,
        layer_types=None,
        max_window_layers=None,
        no_rope_layers=None,
        no_rope_layer_interval=None,
    )
    return SimpleNamespace(**{**defaults, **values})


@pytest.mark.parametrize(
    "fallback, config, expected",
    [
        ("none", _config(layer_types=["full_attention", "sliding_attention"]), [None, 5]),
        ("none", _config(sliding_window=None, layer_types=["sliding_attention"] * 2), [None, None]),
        ("none", _config(use_sliding_window=False, layer_types=["sliding_attention"] * 2), [None, None]),
        ("max_window_layers", _config(max_window_layers=1), [None, 5, 5]),
        ("even_layers", _config(), [5, None, 5]),
    ],
)
def test_layer_sliding_window(fallback, config, expected):
    rule = _function(sliding_window.layer_function(fallback), "_layer_sliding_window")
    assert [rule(config, i) for i in range(len(expected))] == expected


def test_layer_sliding_window_without_layer_types_is_refused():
    rule = _function(sliding_window.layer_function("none"), "_layer_sliding_window")
    with pytest.raises(ValueError, match="no layer_types"):
        rule(_config(), 0)


@pytest.mark.parametrize(
    "config, expected",
    [
        (_config(no_rope_layers=[1, 0, 1]), [True, False, True]),
        (_config(no_rope_layer_interval=4), [True, True, True, False, True, True, True, False]),
        (_config(), [True, True]),
    ],
)
def test_layer_uses_rope(config, expected):
    rule = _function(nope_layers.LAYER_FUNCTION, "_layer_uses_rope")
    assert [rule(config, i) for i in range(len(expected))] == expected


@pytest.mark.parametrize(
    "config, expected",
    [
        (
            _config(
                rope_layer_parameters={"sliding_attention": {}, "full_attention": {}},
                num_hidden_layers=2,
                layer_types=["sliding_attention", "full_attention"],
            ),
            ["sliding_attention", "full_attention"],
        ),
        (_config(rope_layer_parameters=None, num_hidden_layers=3), [None, None, None]),
    ],
)
def test_rope_layer_types(config, expected):
    rule = _function(rope_layer_parameters.LAYER_TYPES_FUNCTION, "_rope_layer_types")
    assert rule(config) == expected


@pytest.mark.parametrize(
    "layer_types, message",
    [(None, "need layer_types"), (["sliding_attention", "chunked_attention"], "chunked_attention")],
)
def test_rope_layer_types_refuses_layers_without_parameters(layer_types, message):
    rule = _function(rope_layer_parameters.LAYER_TYPES_FUNCTION, "_rope_layer_types")
    config = _config(
        rope_layer_parameters={"sliding_attention": {}}, num_hidden_layers=2, layer_types=layer_types
    )
    with pytest.raises(ValueError, match=message):
        rule(config)
