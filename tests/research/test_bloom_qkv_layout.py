"""BLOOM's fused query_key_value is viewed as [..., heads, 3, head_dim]:
each head's rows are its [q k v] (checkpoint.qkv fused_per_head), as
GPT-NeoX's are; read from the view, and measured on transformers."""

from __future__ import annotations

import pytest


def test_bloom_fuses_qkv_per_head(tiny):
    found = tiny.research("bloom")
    assert found.spec.checkpoint.qkv == "fused_per_head"
    assert "[q k v] per head" in found.decision("checkpoint.qkv").evidence


def test_transformers_reads_each_heads_rows_as_q_k_v():
    torch = pytest.importorskip("torch")
    from transformers import BloomConfig
    from transformers.models.bloom.modeling_bloom import BloomAttention

    heads, head_dim = 4, 8
    attention = BloomAttention(BloomConfig(hidden_size=heads * head_dim, n_head=heads), layer_idx=0)
    fused = torch.arange(3 * heads * head_dim, dtype=torch.float32).reshape(1, 1, -1)
    query, key, value = attention._reshape(fused)
    rows = fused.reshape(heads, 3, head_dim)
    torch.testing.assert_close(query.reshape(heads, head_dim), rows[:, 0])
    torch.testing.assert_close(key.reshape(heads, head_dim), rows[:, 1])
    torch.testing.assert_close(value.reshape(heads, head_dim), rows[:, 2])
