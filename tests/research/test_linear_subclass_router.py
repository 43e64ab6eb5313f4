"""A router that subclasses ``nn.Linear`` (Llama 4's ``Llama4Router``) and
projects with ``super().forward(x)`` is read as the Linear it is: its bias and
width are the arguments its constructor passed to ``nn.Linear``, as for a
plain ``nn.Linear`` router. Runs without torch or transformers (the source is
only read)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from autoport_cst.research.code_analysis import analyze_code
from autoport_cst.research.sources import ModelingSource, SourceLibrary

SOURCE = """
import torch
from torch import nn
from ...activations import ACT2FN


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
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, hidden_states):
        q = self.q_proj(hidden_states)
        k = self.k_proj(hidden_states)
        v = self.v_proj(hidden_states)
        probs = nn.functional.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.25, dim=-1)
        return self.o_proj(torch.matmul(probs, v))


class TinyExperts(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_up_proj = nn.Parameter(
            torch.zeros(config.num_local_experts, config.hidden_size, 2 * config.intermediate_size)
        )
        self.down_proj = nn.Parameter(
            torch.zeros(config.num_local_experts, config.intermediate_size, config.hidden_size)
        )
        self.act_fn = ACT2FN["silu"]

    def forward(self, hidden_states):
        hidden_states = hidden_states.view(self.gate_up_proj.shape[0], -1, hidden_states.shape[-1])
        gate, up = torch.bmm(hidden_states, self.gate_up_proj).chunk(2, dim=-1)
        return torch.bmm(up * self.act_fn(gate), self.down_proj).view(-1, hidden_states.shape[-1])


class TinyRouter(nn.Linear):
    def __init__(self, config):
        super().__init__(config.hidden_size, config.num_local_experts, bias=config.router_bias)
        self.top_k = config.num_experts_per_tok

    def forward(self, hidden_states):
        router_logits = super().forward(hidden_states)
        top_value, top_index = torch.topk(router_logits, self.top_k, dim=1)
        scores = torch.full_like(router_logits, float("-inf")).scatter_(1, top_index, top_value)
        return torch.sigmoid(scores.float()).to(scores.dtype), router_logits


class TinyMoe(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.hidden_dim = config.hidden_size
        self.experts = TinyExperts(config)
        self.router = TinyRouter(config)

    def forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        scores, logits = self.router(hidden_states)
        routed = self.experts(hidden_states.repeat(scores.shape[1], 1))
        weighted = routed.reshape(scores.shape[1], -1, self.hidden_dim) * scores.transpose(0, 1).unsqueeze(-1)
        return weighted.sum(dim=0)


class TinyLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = TinyAttention(config, layer_idx)
        self.mlp = TinyMoe(config)
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
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 48,
    "vocab_size": 100,
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
}
DIMS = {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 4, "head_dim": 8, "vocab_size": 100}


def _findings(tmp_path: Path, router_bias: bool) -> dict:
    root = tmp_path / "transformers"
    module_dir = root / "models" / "tiny"
    module_dir.mkdir(parents=True, exist_ok=True)
    (module_dir / "modeling_tiny.py").write_text(textwrap.dedent(SOURCE))
    library = SourceLibrary(root)
    module = library.module("transformers.models.tiny.modeling_tiny")
    config = {**CONFIG, "router_bias": router_bias}
    result = analyze_code(ModelingSource(library, module, "tiny"), config, "TinyForCausalLM", DIMS)
    return {f.field: f for f in result.findings}


@pytest.mark.parametrize("bias", [False, True])
def test_linear_subclass_router_reads_its_constructor_bias(tmp_path, bias):
    found = _findings(tmp_path, bias)
    finding = found["moe.router_bias"]
    assert finding.value is bias, finding
    assert "super().forward" in finding.evidence and f"bias={bias}" in finding.evidence
    assert found["moe.router_activation"].value == "sigmoid"
    assert found["moe.top_k"].value == 1
    assert found["moe.num_experts"].value == 4
