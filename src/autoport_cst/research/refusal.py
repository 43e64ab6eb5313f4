"""What refuses a plan, in the user's terms: the smallest set of the
model's features that no reference realizes, each named as what the model
computes, with the research's evidence for it.

A feature blocks every candidate reference when it is in each one's
blocking fields: those are the features no reference realizes (a dense
model refused because ``gpt_oss`` would need its MoE removed is refused for
what blocks ``llama3`` too, not for ``gpt_oss``'s sinks). When no feature
blocks every candidate (each reference lacks something else), the closest
candidate's blockers are named, with that candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoport_cst.spec import ArchSpec, get_field, leaf_fields

# spec field -> the computation it describes, as a user reads it; "{value}"
# is the model's value of the field. A field not listed is named by the
# first sentence of its spec documentation.
TERMS: dict[str, str | dict[Any, str]] = {
    "attention.qkv_bias": "biases on the query, key and value projections",
    "attention.o_bias": "a bias on the attention output projection",
    "attention.sinks": "attention sinks (a learned logit per head in the softmax)",
    "attention.softcap": "soft-capped attention scores",
    "attention.scale": "attention scores scaled by {value}",
    "attention.qk_norm": "{value} query/key norms",
    "attention.qk_norm_position": "query/key norms applied {value}",
    "attention.qk_norm_affine": "query/key norms without a learned weight",
    "attention.qk_norm_layers": "query/key norms on the RoPE layers only",
    "attention.sliding_window": "sliding-window attention ({value})",
    "attention.chunked": "attention within chunks of attention_chunk_size tokens (a chunked causal mask)",
    "attention.kind": {
        "differential": "differential attention (two softmax maps, subtracted)",
        "latent": "multi-latent attention (queries, keys and values from low-rank projections)",
    },
    "attention.output_norm": "a norm between the attention and its output projection",
    "attention.output_gate": "a {value} gate on the attention output (a projection of the layer input)",
    "attention.other_mixer_layers": "layers mixing tokens by something other than softmax attention",
    "attention.alibi_bias_max": "ALiBi positions (a per-head bias on the attention scores, slopes "
    "2 ** -({value} * i / n), instead of RoPE)",
    "attention.alibi_scaled": "an ALiBi bias scaled with the attention scores",
    "embedding.learned_positions": "learned absolute position embeddings",
    "embedding.sinusoidal_positions": "fixed sinusoidal absolute position embeddings added to the token embeddings",
    "embedding.scale": "a token embedding scaled by {value}",
    "embedding.multiplier": "a token embedding multiplied by {value}",
    "embedding.tied": "an LM head tied to the embedding",
    "mlp.kind": {"plain": "a plain (ungated) MLP", "gated": "a gated MLP"},
    "mlp.bias": "MLP biases",
    "mlp.activation": "the {value} activation",
    "mlp.glu": "gate and up combined as {value}",
    "norm.kind": "{value} normalization",
    "norm.bias": "norm biases",
    "norm.placement": "{value} norm placement",
    "norm.unit_offset": "norms scaled by (1 + weight)",
    "norm.affine": "norms without a learned weight",
    "residual.parallel": "attention and MLP in parallel ({value})",
    "residual.multiplier": "residual branches multiplied by {value}",
    "rope.type": "{value} RoPE scaling",
    "rope.style": {
        "interleaved": "RoPE on adjacent pairs (interleaved)",
        "rotate_half": "RoPE on the halves of each head",
        "rotate_half_swapped": "RoPE turning each pair of halves the other way (rotate_half as cat(x2, -x1))",
    },
    "rope.partial_rotary_factor": "rotary embedding on {value} of each head",
    "rope.nope_layers": "layers without rotary embedding",
    "rope.layer_parameters": "RoPE parameters per layer type",
    "moe.dense_layers": "dense MLP layers among the MoE layers (layers {value})",
    "moe.shared_experts": "{value} shared expert(s)",
    "moe.routing_bias": "a per-expert bias that moves the expert choice",
    "moe.router_bias": "a router bias",
    "moe.expert_input_scaling": "experts that read the hidden states multiplied by the router scores",
    "moe.router_activation": "{value} router scores",
    "lm_head.bias": "an LM-head bias",
    "lm_head.softcap": "soft-capped logits",
    "lm_head.logits_divisor": "logits divided by {value}",
    "checkpoint.qkv": "Q, K and V stored {value}",
    "checkpoint.gate_up": "gate and up stored {value}",
    "checkpoint.qkv=unknown": "Q, K and V stored in a layout research could not read",
    "checkpoint.gate_up=unknown": "gate and up stored in a layout research could not read",
    "checkpoint.key_map": "the checkpoint's own tensor names",
    "checkpoint.linear_layout": "linear weights stored [in, out]",
}
UNSUPPORTED = "unsupported"
# computations research names as unsupported (research/decide/unsupported.py)
COMPUTATIONS = {
    "code.analysis": "a model the source analysis could not follow",
    "code.causal_lm": "a causal LM class research could not construct",
    "code.decoder_layers": "decoder layers research could not find",
    "code.attention": "an attention research could not find in the layer",
    "code.mlp": "a feed-forward computed inline in the decoder layer (no MLP module)",
    "code.attention_parameters": "learned attention parameters beyond projections, norms and sinks",
    "code.mixers": "token mixers other than softmax attention",
    "code.mlp_inner_norm": "a norm inside the MLP",
    "code.qk_norm_kind": "query/key norms that are not RMSNorms",
    "code.qkv_clip": "clamped query/key/value projections",
    "code.value_norm": "a norm applied to the attention's values",
    "attention_output_gate": "a gate on the attention output (a projection of the layer input, multiplied in)",
    "position_scaled_attention": "queries scaled by a factor that grows with the position (attention temperature)",
    "chunked_attention": "attention within chunks of attention_chunk_size tokens (a chunked causal mask)",
    "nope_layers": "layers without RoPE chosen by config fields a port does not read",
    "window_fields": "a sliding window, or the layers that slide, given by config fields a port does not read "
    "(a port reads sliding_window and layer_types)",
    "layer_rope_bases": "a RoPE base per layer",
    "alibi_positions": "ALiBi positions (a per-head bias on the attention scores)",
    "alibi_in_mask": "an ALiBi bias folded into the attention mask by the backbone (what the installed "
    "transformers' attention then adds is said after this)",
    "embedding_norm": "a norm on the token embeddings",
    "kv_repeat": "keys and values repeated to the query heads another number of times (num_key_value_groups) "
    "than query heads / KV heads the projections build",
    "qkv_head_groups": "a fused QKV projection whose rows are grouped per KV head (query heads, key, value)",
    "embedding_projection": "token embeddings of another width, projected to the hidden size and back",
    "sinusoidal_positions": "sinusoidal absolute position embeddings (a fixed table added to the token embeddings)",
    "explicit_attention": "attention written out (scores, softmax) instead of an attention kernel call",
    "sublayer_residual": "the residual added inside the attention or MLP module",
    "residual_after_norm": "the residual taken after the norm (the sublayer's normed input added back to its "
    "output)",
    "sparse_indexer": "DSA lightning indexer (index top-k selection of keys)",
    "recurrent_mixer": "a token mixer other than softmax attention that carries a state from position to "
    "position (a recurrence: state-space scan, linear attention or RNN cell)",
    "convolution_mixer": "a token mixer other than softmax attention that convolves over the positions",
    "routing_without_topk": "routed experts chosen without a top-k of the router scores",
    "several_attentions": "several attention sublayers in one decoder layer",
    "reversible_residual": "a reversible residual (two residual streams: a sublayer's output added to the "
    "other stream)",
    "cross_attention_layers": "cross-attention layers (keys and values computed from another input than the "
    "layer's hidden states, such as image states)",
    "hyper_connections": "hyper-connections (several residual streams, mixed by learned weights, in place of "
    "one residual)",
    "relative_position_bias": "a learned relative-position bias on the attention scores (computed from a "
    "projection of the hidden states and the query and key positions)",
    "attention_sizes_per_layer": "attention heads or head sizes that differ between layers (from config fields "
    "a port does not read)",
    "split_expert_projections": "experts whose projections are separate modules of every expert's weights, "
    "the activation applied between them by the routed block",
    "fused_expert_rows": "every expert's weights stored as one 2-D tensor (the experts' rows one after another), "
    "split per expert in the forward",
    "external_inputs": "a decoder run on another model's states (no token ids: its input a projection of "
    "embeddings the caller passes)",
    "modules_beside_decoder": "modules with weights beside the text decoder and its LM head (such as an "
    "image-patch embedding feeding the token embeddings), which a port would drop",
    "routed_attention": "attention projections chosen per token among experts (a mixture of attention heads)",
    "parallel_layer_lists": "decoder layers held as parallel lists of attentions and feed-forwards",
    "qkv_clip": "queries, keys and values clamped to a range (clip_qkv)",
    "derived_multiplier": "a residual multiplier computed from several config fields (no one field a port reads)",
    "routing_bias_on_logits": "a routing bias added to the router logits before the activation "
    "(the references choose experts by activated scores plus the bias)",
    "stacked_shared_experts": "several shared experts stored stacked in one module (3-D parameters), "
    "each run on every token",
    "proportional_rope": "a rotary embedding on the first pairs of each head only, at the whole head's "
    "frequencies (transformers' 'proportional' RoPE: the other pairs unrotated)",
    "rope_frequencies": "RoPE frequencies of a rope_type no reference computes",
    "latent_norm_epsilon": "latent-attention norms with another epsilon than the latent reference's 1e-6",
    "rotary_key_norm": "a norm on the rotary key shared by the heads of latent attention",
    "inverse_head_dim_scale": "attention scores scaled by 1 / head_dim (not head_dim ** -0.5)",
    "per_layer_sizes": "a size config.json gives per layer (a list, such as one MLP width per layer), where "
    "a port reads one value",
}
# sizes the code builds other than the config field a port reads (research/decide/unsupported.py)
BUILT_SIZES = {
    "attention.num_kv_heads": "a number of KV heads the code builds other than the config's",
    "attention.num_heads": "a number of attention heads the code builds other than the config's",
    "attention.head_dim": "a head size the code builds other than the config's",
    "mlp.intermediate_size": "an MLP width the code builds other than the config's",
}


@dataclass(frozen=True)
class Blocker:
    """One feature no reference realizes: its spec field (or the name of an
    unsupported computation), what it computes and the evidence."""

    field: str
    term: str
    evidence: str = ""

    def describe(self, model_type: str | None = None) -> str:
        where = f"{model_type}: {self.evidence}" if model_type and self.evidence else self.evidence
        named = self.term if self.term == self.field else f"{self.term} [{self.field}]"
        return named + (f" ({where})" if where else "")


def minimal_blocking(choice: Any) -> tuple[list[str], str | None]:
    """The fields that block every usable candidate, in the closest
    candidate's order, and None; when no field blocks them all, the closest
    candidate's blockers and its name."""
    usable = [c for c in choice.candidates if c.error is None]
    closest = choice.candidate(choice.chosen) if choice.chosen else None
    if not usable or closest is None or closest.error is not None:
        return [], None
    common = set(usable[0].blocking).intersection(*(set(c.blocking) for c in usable[1:]))
    if common:
        return [f for f in closest.blocking if f in common], None
    return list(closest.blocking), closest.name


