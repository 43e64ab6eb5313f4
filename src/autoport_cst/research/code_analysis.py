"""What the transformers modeling code computes, read from its source.

The causal-LM class named by the config's ``architectures`` is constructed
by the abstract interpreter of :mod:`autoport_cst.research.interp` against
the configuration (every layer), which gives the module tree (which
projections exist, with or without bias, their sizes, the parameter names a
checkpoint must hold). The ``forward`` methods are then run symbolically and
classified by what they compute, never by class names, one spec section per
module of :mod:`autoport_cst.research.analysis`:

- ``decoder``: the decoder layers, layers without softmax attention, the
  norms of a layer (their arithmetic: :mod:`~.analysis.norms`), their
  placement and the residual structure;
- ``attention``: projections, biases, fused QKV, q/k norms, the attention
  kind, the kernel's arguments (scale, softcap, sinks), the sliding window;
- ``rope``: the rotation style, the rotary dimension, layers without RoPE;
- ``mlp``: gated or plain, the activation, biases, fused gate/up;
- ``moe``: dense and routed layers, top-k routing, experts, shared experts;
- ``head``: the embedding scale, learned positions, the final norm, the LM
  head's bias, softcap and logit rescaling;
- ``block_features``: what a block computes that no section describes, named
  where a field stayed unclassified (ALiBi, attention without a kernel, the
  residual added inside a sublayer, a norm on the token embeddings, a RoPE
  base written in the code).

They share :class:`~.analysis.state.AnalyzerState` (the interpreter, the
instance tree, the result being filled) and the graph helpers of
:mod:`~.analysis.graph`. This module runs them in order. Anything that does
not match a known computation is reported as unknown, with what was seen.
"""

from __future__ import annotations

from typing import Any

from autoport_cst.research.analysis import (
    attention,
    attention_variants,
    beside_decoder,
    block_features,
    chunked_attention,
    decoder,
    expert_layouts,
    external_inputs,
    head,
    hyper_connections,
    mask_bias,
    mixers,
    mlp,
    moe,
    passthrough,
    rope,
)
from autoport_cst.research.analysis.graph import kernel_calls
from autoport_cst.research.analysis.mlp import ACTIVATIONS
from autoport_cst.research.analysis.state import AnalyzerState, CodeAnalysis
from autoport_cst.research.findings import CODE, known, unknown
from autoport_cst.research.interp.interpreter import Interpreter
from autoport_cst.research.interp.values import SourceClass
from autoport_cst.research.interp.walk import walk
from autoport_cst.research.sources import ModelingSource

__all__ = ["ACTIVATIONS", "CodeAnalysis", "analyze_code"]


def analyze_code(
    source: ModelingSource, config: Any, architecture: str, dims: dict[str, Any]
) -> CodeAnalysis:
    """Analyse the modeling source of ``architecture`` against ``config``.

    ``dims`` holds the config analysis' sizes (hidden_size, num_heads,
    num_kv_heads, head_dim, vocab_size) used to tell q from k/v projections
    and per-head from full-width norms."""
    interp = Interpreter(source.library, config)
    module = source.module
    result = CodeAnalysis(str(source.path), architecture)
    if architecture not in module.classes:
        found = source.library.resolve(f"{module.dotted}.{architecture}")
        if found is None or architecture not in found[0].classes:
            result.add(
                unknown("code.causal_lm", CODE, f"{architecture} is not defined in {source.path.name}")
            )
            return result
        module = found[0]
    cls = SourceClass(module, module.classes[architecture])
    reads = interp.capture()  # every config field the code reads, constructing and running
    try:
        try:
            top = interp.instantiate(cls, [interp.config], {}, {})
        except RecursionError:  # pragma: no cover
            result.add(unknown("code.causal_lm", CODE, f"could not evaluate {architecture}.__init__"))
            return result
        _run(AnalyzerState(source, interp, dims, result, top, cls))
    finally:
        interp.release(reads)
        result.config_reads = tuple(sorted(reads))
    return result


