"""The modeling-source analysis on a hand-written model whose class names
lie: features must be classified by what the code computes. Runs without
torch or transformers (the source is only read)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from autoport_cst.research.code_analysis import analyze_code
from autoport_cst.research.sources import ModelingSource, SourceLibrary

SOURCE = '''
import torch
from torch import nn
from ...activations import ACT2FN


def rotate_pairs(x):
    even = x[..., ::2]
    odd = x[..., 1::2]
    return torch.stack((-odd, even), dim=-1).flatten(-2)


def apply_rotary(q, k, cos, sin):
    return q * cos + rotate_pairs(q) * sin, k * cos + rotate_pairs(k) * sin


class FakeRMSNorm(nn.Module):
    """Named RMSNorm, computes a LayerNorm with a bias."""

    def __init__(self, size, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        centred = x - mu
        var = centred.pow(2).mean(-1, keepdim=True)
        return centred * torch.rsqrt(var + self.eps) * self.weight + self.bias


class FakeLayerNorm(nn.Module):
    """Named LayerNorm, computes an RMSNorm with a (1 + weight) offset."""

    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x):
        scaled = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return scaled * (1.0 + self.weight)


class OddNorm(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x):
        return x / x.abs().amax(-1, keepdim=True) * self.weight


class BaseAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.use_bias)
        self.out = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.scale = config.attn_scale


class FakeAttention(BaseAttention):
    def forward(self, hidden_states, position_embeddings):
        q, k, v = self.qkv(hidden_states).chunk(3, dim=-1)
        cos, sin = position_embeddings
        q, k = apply_rotary(q, k, cos, sin)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        probs = nn.functional.softmax(scores, dim=-1)
        return self.out(torch.matmul(probs, v)), probs


class FakeMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = ACT2FN[config.activation]

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class FakeLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn = FakeAttention(config, layer_idx)
        self.ffn = FakeMLP(config)
        if config.odd_norm:
            self.ln = OddNorm(config.hidden_size)
        else:
            self.ln = FakeRMSNorm(config.hidden_size, eps=config.norm_eps)

    def forward(self, hidden_states, position_embeddings=None):
        normed = self.ln(hidden_states)
        attn_out, _ = self.attn(normed, position_embeddings)
        return hidden_states + attn_out + self.ffn(normed)


class FakeModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList([FakeLayer(config, i) for i in range(config.num_hidden_layers)])
        self.final = FakeLayerNorm(config.hidden_size)

    def forward(self, input_ids):
        h = self.tokens(input_ids) * 2.0
        for block in self.blocks:
            h = block(h)
        return self.final(h)


class FakeForCausalLM(nn.Module):
    _tied_weights_keys = {"head.weight": "model.tokens.weight"}

    def __init__(self, config):
        super().__init__()
        self.model = FakeModel(config)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=True)

    def forward(self, input_ids):
        logits = self.head(self.model(input_ids))
        return torch.tanh(logits / 15.0) * 15.0
'''

CONFIG = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "intermediate_size": 48,
    "vocab_size": 100,
    "use_bias": True,
    "attn_scale": 0.5,
    "activation": "relu",
    "norm_eps": 1e-4,
    "odd_norm": False,
}
DIMS = {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 4, "head_dim": 8, "vocab_size": 100}


def analyse(tmp_path: Path, **config):
    root = tmp_path / "transformers"
    module_dir = root / "models" / "fake"
    module_dir.mkdir(parents=True, exist_ok=True)
    (module_dir / "modeling_fake.py").write_text(textwrap.dedent(SOURCE))
    library = SourceLibrary(root)
    module = library.module("transformers.models.fake.modeling_fake")
    result = analyze_code(
        ModelingSource(library, module, "fake"), {**CONFIG, **config}, "FakeForCausalLM", DIMS
    )
    return {f.field: f for f in result.findings}, result


def test_norm_is_classified_by_what_forward_computes(tmp_path):
    found, _ = analyse(tmp_path)
    assert found["norm.kind"].value == "layernorm"  # FakeRMSNorm subtracts the mean
    assert found["norm.bias"].value is True
    assert found["norm.unit_offset"].value is False
    assert found["norm.eps"].value == 1e-4
    assert found["norm.eps_key"].value == "norm_eps"


def test_structure_from_data_flow(tmp_path):
    found, result = analyse(tmp_path)
    assert found["num_layers"].value == 3
    assert found["residual.parallel"].value == "shared_norm"
    assert found["norm.placement"].value == "pre"
    assert found["attention.qkv_bias"].value is True  # bias=config.use_bias, evaluated
    assert found["attention.o_bias"].value is False
    assert found["code.fused_qkv"].value is True
    assert found["attention.scale"].value == 0.5  # inherited __init__ from BaseAttention
    assert found["rope.style"].value == "interleaved"
    assert found["mlp.kind"].value == "plain"
    assert found["mlp.activation"].value == "relu"
    assert found["mlp.bias"].value is True
    assert found["embedding.multiplier"].value == 2.0
    assert found["lm_head.bias"].value is True
    assert found["lm_head.softcap"].value == 15.0
    assert result.tied_keys_declared
    assert result.head_key == "head.weight"
    assert result.embed_key == "model.tokens.weight"
    assert "model.blocks.2.attn.qkv.bias" in result.expected


def test_unclassified_norm_is_unknown(tmp_path):
    found, _ = analyse(tmp_path, odd_norm=True)
    assert found["norm.kind"].confidence == "unknown"
    assert found["norm.kind"].value is None


def test_config_flags_change_what_is_built(tmp_path):
    found, result = analyse(tmp_path, use_bias=False)
    assert found["attention.qkv_bias"].value is False
    assert "model.blocks.0.attn.qkv.bias" not in result.expected


def test_research_package_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, autoport_cst.research, autoport_cst.research.code_analysis; "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_modeling_source_is_read_not_imported():
    pytest.importorskip("transformers")
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from autoport_cst.research.sources import locate_modeling_source\n"
        "from autoport_cst.research.code_analysis import analyze_code\n"
        "from transformers import AutoConfig\n"
        "config = AutoConfig.for_model('qwen2', num_hidden_layers=2)\n"
        "source = locate_modeling_source('qwen2')\n"
        "dims = dict(hidden_size=config.hidden_size, num_heads=config.num_attention_heads,\n"
        "            num_kv_heads=config.num_key_value_heads, head_dim=128, vocab_size=config.vocab_size)\n"
        "result = analyze_code(source, config, 'Qwen2ForCausalLM', dims)\n"
        "print(source.path.name, any(f.field == 'attention.qkv_bias' and f.value for f in result.findings),\n"
        "      'transformers.models.qwen2.modeling_qwen2' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["modeling_qwen2.py", "True", "False"]


def test_a_norm_subclass_with_its_own_forward_is_not_taken_for_its_base(tmp_path):
    """Nemotron's LayerNorm1P subclasses nn.LayerNorm but applies
    (1 + weight): the base class alone must not classify it as a plain
    LayerNorm. Its forward is read: the weight and bias the base creates,
    passed as ``F.layer_norm(*_cast_if_autocast_enabled(..., self.weight +
    1.0, self.bias, ...))`` (a source function returning its arguments,
    unpacked; no autocast at inference)."""
    from autoport_cst.research import research
    from autoport_cst.validate import build_tiny_checkpoint

    build_tiny_checkpoint("NemotronForCausalLM", tmp_path / "nemotron")
    found = research(str(tmp_path / "nemotron"))
    norm = found.spec.norm
    assert (norm.kind, norm.bias, norm.unit_offset, norm.affine) == ("layernorm", True, True, True)
    assert not {"norm.kind", "norm.bias", "norm.unit_offset"} & set(found.unknown)
    assert "1 + param" in found.decision("norm.unit_offset").evidence
