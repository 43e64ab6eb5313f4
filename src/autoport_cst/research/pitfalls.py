"""Known pitfalls of a port, derived from what the research found (the
spec, the code and checkpoint findings, the parallel plan): each one is a
consequence of a feature, never of a model name. The wording follows the
vllm_neuron anatomy notes (docs/vllm-neuron-anatomy.md, §4 and §8)."""

from __future__ import annotations

from collections.abc import Iterable

from autoport_cst.research.findings import Conflict, Finding
from autoport_cst.research.parallelism import ParallelPlan
from autoport_cst.spec import ArchSpec


def _value(findings: Iterable[Finding], name: str, default=None):
    found = default
    for f in findings:
        if f.field == name and f.known:
            found = f.value
    return found


def pitfalls(
    spec: ArchSpec,
    findings: list[Finding],
    conflicts: list[Conflict],
    unknown: list[str],
    parallel: ParallelPlan | None,
) -> list[str]:
    out: list[str] = []
    a, r, m, n = spec.attention, spec.rope, spec.mlp, spec.norm
    if unknown:
        out.append(
            f"unclassified fields keep Llama defaults in the plan and must be checked by hand: {', '.join(unknown)}"
        )
    for conflict in conflicts:
        if conflict.severity == "error":
            out.append(f"sources disagree on {conflict.field}: {conflict.resolution}")
    if n.kind == "layernorm":
        out.append(
            f"LayerNorm: keep the decode kernel's fused RMSNorm off, subtract the mean in float32, and read "
            f"the epsilon from config.{n.eps_key} everywhere (QK-norm eps included)"
        )
    if n.unit_offset:
        out.append("norm weight applied as (1 + weight): the stored weights are offsets, not scales")
    if n.placement == "post":
        out.append(
            "norms are applied to the sublayer outputs before the residual add, not to the sublayer inputs"
        )
    elif n.placement == "sandwich":
        out.append("sandwich norms: a norm before and after every sublayer (four per layer)")
    if a.qkv_bias or a.o_bias:
        out.append(
            "attention biases: pass them 2-D ([1, size]) to NF.qkv_proj / NF.attention_decode; a fused "
            "QKV bias needs its own per-rank loader"
        )
    if a.o_bias:
        out.append("o_proj bias is added after the cross-rank sum: load it divided by the TP degree")
    if a.qk_norm == "per_head" and a.qk_norm_position == "after_rope":
        out.append(
            "per-head q/k norm after RoPE: the decode kernel's post-RoPE norm (rmsnorm_QK_post_rope_*), "
            "and in prefill the norm on the rotated heads; a pre-RoPE norm is silently wrong"
        )
    elif a.qk_norm == "per_head":
        out.append(
            "per-head q/k norm before RoPE: the fused-RoPE prefill and the decode kernel need the q/k gammas "
            "(qk_norm_pre_rope_*), a module norm after a fused-RoPE projection is wrong"
        )
    elif a.qk_norm == "full_width":
        out.append(
            "full-width q/k norm: its variance spans all heads, which TP splits across ranks "
            "(needs a cross-rank reduction or an all-gather before the norm)"
        )
    if a.sliding_window != "none":
        out.append(
            f"sliding window ({a.sliding_window}, {a.sliding_window_size} tokens): decode start positions, "
            "masks and the KV-cache LayerSpec must carry the window"
        )
    if a.sinks:
        out.append(
            "attention sinks: pass sink=self.sinks.unsqueeze(1) ([heads, 1]) to the decode kernel, shard per head"
        )
    if a.softcap is not None:
        out.append(f"attention logits are tanh-softcapped at {a.softcap:g}: the kernels must apply it")
    if a.scale is not None:
        out.append(f"attention scale is {a.scale:g}, not head_dim ** -0.5: read it from the config")
    if isinstance(a.head_dim, int) and a.head_dim > 128:
        out.append(f"head_dim {a.head_dim} > 128: the NKI kernel paths want head_dim <= 128")
    if isinstance(spec.hidden_size, int) and spec.hidden_size % 128:
        out.append(f"hidden size {spec.hidden_size} is not a multiple of 128 (kernel paths)")
    if r.type == "none":
        out.append("no rotary embedding: the model's position handling must be ported by hand")
    elif r.type not in ("default",):
        out.append(
            f"RoPE type {r.type}: compute inv_freq lazily (never in __init__) and read theta and scaling "
            f"from config.{_value(findings, 'config.rope_form', 'rope_parameters')}"
        )
    if r.partial_rotary_factor != 1.0:
        out.append(
            f"partial rotary ({r.partial_rotary_factor:g} of head_dim): the fused kernels rotate the whole "
            "head; pass-through dims need cos=1/sin=0 and a Q/K column permutation at load time"
        )
    if r.style == "interleaved":
        out.append(
            "interleaved RoPE pairs (2i, 2i+1): the kernels pair (i, i + d/2); permute Q/K columns at load"
        )
    if r.nope_layers:
        out.append(f"layers without RoPE: {list(r.nope_layers)}")
    if _value(findings, "code.norm_affine") is False:
        out.append(
            "the norms have no weight or bias (non-parametric): the spec cannot say so, a reference "
            "norm with parameters would expect tensors the checkpoint does not have"
        )
    if spec.checkpoint.qkv == "fused":
        layout = _value(findings, "code.qkv_layout")
        extra = (
            " laid out per head ([q, k, v] for each head): reorder before splitting"
            if layout == "per_head_interleaved"
            else ""
        )
        out.append(f"fused QKV projection in the checkpoint: split it in load_weights{extra}")
    if _value(findings, "code.interleaved_gate_up"):
        out.append(
            "fused gate/up with interleaved columns (gate = even, up = odd): de-interleave at load time"
        )
    elif spec.checkpoint.gate_up == "fused":
        out.append("fused gate/up projection: split it into gate and up halves at load time")
    if m.kind == "plain":
        out.append("non-gated MLP: NF.mlp(skip_gate=True) with the up weight as gate placeholder")
    if m.bias:
        out.append("MLP biases: down_proj bias is added before the TP sum, load it divided by TP")
    if m.glu == "clamped_swiglu":
        out.append(
            f"clamped SwiGLU (alpha {m.glu_alpha}, limit {m.glu_limit}): the MoE kernels' Swish has alpha "
            "1.702 built in; fold the +1 of (up + 1) into the up bias and shift the up clamp by 1"
        )
    if _value(findings, "mlp.activation") is None and any(
        f.field == "mlp.activation" and not f.known for f in findings
    ):
        out.append("the MLP activation is not a standard one (see the findings): port its formula by hand")
    if spec.embedding.tied:
        out.append(
            "tied embeddings: map lm_head.weight to the embedding in load_weights (the checkpoint has no head)"
        )
    if spec.lm_head.bias:
        out.append("LM head bias: a separate parameter added to the logits, mapped to lm_head.bias")
    if spec.embedding.scale == "sqrt_hidden":
        out.append(
            "embeddings scaled by sqrt(hidden_size): transformers multiplies in the model dtype "
            "(the bf16 scalar rounds), match it"
        )
    if (
        spec.embedding.multiplier is not None
        or spec.residual.multiplier is not None
        or spec.lm_head.logits_divisor
    ):
        out.append(
            "constant multipliers (embedding / residual / logits): read them from the config, do not hard-code"
        )
    if spec.lm_head.softcap is not None:
        out.append(f"final logits tanh-softcapped at {spec.lm_head.softcap:g}")
    if spec.residual.parallel != "none":
        out.append(
            f"parallel residual ({spec.residual.parallel}): attention and MLP outputs are summed, both must "
            "be computed in the same DP state"
        )
    if spec.moe is not None:
        out.append(
            "MoE router: keep routing in float32 (name the router weight gate_weight so the adapter keeps "
            "it un-transposed and fp32); the router is replicated on every rank"
        )
        layout = _value(findings, "checkpoint.expert_layout")
        if layout == "per_expert":
            out.append("experts stored one key per expert: stack them (gate then up) at load time")
        elif layout == "stacked" or _value(findings, "code.stacked_experts"):
            out.append(
                "experts stored as 3-D tensors: slice per rank/expert, check the [in, out] orientation"
            )
        if spec.moe.shared_experts:
            out.append(
                "shared experts run on every token"
                + (" behind a sigmoid gate" if spec.moe.shared_expert_gate else "")
            )
        if spec.moe.router_bias:
            out.append("router projection has a bias")
        if spec.moe.routing_bias:
            out.append("a per-expert routing bias affects selection only, not the weights")
    dense = _value(findings, "code.dense_layers")
    if dense:
        out.append(f"dense MLP layers inside an MoE model ({dense}): the spec describes the MoE layers only")
    if _value(findings, "checkpoint.quantized") or _value(findings, "config.quantization"):
        out.append(
            "quantized checkpoint: dequantize to bf16 before loading (the parameter count from the header "
            "is not the model's)"
        )
    ckpt_dtype = _value(findings, "checkpoint.dtype")
    if ckpt_dtype == "F32":
        out.append("the checkpoint stores float32 tensors: cast to bf16 when loading")
    if parallel is not None:
        notes = sorted({note for c in parallel.checks if c.tp == parallel.recommended_tp for note in c.notes})
        out.extend(notes)
        if parallel.ep_needed:
            out.append(
                "expert parallelism: one collective design per reference (EP inside the TP world), "
                "VLLM_NEURON_SWITCH_CC=1 for the 64-rank mesh"
            )
    return out
