"""Hypothesis strategies for model-shaped Python sources: vllm_neuron-style
packages with varied class prefixes, attribute and helper names, norm kinds,
biases, RoPE variants (lazy, eager buffers, cached cos/sin tables) and decode
kernel argument forms, plus unrelated code that no codemod targets."""

from __future__ import annotations

import keyword
import textwrap
from dataclasses import dataclass

from hypothesis import strategies as st

IDENT = st.from_regex(r"[a-z][a-z0-9]{1,8}", fullmatch=True).filter(
    lambda s: (
        not keyword.iskeyword(s) and s not in {"self", "torch", "nn", "config", "x", "len", "range", "super"}
    )
)
PREFIX = st.from_regex(r"[A-Z][a-z]{2,6}[0-9]?", fullmatch=True)


@dataclass(frozen=True)
class ModelShape:
    prefix: str
    norm: str  # rmsnorm | layernorm
    norm_bias: bool
    eps_field: str
    qkv_bias: bool
    o_bias: bool
    rope: str  # lazy | buffer | attr | cached
    decode_bias: str  # none | 1d | 2d | guarded
    router: bool
    helper: str
    local: str

    @property
    def norm_class(self) -> str:
        return f"{self.prefix}{'LayerNorm' if self.norm == 'layernorm' else 'RMSNorm'}"


shapes = st.builds(
    ModelShape,
    prefix=PREFIX,
    norm=st.sampled_from(["rmsnorm", "layernorm"]),
    norm_bias=st.booleans(),
    eps_field=st.sampled_from(["rms_norm_eps", "layer_norm_eps", "norm_eps"]),
    qkv_bias=st.booleans(),
    o_bias=st.booleans(),
    rope=st.sampled_from(["lazy", "buffer", "attr", "cached"]),
    decode_bias=st.sampled_from(["none", "1d", "2d", "guarded"]),
    router=st.booleans(),
    helper=IDENT,
    local=IDENT,
)


def _norm(s: ModelShape) -> str:
    bias = s.norm == "layernorm" and s.norm_bias
    lines = [
        f"class {s.norm_class}(nn.Module):",
        f'    """Norm of the {s.prefix} model."""',
        "",
        "    def __init__(self, hidden_size, eps, dtype):",
        "        super().__init__()",
        "        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))",
    ]
    if bias:
        lines.append("        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))")
    lines += ["        self.variance_epsilon = eps", "", "    def forward(self, x):", "        x = x.float()"]
    if s.norm == "layernorm":
        lines += [
            "        mean = x.mean(-1, keepdim=True)",
            "        x = (x - mean) * torch.rsqrt((x - mean).pow(2).mean(-1, keepdim=True) + self.variance_epsilon)",
        ]
    else:
        lines.append("        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)")
    lines.append("        return self.weight * x + self.bias" if bias else "        return self.weight * x")
    return "\n".join(lines)


def _rope(s: ModelShape) -> str:
    head = [
        f"class {s.prefix}RotaryEmbedding(nn.Module):",
        "    def __init__(self, config, base=10000.0):",
        "        super().__init__()",
        "        self.head_dim = config.head_dim",
    ]
    computed = "1.0 / (base ** (torch.arange(0, config.head_dim, 2).float() / config.head_dim))"
    if s.rope == "lazy":
        body = [
            "        self.base = base",
            "",
            "    def _compute_inv_freq(self, device):",
            "        return 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))",
            "",
            "    def forward(self, positions, device):",
            "        inv_freq = self._compute_inv_freq(device)",
            "        freqs = torch.outer(positions.float(), inv_freq)",
            "        return freqs.cos(), freqs.sin()",
        ]
    elif s.rope == "buffer":
        body = [
            f"        {s.local} = {computed}",
            f'        self.register_buffer("inv_freq", {s.local}, persistent=False)',
            "",
            "    def forward(self, positions, device):",
            "        freqs = torch.outer(positions.float(), self.inv_freq)",
            "        return freqs.cos(), freqs.sin()",
        ]
    elif s.rope == "attr":
        body = [
            f"        self.inv_freq = {computed}",
            "",
            "    def forward(self, x, positions):",
            "        freqs = torch.outer(positions.float(), self.inv_freq)",
            "        return freqs.cos().to(x.dtype), freqs.sin().to(x.dtype)",
        ]
    else:  # cached cos/sin tables
        body = [
            f"        inv_freq = {computed}",
            "        t = torch.arange(config.max_position_embeddings).float()",
            "        emb = torch.outer(t, inv_freq)",
            "        self.cos_cached = emb.cos()",
            "        self.sin_cached = emb.sin()",
            "",
            "    def forward(self, x, positions):",
            "        return self.cos_cached[positions], self.sin_cached[positions]",
        ]
    return "\n".join(head + body)


