"""The plan's pitfalls: declared by the codemod (or spec section) that knows
the feature, collected by research in rank order between what only research
knows (unclassified fields and conflicts first; storage and parallelism last)."""

from __future__ import annotations

from autoport_cst.research.findings import Finding
from autoport_cst.research.pitfalls import declared_pitfalls, pitfalls
from autoport_cst.spec import ArchSpec, from_json
from autoport_cst.spec.pitfalls import SPEC_PITFALLS
from autoport_cst.transform.library import library

DENSE = {
    "hidden_size": 2880,
    "norm": {"kind": "layernorm", "eps_key": "layer_norm_eps", "placement": "sandwich", "unit_offset": True},
    "attention": {
        "qkv_bias": True,
        "o_bias": True,
        "qk_norm": "per_head",
        "qk_norm_position": "after_rope",
        "sliding_window": "per_layer",
        "sliding_window_size": 4096,
        "sinks": True,
        "softcap": 50.0,
        "scale": 0.0625,
        "head_dim": 256,
    },
    "rope": {"type": "yarn", "partial_rotary_factor": 0.5, "style": "interleaved", "nope_layers": [3, 7]},
    "mlp": {"kind": "plain", "bias": True, "activation": "gelu"},
    "embedding": {"tied": True, "scale": "sqrt_hidden"},
    "lm_head": {"bias": True, "softcap": 30.0},
    "residual": {"parallel": "shared_norm", "multiplier": 0.22},
    "checkpoint": {"qkv": "fused", "gate_up": "fused"},
}
DENSE_FINDINGS = [
    Finding("code.norm_affine", False, "code", "e"),
    Finding("code.qkv_layout", "per_head_interleaved", "code", "e"),
    Finding("config.rope_form", "rope_scaling", "config", "e"),
]
# as research listed them before the pitfalls moved to the codemods
DENSE_PITFALLS = [
    "LayerNorm: keep the decode kernel's fused RMSNorm off, subtract the mean in float32, and read the "
    "epsilon from config.layer_norm_eps everywhere (QK-norm eps included)",
    "norm weight applied as (1 + weight): the stored weights are offsets, not scales",
    "sandwich norms: a norm before and after every sublayer (four per layer)",
    "attention biases: pass them 2-D ([1, size]) to NF.qkv_proj / NF.attention_decode; a fused QKV bias "
    "needs its own per-rank loader",
    "o_proj bias is added after the cross-rank sum: load it divided by the TP degree",
    "per-head q/k norm after RoPE: the decode kernel's post-RoPE norm (rmsnorm_QK_post_rope_*), and in "
    "prefill the norm on the rotated heads; a pre-RoPE norm is silently wrong",
    "sliding window (per_layer, 4096 tokens): decode start positions, masks and the KV-cache LayerSpec "
    "must carry the window",
    "attention sinks: pass sink=self.sinks.unsqueeze(1) ([heads, 1]) to the decode kernel, shard per head",
    "attention logits are tanh-softcapped at 50: the kernels must apply it",
    "attention scale is 0.0625, not head_dim ** -0.5: read it from the config",
    "head_dim 256 > 128: the NKI kernel paths want head_dim <= 128",
    "hidden size 2880 is not a multiple of 128 (kernel paths)",
    "RoPE type yarn: compute inv_freq lazily (never in __init__) and read theta and scaling from "
    "config.rope_scaling",
    "partial rotary (0.5 of head_dim): the fused kernels rotate the whole head; pass-through dims need "
    "cos=1/sin=0 and a Q/K column permutation at load time",
    "interleaved RoPE pairs (2i, 2i+1): the kernels pair (i, i + d/2); permute Q/K columns at load",
    "layers without RoPE: [3, 7]",
    "the norms have no weight or bias (non-parametric): the spec cannot say so, a reference norm with "
    "parameters would expect tensors the checkpoint does not have",
    "fused QKV projection in the checkpoint: split it in load_weights laid out per head ([q, k, v] for "
    "each head): reorder before splitting",
    "fused gate/up projection: split it into gate and up halves at load time",
    "non-gated MLP: NF.mlp(skip_gate=True) with the up weight as gate placeholder",
    "MLP biases: down_proj bias is added before the TP sum, load it divided by TP",
    "tied embeddings: map lm_head.weight to the embedding in load_weights (the checkpoint has no head)",
    "LM head bias: a separate parameter added to the logits, mapped to lm_head.bias",
    "embeddings scaled by sqrt(hidden_size): transformers multiplies by the factor rounded to the model dtype "
    "(Gemma) or by the unrounded Python float (XGLM, BioGPT; embedding.scale_dtype): match it, the two differ "
    "in bf16 where the square root is not exact",
    "constant multipliers (embedding / residual / logits): read them from the config, do not hard-code",
    "final logits tanh-softcapped at 30",
    "parallel residual (shared_norm): attention and MLP outputs are summed, both must be computed in the "
    "same DP state",
]