def blockers(spec: ArchSpec, fields: list[str], found: Any = None) -> list[Blocker]:
    """The features behind ``fields``: each unsupported computation by its
    own name, every other field in the terms of what the model computes."""
    out: list[Blocker] = []
    for path in fields:
        if path == UNSUPPORTED:
            for entry in spec.unsupported or ():
                name, _, evidence = entry.partition(":")
                name, evidence = name.strip(), evidence.strip()
                built = name in BUILT_SIZES and evidence.startswith("the code builds")
                what = BUILT_SIZES[name] if built else _unsupported_term(name)
                if built and name == "attention.num_kv_heads" and evidence.startswith("the code builds 1 "):
                    what += " (one: multi-query attention)"
                out.append(Blocker(name, what, evidence))
            continue
        what = term(path, _value(spec, path))
        if path == "moe" and spec.moe is None and spec.attention.kind == "latent":
            what = "dense multi-latent attention (MLA with a dense MLP, no routed experts)"
        out.append(Blocker(path, what, _evidence(found, path)))
    return out


def term(path: str, value: Any) -> str:
    """What the spec field ``path`` with ``value`` computes, in words."""
    if path == "moe":
        return "a dense MLP (no routed experts)" if value is None else "routed experts (a mixture of experts)"
    phrase = TERMS.get(f"{path}={value}", TERMS.get(path)) if isinstance(value, str) else TERMS.get(path)
    if isinstance(phrase, dict):
        phrase = phrase.get(value)
    if phrase is None:
        phrase = _doc(path) + (" ({value})" if value not in (None, True, False) else "")
    return phrase.replace("{value}", _show(value))