def _decode_bias(s: ModelShape, attr: str, present: bool) -> str:
    if not present or s.decode_bias == "none":
        return "None"
    if s.decode_bias == "1d":
        return f"self.{attr}"
    if s.decode_bias == "2d":
        return f"self.{attr}.unsqueeze(0)"
    return f"self.{attr} if self.{attr} is not None else None"


def _attention(s: ModelShape) -> str:
    lines = [
        f"class {s.prefix}Attention(nn.Module):",
        "    def __init__(self, config, layer_idx):",
        "        super().__init__()",
        "        self.dtype = config.torch_dtype",
        "        self.hidden_size = config.hidden_size",
        "        qkv_size = self.q_size + 2 * self.kv_size",
        "        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size, dtype=self.dtype))",
    ]
    if s.qkv_bias:
        lines.append("        self.qkv_proj_bias = nn.Parameter(torch.zeros(qkv_size, dtype=self.dtype))")
    lines.append(
        "        self.o_proj_weight = nn.Parameter(torch.empty(self.q_size, self.hidden_size, dtype=self.dtype))"
    )
    if s.o_bias:
        lines.append(
            "        self.o_proj_bias = nn.Parameter(torch.zeros(self.hidden_size, dtype=self.dtype))"
        )
    lines += [
        "        set_weight_loader(",
        "            self.qkv_proj_weight,",
        "            fused_qkv_weight_loader(",
        "                q_size=self.q_size,",
        "                kv_size=self.kv_size,",
        "                shard_dim=1,",
        "                num_shards=self.world_size,",
        "                is_storage_transposed=True,",
        "                num_kv_replicas=self.num_kv_replicas,",
        "            ),",
        "        )",
        "        set_weight_loader(",
        "            self.o_proj_weight,",
        "            sharding_weight_loader(shard_dim=0, shard_size=self.q_size, num_shards=self.world_size, is_storage_transposed=True),",
        "        )",
    ]
    if s.qkv_bias:
        lines.append(
            "        set_weight_loader(self.qkv_proj_bias, fused_qkv_bias_loader(q_size=self.q_size, kv_size=self.kv_size, num_shards=self.world_size))"
        )
    if s.o_bias:
        lines.append("        set_weight_loader(self.o_proj_bias, scaled_bias_loader(scale=self.world_size))")
    qkv_arg = "self.qkv_proj_bias.unsqueeze(0)" if s.qkv_bias else "None"
    o_arg = "self.o_proj_bias.unsqueeze(0)" if s.o_bias else "None"
    lines += [
        "",
        f"    def {s.helper}(self, {s.local}):",
        f"        return {s.local} * 2",
        "",
        "    def forward_prefill(self, hidden_states, positions):",
        f"        qkv = NF.qkv_proj(hidden=hidden_states.unsqueeze(0), qkv_weights=self.qkv_proj_weight, bias={qkv_arg})",
        f"        out = NF.o_proj(self.{s.helper}(qkv), self.o_proj_weight, {o_arg})",
        "        return out",
        "",
        "    def forward_decode(self, hidden_states, positions):",
        "        return NF.attention_decode(",
        "            X=hidden_states,",
        "            W_qkv=self.qkv_proj_weight,",
        f"            bias_qkv={_decode_bias(s, 'qkv_proj_bias', s.qkv_bias)},",
        "            W_out=self.o_proj_weight,",
        f"            bias_out={_decode_bias(s, 'o_proj_bias', s.o_bias)},",
        "        )",
    ]
    return "\n".join(lines)


def _experts(s: ModelShape) -> str:
    return "\n".join(
        [
            f"class {s.prefix}Experts(nn.Module):",
            "    def __init__(self, config):",
            "        super().__init__()",
            "        self.router_weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size, dtype=config.torch_dtype))",
            "",
            "    def forward(self, hidden_states):",
            "        return NF.router(hidden_states, router_weights=self.router_weight.T, top_k=2)",
        ]
    )