def _run(st: AnalyzerState) -> None:
    """Every section, in order, on the instance tree ``st.top``."""
    r = st.result
    st.tree_keys(st.top, "", r.expected, r.roles, r.expert_keys)
    backbone, layers_attr, layers = decoder.find_backbone(st)
    if backbone is None or layers_attr is None or not layers:  # (found together)
        st.add(
            unknown(
                "code.decoder_layers",
                CODE,
                f"no list of decoder layers found under {st.cls.name}" + decoder.layer_list_shape(st),
            )
        )
        listed = decoder.first_listed_block(st)
        if listed is not None and not mixers.parallel_lists(st, listed[1]):
            if not mixers.name_block(st, listed[0], ("code.decoder_layers",)):
                # CPM-Ant's self_att.self_attention; Reformer's two residual streams
                mixers.name_wrapped(st, listed[0], ("code.decoder_layers",))
                mixers.two_streams(st, listed[0])
        return
    backbone_path, backbone_inst = backbone
    r.layer_count = len(layers)
    st.add(
        known(
            len(layers),
            "num_layers",
            CODE,
            f"{backbone_inst.class_name}.{layers_attr}: {len(layers)} decoder layers built",
        )
    )
    st.layers = layers
    st.backbone = backbone_inst
    st.layer_prefix = f"{backbone_path}.{layers_attr}." if backbone_path else f"{layers_attr}."
    r.module_names["model"] = backbone_path
    r.module_names["model.layers"] = st.layer_prefix[:-1]
    decoder.mixer_layers(st, backbone_inst, layers_attr)
    mixers.cross_attention_layers(st)
    st.attn_path = passthrough.splice(st, layers) or ""
    if decoder.attention_child(st):
        layer0 = st.layers[0]
        mixers.name_block(st, layer0, ("norm", "residual"), routing=False)  # a mixer beside the attention
        mixers.routed_attention(st, dict(layer0.children())[st.attn_name])
        mixers.routing_beside_attention(st, layer0)
        hyper_connections.hyper_connections(st, layer0, st.backbone)
        inline = decoder.inline_mlp(st, layer0)
        decoder.analyze_flow(st, layer0)
        if not inline and _unclassified(r, "norm.placement"):
            block_features.sublayer_residual(st, layer0)
        graph = attention.analyze(st, layer0)
        attention_variants.sizes_per_layer(st)
        if graph is not None:
            attention_variants.relative_position_bias(st, graph)
            rope.analyze(st, graph)
            if (style := r.get("rope.style")) is not None and style.known:
                block_features.rope_base_in_code(st)
        written_out = graph is not None and not kernel_calls(graph.attn, graph.nodes)
        if graph is not None and not written_out:
            mask_bias.read(st, graph)  # a per-head bias inside the mask the kernel is given
        if written_out or _unclassified(r, "attention.scale", "attention.sliding_window"):
            block_features.score_bias(st)  # a bias on scores written out, whatever their scale
        if _unclassified(r, "attention.scale", "attention.sliding_window"):
            block_features.explicit_attention(st)
        if inline:
            _inline_feed_forward(st)
        else:
            _feed_forward(st)
    expert_layouts.name_expert_layouts(st, st.layers[0])  # read or not (DBRX's wrapped attention)
    block_features.embedding_norm_like_layers(st, backbone_inst)  # the scale is read through it
    head.analyze_backbone(st, backbone_path, backbone_inst)
    if _unclassified(r, "embedding.scale") and not external_inputs.external_inputs(st):
        block_features.embedding_norm(st, backbone_inst)
    block_features.sinusoidal_positions(st, backbone_inst)
    block_features.embedding_projection(st, backbone_inst)
    chunked_attention.analyze(st, backbone_inst)
    head.analyze_head(st)
    beside_decoder.modules_beside_decoder(st, backbone_path)


def _unclassified(result: CodeAnalysis, *fields: str) -> bool:
    """One of ``fields`` is unknown to the code analysis: the sections
    naming what it computes instead run only then."""
    return any((found := result.get(name)) is not None and not found.known for name in fields)


def _inline_feed_forward(st: AnalyzerState) -> None:
    """The MLP section on the feed-forward the decoder layers compute
    themselves (two projections of their own around an activation: OPT's
    fc1 and fc2), when every layer has one; named otherwise."""
    layer0 = st.layers[0]
    if not all(
        decoder.inline_ffn_calls(st, layer, [n for v in st.outputs(layer)[:1] for n in walk(v)])
        for layer in st.layers
    ):
        decoder.inline_mlp_finding(st, layer0)
        return
    st.result.dense_layers = list(range(len(st.layers)))
    mlp.analyze(st, layer0, f"{st.layer_prefix}0.", "mlp")
    moe.no_routed_block(st)


def _feed_forward(st: AnalyzerState) -> None:
    """The MLP section on the first dense layer, the MoE section on the
    first routed layer."""
    ffn_name = moe.split_layers(st)
    if ffn_name is None:
        return
    r = st.result
    if r.dense_layers:
        index = r.dense_layers[0]
        block = dict(st.layers[index].children())[ffn_name]
        mlp.analyze(st, block, f"{st.layer_prefix}{index}.{ffn_name}.", "mlp")
    if r.moe_layers:
        index = r.moe_layers[0]
        block = dict(st.layers[index].children())[ffn_name]
        moe.analyze(st, block, f"{st.layer_prefix}{index}.{ffn_name}.")
    else:
        moe.no_routed_block(st)
