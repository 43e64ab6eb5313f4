"""Cross-check config, code and checkpoint, and decide the spec.

Which source decides a field:

- sizes and settings read from the configuration (hidden size, heads,
  vocabulary, eps, RoPE theta and scaling) come from config.json; the
  checkpoint shapes and the code's own computation check them;
- what is computed (norm kind, biases, MLP kind, placement, scaling...)
  comes from the code evaluated with the configuration, because that is what
  transformers computes and what validation compares against; the
  checkpoint checks that the tensors the code creates are the ones stored.

A disagreement is a :class:`Conflict` naming every claim and the value the
spec took. A field no source could classify keeps the spec default and is
listed in ``unknown`` (never guessed).

One decider module per spec section under :mod:`autoport_cst.research.decide`
(``decoder``, ``attention``, ``rope``, ``mlp``, ``moe``, ``head``,
``checkpoint``, ``unsupported``) over the shared
:class:`~autoport_cst.research.decide.state.Decider`; this module runs them
in order (the order of the decisions, conflicts and notes).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from autoport_cst.research.checkpoint import CheckpointHeader
from autoport_cst.research.code_analysis import CodeAnalysis
from autoport_cst.research.config_analysis import ConfigAnalysis
from autoport_cst.research.decide import attention, checkpoint, decoder, head, mlp, moe, rope, unsupported
from autoport_cst.research.decide.state import Decider
from autoport_cst.research.decide.unsupported import (  # noqa: F401 - public names of this module
    ANALYSIS_FAILURES,
    CONFIG_READ_SIZES,
    FEATURE_FINDINGS,
    NOT_COMPUTATIONS,
)
from autoport_cst.research.findings import Conflict, Finding
from autoport_cst.spec import ArchSpec


@dataclass(frozen=True)
class ParameterCount:
    total: int
    experts: int
    source: str  # checkpoint | code | config
    evidence: str


@dataclass
class Decision:
    spec: ArchSpec
    decisions: list[Finding]
    conflicts: list[Conflict]
    unknown: list[str]
    notes: list[Finding]


def decide_spec(
    cfg: ConfigAnalysis,
    code: CodeAnalysis | None,
    ckpt: CheckpointHeader | None,
    ckpt_findings: list[Finding],
) -> Decision:
    d = Decider(cfg, code, ckpt, ckpt_findings)
    spec = _build(d)
    return Decision(spec, d.decisions, d.conflicts, sorted(set(d.unknown)), d.notes)


def _build(d: Decider) -> ArchSpec:
    """Every section, in order; then the cross-source checks, the checkpoint
    layout and what the spec cannot describe."""
    dims = d.cfg.dims
    head_dim = attention.head_dim(d)
    norm = decoder.norm(d)
    attention_spec = attention.attention(d, head_dim)
    rope_spec = rope.rope(d)
    moe_spec = moe.moe(d)
    mlp_spec = mlp.mlp(d, moe_spec is not None)
    embedding = head.embedding(d)
    lm_head = head.lm_head(d)
    residual = decoder.residual(d)
    decoder.num_layers_check(d)
    rope.partial_factor_check(d)
    mlp.activation_check(d)
    attention.window_check(d)
    if d.code is not None and d.ckpt is not None:
        checkpoint.checks(d, attention_spec, lm_head, embedding)
    layout = checkpoint.layout(d, moe_spec is not None)
    return ArchSpec(
        hidden_size=dims.get("hidden_size"),
        num_layers=dims.get("num_layers"),
        max_position_embeddings=d.value("max_position_embeddings"),
        norm=norm,
        attention=attention_spec,
        rope=rope_spec,
        mlp=mlp_spec,
        moe=moe_spec,
        embedding=embedding,
        lm_head=lm_head,
        residual=residual,
        checkpoint=layout,
        unsupported=unsupported.unsupported(d),
    )


# ---- parameter counts ----------------------------------------------------------


def count_parameters(
    spec: ArchSpec, code: CodeAnalysis | None, ckpt: CheckpointHeader | None, quantized: bool
) -> ParameterCount:
    """Parameters, and how many of them are routed-expert weights: from the
    checkpoint header when it holds plain floating-point tensors, else from
    the code's module tree, else from the spec's dimensions."""
    if ckpt is not None and not quantized and ckpt.tensors:
        total = ckpt.parameter_count
        expert_keys = code.expert_keys if code is not None else set()
        experts = sum(t.numel for n, t in ckpt.tensors.items() if n in expert_keys or ".experts." in f".{n}")
        return ParameterCount(
            total, experts, "checkpoint", f"{len(ckpt.tensors)} tensors in the safetensors headers"
        )
    if code is not None and code.expected and all(s is not None for s in code.expected.values()):
        shapes = {k: s for k, s in code.expected.items() if s is not None}
        if spec.embedding.tied and code.head_key in shapes:
            shapes.pop(code.head_key)
        total = sum(math.prod(s) for s in shapes.values())
        experts = sum(math.prod(s) for k, s in shapes.items() if k in code.expert_keys)
        return ParameterCount(
            total, experts, "code", f"{len(shapes)} parameters of the module tree built from the config"
        )
    return _formula(spec)


def _formula(spec: ArchSpec) -> ParameterCount:
    h = spec.hidden_size or 0
    layers = spec.num_layers or 0
    a = spec.attention
    nh, nkv = a.num_heads or 0, a.num_kv_heads or a.num_heads or 0
    hd = a.head_dim or (h // nh if nh else 0)
    attn = h * nh * hd + 2 * h * nkv * hd + nh * hd * h
    if a.qkv_bias:
        attn += (nh + 2 * nkv) * hd
    per_proj = 3 if spec.mlp.kind == "gated" else 2
    experts = 0
    if spec.moe is not None:
        e_int = spec.moe.intermediate_size or 0
        experts = layers * (spec.moe.num_experts or 0) * per_proj * h * e_int
        ffn = h * (spec.moe.num_experts or 0)
    else:
        ffn = per_proj * h * (spec.mlp.intermediate_size or 0)
    norms = 2 * h * (2 if spec.norm.bias else 1)
    vocab = spec.embedding.vocab_size or 0
    total = layers * (attn + ffn + norms) + experts + vocab * h * (1 if spec.embedding.tied else 2) + h
    return ParameterCount(total, experts, "config", "estimated from the spec dimensions")


def spec_replace(spec: ArchSpec, **changes: Any) -> ArchSpec:
    return dataclasses.replace(spec, **changes)