def _backbone(s: ModelShape) -> str:
    bias = s.norm == "layernorm" and s.norm_bias
    mlp = f"{s.prefix}Experts(config)" if s.router else "nn.Identity()"
    lines = [
        f"class {s.prefix}DecoderLayer(nn.Module):",
        "    def __init__(self, config, layer_idx):",
        "        super().__init__()",
        f"        self.self_attn = {s.prefix}Attention(config, layer_idx)",
        f"        self.mlp = {mlp}",
        f"        self.input_layernorm = {s.norm_class}(config.hidden_size, config.{s.eps_field}, config.torch_dtype)",
        "",
        "    def forward(self, hidden_states, positions):",
        "        residual = hidden_states",
        "        hidden_states = self.self_attn.forward_prefill(self.input_layernorm(hidden_states), positions)",
        "        return residual + self.mlp(hidden_states)",
        "",
        "",
        f"class {s.prefix}ForCausalLM(nn.Module):",
        "    def __init__(self, config):",
        "        super().__init__()",
        f"        self.layers = nn.ModuleList([{s.prefix}DecoderLayer(config, i) for i in range(config.num_hidden_layers)])",
        f"        self.norm = {s.norm_class}(config.hidden_size, config.{s.eps_field}, config.torch_dtype)",
        f"        self.rotary_emb = {s.prefix}RotaryEmbedding(config)",
        "",
        "    def load_weights(self, path):",
        "        mappings = {}",
        "        for layer_id in range(len(self.layers)):",
        '            prefix = f"model.layers.{layer_id}"',
        '            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"',
    ]
    if bias:
        lines.append(
            '            mappings[f"{prefix}.input_layernorm.bias"] = f"{prefix}.input_layernorm.bias"'
        )
    lines += [
        '            mappings[f"{prefix}.self_attn.qkv_proj_weight"] = [',
        '                f"{prefix}.self_attn.q_proj.weight",',
        '                f"{prefix}.self_attn.k_proj.weight",',
        '                f"{prefix}.self_attn.v_proj.weight",',
        "            ]",
    ]
    if s.qkv_bias:
        lines += [
            '            mappings[f"{prefix}.self_attn.qkv_proj_bias"] = [',
            '                f"{prefix}.self_attn.q_proj.bias",',
            '                f"{prefix}.self_attn.k_proj.bias",',
            '                f"{prefix}.self_attn.v_proj.bias",',
            "            ]",
        ]
    lines.append(
        '            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"'
    )
    if s.o_bias:
        lines.append(
            '            mappings[f"{prefix}.self_attn.o_proj_bias"] = f"{prefix}.self_attn.o_proj.bias"'
        )
    lines.append('        mappings["model.norm.weight"] = "model.norm.weight"')
    if bias:
        lines.append('        mappings["model.norm.bias"] = "model.norm.bias"')
    lines += [
        "        state = load(path, mappings)",
        "        for name, tensor in state.items():",
        "            state[name] = tensor.to(self.dtype)",
        "        return state",
    ]
    return "\n".join(lines)


HEADER = """\
import torch
from torch import nn

import vllm_neuron.functional as NF
from vllm_neuron.utils.weight_loader import fused_qkv_weight_loader, set_weight_loader, sharding_weight_loader
"""


def render(shape: ModelShape) -> str:
    parts = [HEADER, _norm(shape), _rope(shape), _attention(shape)]
    if shape.router:
        parts.append(_experts(shape))
    parts.append(_backbone(shape))
    return "\n\n".join(p.strip("\n") for p in parts) + "\n"


model_sources = shapes.map(lambda s: (s, render(s)))


@st.composite
def unrelated_sources(draw) -> str:
    """Ordinary code: functions and classes without model roles or kernels."""
    names = draw(st.lists(IDENT, min_size=2, max_size=5, unique=True))
    chunks = []
    for index, name in enumerate(names):
        if index % 2:
            chunks.append(
                textwrap.dedent(
                    f'''
                    class Thing{name.capitalize()}:
                        """A {name}."""

                        def __init__(self, value):
                            self.value = value  # {name}

                        def get(self):
                            return self.value + {index}
                    '''
                )
            )
        else:
            chunks.append(f"\ndef {name}(a, b={index}):\n    return [a * b for _ in range(3)]\n")
    return "import math\n" + "\n".join(chunks)
