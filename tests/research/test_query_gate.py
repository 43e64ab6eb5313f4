"""An output gate fused with the queries in one projection (MiniCPM5-MoE's
``q_gate_proj``, hidden -> 2 x heads x head_dim) is read by running the
attention's split on the projection's row numbers (analysis/query_gate):
viewed per head as ``[query | gate]`` and chunked in two, it is the
``sigmoid`` output gate a port computes, stored ``fused_query_per_head``,
the projection naming both the query and the gate; split otherwise (all the
queries, then all the gates) it is named as a gate on the attention output
whose rows split otherwise. Either way its width is not read as query or KV
heads (once: 4 KV heads for 4 query heads, refused as ``kv_repeat``). Runs
without torch's model classes or transformers (the source is only read; the
probe runs torch on row numbers)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from autoport_cst.research.code_analysis import analyze_code
from autoport_cst.research.sources import ModelingSource, SourceLibrary

pytest.importorskip("torch")

PER_HEAD = """
        gated = self.q_gate_proj(hidden_states).view(*input_shape, -1, 2 * self.head_dim)
        query, gate = gated.chunk(2, dim=-1)
        query = query.transpose(1, 2)
        gate = gate.reshape(*input_shape, -1)
"""
CONCATENATED = """
        query, gate = self.q_gate_proj(hidden_states).chunk(2, dim=-1)
        query = query.view(*input_shape, -1, self.head_dim).transpose(1, 2)
"""

SOURCE = """
import torch
from torch import nn
from ...modeling_utils import ALL_ATTENTION_FUNCTIONS


class TinyRMSNorm(nn.Module):
    def __init__(self, size, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class TinyAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        kv = config.num_key_value_heads * self.head_dim
        self.k_proj = nn.Linear(config.hidden_size, kv, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=False)
        self.q_gate_proj = nn.Linear(config.hidden_size, 2 * config.num_attention_heads * self.head_dim, bias=False)

    def forward(self, hidden_states):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
SPLIT
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, None)
        out, _ = attention(self, query, key, value, None, scaling=self.scaling)
        out = out.reshape(*input_shape, -1).contiguous()
        out = out * gate.sigmoid()
        return self.o_proj(out)


class TinyMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class TinyLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = TinyAttention(config, layer_idx)
        self.mlp = TinyMLP(config)
        self.input_layernorm = TinyRMSNorm(config.hidden_size)
        self.post_attention_layernorm = TinyRMSNorm(config.hidden_size)

    def forward(self, hidden_states):
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states))
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class TinyModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([TinyLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = TinyRMSNorm(config.hidden_size)

    def forward(self, input_ids):
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class TinyForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = TinyModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids):
        return self.lm_head(self.model(input_ids))
"""

CONFIG = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 96,
    "vocab_size": 100,
}
DIMS = {"hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "vocab_size": 100}


def _findings(tmp_path: Path, split: str):
    root = tmp_path / "transformers"
    module_dir = root / "models" / "tiny"
    module_dir.mkdir(parents=True, exist_ok=True)
    (module_dir / "modeling_tiny.py").write_text(textwrap.dedent(SOURCE).replace("SPLIT\n", split))
    library = SourceLibrary(root)
    module = library.module("transformers.models.tiny.modeling_tiny")
    result = analyze_code(ModelingSource(library, module, "tiny"), CONFIG, "TinyForCausalLM", DIMS)
    return {f.field: f for f in result.findings}, result


def _heads(found: dict) -> None:
    """Head counts: the config's 4 and 2, not the fused width's."""
    assert "unsupported.kv_repeat" not in found
    for field, value in (("attention.num_heads", 4), ("attention.num_kv_heads", 2)):
        assert found[field].value == value, found[field]
    assert "less 64 output gate rows" in found["attention.num_kv_heads"].evidence


def test_per_head_query_and_gate_rows_are_the_ported_gate(tmp_path):
    found, result = _findings(tmp_path, PER_HEAD)
    assert found["attention.output_gate"].value == "sigmoid"
    assert found["code.output_gate_layout"].value == "fused_query_per_head"
    assert "unsupported.attention_output_gate" not in found
    _heads(found)
    names = result.module_names
    assert names["self_attn.gate_proj"] == names["self_attn.q_proj"] == "self_attn.q_gate_proj"
    assert names["self_attn.k_proj"] == "self_attn.k_proj" and names["self_attn.v_proj"] == "self_attn.v_proj"


def test_rows_split_otherwise_are_named_not_ported(tmp_path):
    found, _ = _findings(tmp_path, CONCATENATED)
    gate = found["unsupported.attention_output_gate"]
    assert "q_gate_proj" in gate.evidence and "split otherwise" in gate.evidence
    assert "code.output_gate_layout" not in found
    _heads(found)