MOE = {
    "attention": {"qk_norm": "full_width"},
    "rope": {"type": "none"},
    "mlp": {"glu": "clamped_swiglu", "glu_alpha": 1.702, "glu_limit": 7.0},
    "moe": {
        "num_experts": 8,
        "top_k": 2,
        "shared_experts": 1,
        "shared_expert_gate": True,
        "router_bias": True,
        "routing_bias": True,
    },
}
MOE_FINDINGS = [
    Finding("checkpoint.expert_layout", "per_expert", "checkpoint", "e"),
    Finding("code.dense_layers", (0,), "code", "e"),
    Finding("code.interleaved_gate_up", True, "code", "e"),
    Finding("mlp.activation", None, "code", "e", "unknown"),
    Finding("checkpoint.dtype", "F32", "checkpoint", "e"),
]
MOE_PITFALLS = [
    "unclassified fields keep Llama defaults in the plan and must be checked by hand: mlp.activation",
    "full-width q/k norm: its variance spans all heads, which TP splits across ranks (needs a cross-rank "
    "reduction or an all-gather before the norm)",
    "no rotary embedding: the model's position handling must be ported by hand",
    "fused gate/up with interleaved columns (gate = even, up = odd): de-interleave at load time",
    "clamped SwiGLU (alpha 1.702, limit 7.0): the MoE kernels' Swish has alpha 1.702 built in; fold the +1 "
    "of (up + 1) into the up bias and shift the up clamp by 1",
    "the MLP activation is not a standard one (see the findings): port its formula by hand",
    "MoE router: keep routing in float32 (name the router weight gate_weight so the adapter keeps it "
    "un-transposed and fp32); the router is replicated on every rank",
    "experts stored one key per expert: stack them (gate then up) at load time",
    "shared experts run on every token behind a sigmoid gate",
    "router projection has a bias",
    "a per-expert routing bias affects selection only, not the weights",
    "dense MLP layers inside an MoE model ((0,)): the spec describes the MoE layers only",
    "the checkpoint stores float32 tensors: cast to bf16 when loading",
]


def spec_of(data: dict) -> ArchSpec:
    spec, problems = from_json(ArchSpec, data, "$")
    assert spec is not None and not problems, problems
    return spec


def test_the_declared_pitfalls_read_as_before():
    assert pitfalls(spec_of(DENSE), DENSE_FINDINGS, [], [], None) == DENSE_PITFALLS
    assert pitfalls(spec_of(MOE), MOE_FINDINGS, [], ["mlp.activation"], None) == MOE_PITFALLS


def test_a_model_without_features_has_no_pitfalls():
    assert pitfalls(ArchSpec(), [], [], [], None) == []


def test_ranks_are_unique_and_the_codemods_declare_most():
    ranks = [p.rank for p in declared_pitfalls()]
    assert len(ranks) == len(set(ranks)), sorted(r for r in ranks if ranks.count(r) > 1)
    by_codemods = sum(len(cls.PITFALLS) for cls in library().values())
    assert by_codemods > 3 * len(SPEC_PITFALLS)