def refusal_text(spec: ArchSpec, choice: Any, found: Any = None) -> tuple[str, list[Blocker]]:
    """One sentence naming what refuses the plan, and the blockers."""
    fields, closest = minimal_blocking(choice)
    named = blockers(spec, fields, found)
    model_type = getattr(found, "model_type", None)
    listed = "; ".join(b.describe(model_type) for b in named) or "its architecture diff"
    if closest is None:
        return f"no reference realizes {listed}", named
    return f"no one feature blocks every reference; the closest, {closest}, does not realize {listed}", named


def _unsupported_term(name: str) -> str:
    """An unsupported computation as research names it: a computation it
    could not read, a spec field it could not classify, or its own name."""
    if name in COMPUTATIONS:
        return COMPUTATIONS[name]
    if any(leaf == name for leaf, _, _ in leaf_fields(ArchSpec)):
        return f"the {name.replace('.', ' ').replace('_', ' ')}, which research could not classify"
    return name


def _value(spec: ArchSpec, path: str) -> Any:
    try:
        return get_field(spec, path)
    except (AttributeError, KeyError):
        return None


def _evidence(found: Any, path: str) -> str:
    decision = found.decision(path) if found is not None and hasattr(found, "decision") else None
    return decision.evidence if decision is not None and decision.evidence else ""


def _doc(path: str) -> str:
    for leaf, _, doc in leaf_fields(ArchSpec):
        if leaf == path and doc:
            sentence = doc.split(". ")[0].rstrip(".")
            return sentence[:1].lower() + sentence[1:]
    return path


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)
